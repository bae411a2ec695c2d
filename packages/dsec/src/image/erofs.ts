import { runToolOrThrow } from '../host/run-tool.js';

export interface ErofsBuildOptions {
  /**
   * lz4 halves a Debian tree; uncompressed builds ~15× faster on incompressible data (100 MB:
   * 0.4 s against 6.6 s here) and reads fastest. @default 'lz4'
   */
  compression?: 'none' | 'lz4' | 'lz4hc';
  /** Paths (relative to the source, no leading slash) left out of the image. */
  excludePaths?: string[];
  /**
   * Store holes: files are written in 1 MiB chunks and all-zero chunks take no space. Much slower
   * to build, so pack_diff asks for it only when the tree holds a sparse file.
   */
  chunked?: boolean;
  /** A fixed mtime for every file and a fixed filesystem UUID: the same tree gives the same bytes, so the same digest. */
  reproducible?: { timestamp: number; uuid: string };
  /** Stops mkfs.erofs (killed) and rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Builds an EROFS image of `sourceDir` at `outFile` with mkfs.erofs (erofs-utils). */
export async function buildErofs(sourceDir: string, outFile: string, opts: ErofsBuildOptions = {}): Promise<void> {
  const args = ['--quiet', '--preserve-mtime'];
  const compression = opts.compression ?? 'lz4';
  if (compression !== 'none') args.push(`-z${compression}`);
  if (opts.chunked) args.push('--chunksize=1048576');
  if (opts.reproducible) args.push(`-T${opts.reproducible.timestamp}`, `-U${opts.reproducible.uuid}`);
  for (const p of opts.excludePaths ?? []) args.push(`--exclude-path=${p}`);
  args.push(outFile, sourceDir);
  await runToolOrThrow('mkfs.erofs', args, opts.signal ? { signal: opts.signal } : {});
}
