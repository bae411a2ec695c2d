import type { Readable } from 'node:stream';
import { ApiError } from '../../../../api-error.js';
import { TOOLBOX_PATH } from '../oci-config.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { tarCreateArgs, tarOutput } from '../../shared/tar-stream.js';
import { SandboxProcess } from './sandbox-process.js';

/**
 * Directory transfer as tar streams, packed and unpacked inside the sandbox (in its mount
 * namespace, as its user): every path in the archive, `..`, absolute names and symlinks included,
 * resolves inside the sandbox, so no tar entry can reach the host. The tar is the platform's own
 * (a static busybox bind-mounted read-only, TOOLBOX_PATH), never the one in the sandbox's PATH:
 * an agent that plants /usr/local/bin/tar cannot change what is uploaded or read back.
 */
function tarProcess(target: ExecTarget, args: string[], stdin: boolean): SandboxProcess {
  return new SandboxProcess(target, processSpecFor(target, [TOOLBOX_PATH, 'tar', ...args], { cwd: '/' }), {
    stdin,
    maxOutputBytes: 64 << 10,
  });
}

function tarFailed(what: string, stderr: string, exitCode: number): ApiError {
  // 127 with a shell's message since dsec-enter and dsec-landlock print one; 255 from older builds.
  const missing = /not found in \$PATH|No such file|command not found/.test(stderr) && (exitCode === 127 || exitCode === 255);
  return new ApiError(
    'INVALID_REQUEST',
    missing
      ? `the sandbox has no ${TOOLBOX_PATH} (it was created by an older dsec), which ${what} needs`
      : `${what} failed: ${stderr.trim() || `tar exited ${exitCode}`}`,
    { stderr, exitCode },
  );
}

/** Unpacks a tar stream into `dir` (which must exist). Returns the bytes received. */
export async function extractTar(target: ExecTarget, dir: string, body: Readable): Promise<number> {
  const proc = tarProcess(target, ['-x', '-f', '-', '-C', dir], true);
  let bytes = 0;
  try {
    for await (const chunk of body) {
      const buf = chunk as Buffer;
      bytes += buf.length;
      if (!proc.writeStdin(buf)) break;
    }
  } finally {
    proc.endStdin();
  }
  const exit = await proc.done;
  if (exit.exitCode !== 0) throw tarFailed('tar upload', proc.stderr.bytes().toString('utf8'), exit.exitCode);
  return bytes;
}

/**
 * Packs `path` (a file or directory) as a tar stream of one top-level entry. The first chunk is
 * awaited before returning, so an error (no such path, no tar) is reported as an error and not
 * as a truncated stream.
 */
export async function packTar(target: ExecTarget, path: string): Promise<AsyncIterable<Buffer>> {
  return tarOutput(tarProcess(target, tarCreateArgs(path), false), tarFailed);
}

/** rm -rf inside the sandbox with the platform's own rm (recursive removal walks the sandbox's own tree, in its namespace). */
export async function removeRecursive(target: ExecTarget, path: string): Promise<void> {
  const proc = new SandboxProcess(target, processSpecFor(target, [TOOLBOX_PATH, 'rm', '-rf', '--', path], { cwd: '/' }), {
    maxOutputBytes: 64 << 10,
  });
  const exit = await proc.done;
  if (exit.exitCode !== 0)
    throw new ApiError('INVALID_REQUEST', `rm -rf ${path} failed: ${proc.stderr.bytes().toString('utf8').trim()}`, { path });
}
