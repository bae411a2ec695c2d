import { runToolOrThrow } from '../host/run-tool.js';

export interface ErofsBuildOptions {
  /** lz4 halves a Debian tree at mkfs speed; uncompressed reads fastest. @default 'lz4' */
  compression?: 'none' | 'lz4' | 'lz4hc';
  /** Paths (relative to the source, no leading slash) left out of the image. */
  excludePaths?: string[];
}

/** Builds an EROFS image of `sourceDir` at `outFile` with mkfs.erofs (erofs-utils). */
export async function buildErofs(sourceDir: string, outFile: string, opts: ErofsBuildOptions = {}): Promise<void> {
  const args = ['--quiet', '--preserve-mtime'];
  const compression = opts.compression ?? 'lz4';
  if (compression !== 'none') args.push(`-z${compression}`);
  for (const p of opts.excludePaths ?? []) args.push(`--exclude-path=${p}`);
  args.push(outFile, sourceDir);
  await runToolOrThrow('mkfs.erofs', args);
}
