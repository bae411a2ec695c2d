import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { isRootActor, type FileCallOptions, type StatOptions, type WriteFileOptions } from '../../protocol/file-options.js';
import { sandboxPath } from '../shared/sandbox-path.js';
import { tarCreateArgs, tarOutput } from '../shared/tar-stream.js';
import { mergeEnv } from '../shared/user-env.js';
import { AgentError } from './agent-client.js';
import { VmProcess } from './vm-process.js';
import type { LiveVm } from './vm-record.js';

/**
 * The files API of VM sandboxes: each call is the guest agent's, on the guest's own paths;
 * writes wait while a snapshot reads the frozen disk.
 */
export class VmFiles {
  readonly #ctx: { running(id: string): LiveVm; find(id: string): LiveVm | undefined };

  constructor(ctx: { running(id: string): LiveVm; find(id: string): LiveVm | undefined }) {
    this.#ctx = ctx;
  }

  /**
   * Tar streams are packed and unpacked in the guest, by the guest's own `tar` (the image's): every
   * path in the archive resolves inside the VM, which has no path to the host at all. Unlike a
   * container's (which uses the platform's read-only busybox), an image without tar cannot take
   * or give tar streams, and a tar the guest planted is the guest's own business.
   */
  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const v = this.#ctx.running(id);
    const p = sandboxPath(dir, v.record.config.cwd);
    await this.#fs(id, dir, (vm, q) => vm.agent.call('mkdir', { path: q, parents: true }), true);
    const proc = this.#tar(v, ['-x', '-f', '-', '-C', p], true);
    let bytes = 0;
    try {
      for await (const chunk of body) {
        bytes += chunk.length;
        if (!proc.writeStdin(chunk)) break;
      }
    } finally {
      proc.endStdin();
    }
    const exit = await proc.done;
    if (exit.exitCode !== 0) throw guestTarFailed('tar upload', proc.stderr.bytes().toString('utf8'), exit.exitCode);
    return bytes;
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const v = this.#ctx.running(id);
    await this.statPath(id, path); // 404 for a missing path, as for a container
    return tarOutput(this.#tar(v, tarCreateArgs(sandboxPath(path, v.record.config.cwd)), false), guestTarFailed);
  }

  /** The guest's tar as root in /, its output not kept (streamed), no timeout (an upload takes what it takes). */
  #tar(v: LiveVm, args: string[], stdin: boolean): VmProcess {
    return new VmProcess(
      v.agent,
      { argv: ['tar', ...args], env: mergeEnv(v.record.config.env, v.record.env, {}), cwd: '/', uid: 0, gid: 0 },
      { stdin, maxOutputBytes: 64 << 10 },
    );
  }

  async #fs<T>(id: string, path: string, fn: (v: LiveVm, p: string) => Promise<T>, writes = false): Promise<T> {
    // The agent refuses writes while a snapshot reads the frozen disk: they wait for it here.
    while (writes && this.#ctx.find(id)?.diffing) await this.#ctx.find(id)?.diffing?.catch(() => undefined);
    const v = this.#ctx.running(id);
    const p = sandboxPath(path, v.record.config.cwd);
    try {
      return await fn(v, p);
    } catch (err) {
      throw fileError(err, path);
    }
  }

  async readFile(id: string, path: string, maxBytes: number, opts: FileCallOptions = {}): Promise<Buffer> {
    asRootOnly(opts);
    return this.#fs(id, path, async (v, p) => {
      const r = await v.agent.call('read', { path: p, max: maxBytes });
      if (r.header['ev'] === 'too_large') {
        const size = Number(r.header['size']);
        throw new ApiError('PAYLOAD_TOO_LARGE', `${path} is ${size} bytes, over the ${maxBytes}-byte limit of the files API`, {
          path,
          size,
          limit: maxBytes,
        });
      }
      return Buffer.concat(r.data);
    });
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number, opts: WriteFileOptions = {}): Promise<number> {
    asRootOnly(opts);
    if (opts.metadata) noMetadata();
    return this.#fs(
      id,
      path,
      async (v, p) => {
        await v.agent.call('write', { path: p, mode }, data);
        return data.length;
      },
      true,
    );
  }

  async statPath(id: string, path: string, opts: StatOptions = {}): Promise<FileStat> {
    asRootOnly(opts);
    if (opts.metadataPrefix !== undefined) noMetadata();
    return this.#fs(id, path, async (v, p) =>
      toFileStat(JSON.parse((await v.agent.call('stat', { path: p })).payload.toString('utf8')) as GuestStat, p),
    );
  }

  async listDir(id: string, path: string, opts: StatOptions = {}): Promise<{ entries: FileStat[]; truncated: boolean }> {
    asRootOnly(opts);
    if (opts.metadataPrefix !== undefined) noMetadata();
    return this.#fs(id, path, async (v, p) => {
      const r = await v.agent.call('list', { path: p, max: 10_000 });
      // Sorted by name, as a container's listing is (the guest gives readdir order).
      const stats = (JSON.parse(r.payload.toString('utf8')) as GuestStat[]).sort((a, b) =>
        a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
      );
      const entries = stats.map((s) => toFileStat(s, `${p.replace(/\/$/, '')}/${s.name}`));
      return { entries, truncated: r.header['truncated'] === true };
    });
  }

  async makeDir(id: string, path: string, parents: boolean, opts: FileCallOptions = {}): Promise<void> {
    asRootOnly(opts);
    await this.#fs(id, path, (v, p) => v.agent.call('mkdir', { path: p, parents }), true);
  }

  async removePath(id: string, path: string, recursive: boolean, opts: FileCallOptions = {}): Promise<void> {
    asRootOnly(opts);
    await this.#fs(id, path, (v, p) => v.agent.call('remove', { path: p, recursive }), true);
  }

  async renamePath(id: string, from: string, to: string, opts: FileCallOptions = {}): Promise<void> {
    asRootOnly(opts);
    await this.#fs(id, from, (v, p) => v.agent.call('rename', { from: p, to: sandboxPath(to, v.record.config.cwd) }), true);
  }
}

