import { copyFileSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import { basename, dirname, join, relative, resolve } from 'node:path';
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
  const run = opts.signal ? { signal: opts.signal } : {};
  if (opts.chunked && !sameFilesystem(TMP, dirname(outFile))) {
    if (!isUnder(sourceDir, TMP)) {
      await runToolOrThrow('unshare', [...tmpOnImageFs(outFile, sourceDir), ...args], run);
      return;
    }
    // A source under /tmp would be hidden by the bind: the image is made on /tmp's filesystem
    // and copied over (never so in dsec, whose trees are in its data dir; a caller's /tmp tree).
    const scratch = mkdtempSync(join(TMP, 'dsec-erofs-'));
    try {
      await runToolOrThrow('mkfs.erofs', [...args, join(scratch, 'image.erofs'), sourceDir], run);
      copyFileSync(join(scratch, 'image.erofs'), outFile);
    } finally {
      rmSync(scratch, { recursive: true, force: true });
    }
    return;
  }
  args.push(outFile, sourceDir);
  await runToolOrThrow('mkfs.erofs', args, run);
}

function isUnder(path: string, dir: string): boolean {
  const r = relative(dir, resolve(path));
  return r === '' || (!r.startsWith('..') && !r.startsWith('/'));
}

/** Where glibc's tmpfile() makes its O_TMPFILE, whatever TMPDIR says (P_tmpdir). */
const TMP = '/tmp';

function sameFilesystem(a: string, b: string): boolean {
  return statSync(a).dev === statSync(b).dev;
}

/**
 * mkfs.erofs 1.5 (Debian 12) writes a chunked image's file data to an O_TMPFILE in /tmp and then
 * copy_file_range()s it into the image, with no fallback: where /tmp is another filesystem than the
 * image's (a data disk of its own, /tmp a tmpfs, dsec in a container) that fails with EXDEV,
 * reported as "Could not format the device: [Error 5] Input/output error", and every snapshot of a
 * sandbox holding a sparse file failed. Such a build runs in a mount namespace of its own with the
 * image's dir bound at /tmp. The image is reached through an fd opened before the bind
 * (/proc/self/fd/9: sh's fds are mkfs.erofs's after its exec); the source by its path, which is
 * not under /tmp (mkfs.erofs resolves it to that path, so an fd would not do).
 * `unshare -m` does not fork: signals reach mkfs.erofs. The arguments for `unshare`; mkfs.erofs's
 * own options follow them.
 */
function tmpOnImageFs(outFile: string, sourceDir: string): string[] {
  const script =
    'exec 9<"$2" && mount --bind /proc/self/fd/9 /tmp && src=$1 name=$3 && shift 3 && exec mkfs.erofs "$@" "/proc/self/fd/9/$name" "$src"';
  return [
    '--mount',
    '--propagation',
    'private',
    'sh',
    '-c',
    script,
    'sh',
    resolve(sourceDir),
    dirname(resolve(outFile)),
    basename(outFile),
  ];
}
