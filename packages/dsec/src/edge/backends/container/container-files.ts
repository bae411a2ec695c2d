import { Readable } from 'node:stream';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import {
  checkFileActor,
  checkFileMetadata,
  checkMetadataPrefix,
  isRootActor,
  type FileActor,
  type FileCallOptions,
  type StatOptions,
  type WriteFileOptions,
} from '../../protocol/file-options.js';
import { sandboxPath } from '../shared/sandbox-path.js';
import { extractTar, packTar, removeRecursive } from './exec/sandbox-tar.js';
import { asSeenInside, ownerOf, type LiveSandbox } from './live-sandbox.js';
import type { SandboxRecord } from './sandbox-record.js';
import {
  type ActingUser,
  listDirInRoot,
  mkdirInRoot,
  readFileInRoot,
  removeInRoot,
  renameInRoot,
  statInRoot,
  writeFileInRoot,
} from './sandbox-files.js';
import { removeTreeInRoot } from './sandbox-remove-tree.js';

/**
 * The files API of container sandboxes: `openat2` in the sandbox's root (sandbox-files.ts), as its
 * root user owns files (the range's base in a user namespace), or as one of its users (`as`): the
 * edge's thread then takes that user's host ids for the call (host/fs-ids.ts). Root's recursive
 * removes and tar transfers run the sandbox's own tools (exec/sandbox-tar.ts); a user's recursive
 * remove is walked in the edge under the user's ids (sandbox-files.ts removeTreeInRoot).
 */
export class ContainerFiles {
  /** `running`: the running sandbox of an id, or the error that says why there is none. */
  readonly #running: (id: string) => LiveSandbox;

  constructor(running: (id: string) => LiveSandbox) {
    this.#running = running;
  }

  async readFile(id: string, path: string, maxBytes: number, opts: FileCallOptions = {}): Promise<Buffer> {
    const { l, p, user } = this.#call(id, path, opts);
    return readFileInRoot(l.target.rootfs, p, maxBytes, user);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number, opts: WriteFileOptions = {}): Promise<number> {
    if (opts.metadata) checkFileMetadata(opts.metadata);
    const { l, p, user } = this.#call(id, path, opts);
    return writeFileInRoot(l.target.rootfs, p, data, mode, { owner: user ? undefined : ownerOf(l.record), user, metadata: opts.metadata });
  }

  /** The running sandbox, the path in it, and the user the call acts as (undefined: its root). */
  #call(id: string, path: string, opts: FileCallOptions): { l: LiveSandbox; p: string; user: ActingUser | undefined } {
    const l = this.#running(id);
    return { l, p: sandboxPath(path, l.record.config.cwd), user: actingUser(l.record, opts.as) };
  }

  async statPath(id: string, path: string, opts: StatOptions = {}): Promise<FileStat> {
    if (opts.metadataPrefix !== undefined) checkMetadataPrefix(opts.metadataPrefix, 'metadataPrefix');
    const { l, p, user } = this.#call(id, path, opts);
    return asSeenInside(l.record, statInRoot(l.target.rootfs, p, { user, metadataPrefix: opts.metadataPrefix }));
  }

  async listDir(id: string, path: string, opts: StatOptions = {}): Promise<{ entries: FileStat[]; truncated: boolean }> {
    if (opts.metadataPrefix !== undefined) checkMetadataPrefix(opts.metadataPrefix, 'metadataPrefix');
    const { l, p, user } = this.#call(id, path, opts);
    const out = listDirInRoot(l.target.rootfs, p, { user, metadataPrefix: opts.metadataPrefix });
    return { ...out, entries: out.entries.map((e) => asSeenInside(l.record, e)) };
  }

  async makeDir(id: string, path: string, parents: boolean, opts: FileCallOptions = {}): Promise<void> {
    const { l, p, user } = this.#call(id, path, opts);
    mkdirInRoot(l.target.rootfs, p, parents, user ? { user } : { owner: ownerOf(l.record) });
  }

  async removePath(id: string, path: string, recursive: boolean, opts: FileCallOptions = {}): Promise<void> {
    const { l, p, user } = this.#call(id, path, opts);
    const st = statInRoot(l.target.rootfs, p, { user }); // 404 for a missing path, either way
    if (recursive && st.type === 'dir') {
      if (user) await removeTreeInRoot(l.target.rootfs, p, user);
      else await removeRecursive(l.target, p);
    } else removeInRoot(l.target.rootfs, p, user);
  }

  async renamePath(id: string, from: string, to: string, opts: FileCallOptions = {}): Promise<void> {
    const { l, p, user } = this.#call(id, from, opts);
    renameInRoot(l.target.rootfs, p, sandboxPath(to, l.record.config.cwd), user);
  }

  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const { l, p } = this.#call(id, dir, {});
    mkdirInRoot(l.target.rootfs, p, true, { owner: ownerOf(l.record) });
    return extractTar(l.target, p, Readable.from(body));
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const { l, p } = this.#call(id, path, {});
    statInRoot(l.target.rootfs, p);
    return packTar(l.target, p);
  }
}

/**
 * The host ids the kernel checks for a user of the sandbox: its own ids in a sandbox without a
 * user namespace, those ids in the sandbox's range in one (an id outside the range is no user of
 * the sandbox). Root (uid 0) acts as the edge does for root's calls: undefined.
 */
function actingUser(r: SandboxRecord, as: FileActor | undefined): ActingUser | undefined {
  if (isRootActor(as) || as === undefined) return undefined;
  checkFileActor(as);
  const range = r.userns;
  const toHost = (id: number): number => {
    if (!range) return id;
    if (id >= range.size) {
      throw new ApiError('INVALID_REQUEST', `as: id ${id} is outside the sandbox's user namespace (0 to ${range.size - 1})`, {
        field: 'as',
      });
    }
    return range.base + id;
  };
  return { uid: as.uid, host: { uid: toHost(as.uid), gid: toHost(as.gid), groups: as.groups.map(toHost) } };
}