/**
 * The guest agent does every file call as the guest's root: a call acting as another user is
 * refused rather than done as root (a container sandbox serves it).
 */
function asRootOnly(opts: FileCallOptions): void {
  if (!isRootActor(opts.as)) {
    throw new ApiError('INVALID_REQUEST', 'acting as a user is not supported by the vm backend', { field: 'as', backend: 'vm' });
  }
}

function noMetadata(): never {
  throw new ApiError('INVALID_REQUEST', 'file metadata (extended attributes) is not supported by the vm backend', {
    field: 'metadata',
    backend: 'vm',
  });
}

export interface GuestStat {
  name: string;
  type: FileStat['type'];
  size: number;
  mode: number;
  uid: number;
  gid: number;
  mtimeMs: number;
  linkTarget?: string;
}

function toFileStat(s: GuestStat, path: string): FileStat {
  const out: FileStat = {
    path,
    name: s.name,
    type: s.type,
    size: s.size,
    mode: `0${(s.mode & 0o7777).toString(8).padStart(3, '0')}`,
    uid: s.uid,
    gid: s.gid,
    mtime: new Date(s.mtimeMs).toISOString(),
  };
  if (s.linkTarget !== undefined) out.linkTarget = s.linkTarget;
  return out;
}

/** The guest's errno as the same API errors the container files API gives. */
function fileError(err: unknown, path: string): Error {
  if (!(err instanceof AgentError))
    return err instanceof ApiError ? err : new ApiError('SANDBOX_NOT_RUNNING', `the VM's agent did not answer: ${(err as Error).message}`);
  switch (err.code) {
    case 'ENOENT':
      return new ApiError('FILE_NOT_FOUND', `no such file in the sandbox: ${path}`, { path });
    case 'EISDIR':
      return new ApiError('PATH_CONFLICT', `${path} is a directory`, { path });
    case 'ENOTDIR':
      return new ApiError('PATH_CONFLICT', `a component of ${path} is not a directory`, { path });
    case 'EEXIST':
      return new ApiError('PATH_CONFLICT', `${path} already exists`, { path });
    case 'ENOTEMPTY':
      return new ApiError('PATH_CONFLICT', `${path} is a directory that is not empty (set recursive: true)`, { path });
    case 'ENOSPC':
      return new ApiError('PAYLOAD_TOO_LARGE', `the sandbox disk is full writing ${path}`, { path });
    case 'EINVAL':
      return new ApiError('INVALID_REQUEST', `${path} is not a regular file`, { path });
    default:
      return new ApiError('INVALID_REQUEST', err.message, { path, errno: err.code });
  }
}

function guestTarFailed(what: string, stderr: string, exitCode: number): ApiError {
  if (exitCode === 127)
    return new ApiError('INVALID_REQUEST', `${what} needs tar in the VM's image, and it has none`, { stderr, exitCode });
  return new ApiError('INVALID_REQUEST', `${what} failed: ${stderr.trim() || `tar exited ${exitCode}`}`, { stderr, exitCode });
}
