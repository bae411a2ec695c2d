import { Readable } from 'node:stream';
import type { FileStat } from '@dsec/sdk/schema';
import { sandboxPath } from '../shared/sandbox-path.js';
import { extractTar, packTar, removeRecursive } from './exec/sandbox-tar.js';
import { asSeenInside, ownerOf, type LiveSandbox } from './live-sandbox.js';
import { listDirInRoot, mkdirInRoot, readFileInRoot, removeInRoot, renameInRoot, statInRoot, writeFileInRoot } from './sandbox-files.js';

/**
 * The files API of container sandboxes: `openat2` in the sandbox's root (sandbox-files.ts), as its
 * root user owns files (the range's base in a user namespace); recursive removes and tar transfers
 * run the sandbox's own tools (exec/sandbox-tar.ts).
 */
export class ContainerFiles {
  /** `running`: the running sandbox of an id, or the error that says why there is none. */
  readonly #running: (id: string) => LiveSandbox;

  constructor(running: (id: string) => LiveSandbox) {
    this.#running = running;
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    const l = this.#running(id);
    return readFileInRoot(l.target.rootfs, sandboxPath(path, l.record.config.cwd), maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    const l = this.#running(id);
    return writeFileInRoot(l.target.rootfs, sandboxPath(path, l.record.config.cwd), data, mode, ownerOf(l.record));
  }

  #path(id: string, path: string): { l: LiveSandbox; p: string } {
    const l = this.#running(id);
    return { l, p: sandboxPath(path, l.record.config.cwd) };
  }

  async statPath(id: string, path: string): Promise<FileStat> {
    const { l, p } = this.#path(id, path);
    return asSeenInside(l.record, statInRoot(l.target.rootfs, p));
  }

  async listDir(id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }> {
    const { l, p } = this.#path(id, path);
    const out = listDirInRoot(l.target.rootfs, p);
    return { ...out, entries: out.entries.map((e) => asSeenInside(l.record, e)) };
  }

  async makeDir(id: string, path: string, parents: boolean): Promise<void> {
    const { l, p } = this.#path(id, path);
    mkdirInRoot(l.target.rootfs, p, parents, undefined, ownerOf(l.record));
  }

  async removePath(id: string, path: string, recursive: boolean): Promise<void> {
    const { l, p } = this.#path(id, path);
    const st = statInRoot(l.target.rootfs, p); // 404 for a missing path, either way
    if (recursive && st.type === 'dir') await removeRecursive(l.target, p);
    else removeInRoot(l.target.rootfs, p);
  }

  async renamePath(id: string, from: string, to: string): Promise<void> {
    const { l, p } = this.#path(id, from);
    renameInRoot(l.target.rootfs, p, sandboxPath(to, l.record.config.cwd));
  }

  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const { l, p } = this.#path(id, dir);
    mkdirInRoot(l.target.rootfs, p, true, undefined, ownerOf(l.record));
    return extractTar(l.target, p, Readable.from(body));
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const { l, p } = this.#path(id, path);
    statInRoot(l.target.rootfs, p);
    return packTar(l.target, p);
  }
}
