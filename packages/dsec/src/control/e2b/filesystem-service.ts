import { posix } from 'node:path';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import { ConnectError } from './connect-protocol.js';
import type { CallContext, Message, RpcService } from './rpc-router.js';
import { resolvePath, type SandboxUser, type SandboxUsers } from './sandbox-users.js';

/** How often a watch compares the directory with its last snapshot (there is no inotify across the sandbox boundary). */
export const WATCH_POLL_MS = 100;
/** Entries a ListDir with depth, or a watch snapshot, walks at most. */
const MAX_WALK_ENTRIES = 20_000;

const FILE_TYPE: Record<FileStat['type'], string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
  other: 'FILE_TYPE_UNSPECIFIED',
};

/** `-rw-r--r--` from a type and octal permission bits, as `ls -l` prints them. */
function permissionString(type: FileStat['type'], mode: number): string {
  const t = type === 'dir' ? 'd' : type === 'symlink' ? 'l' : '-';
  let s = '';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const bits = (mode >> shift) & 7;
    s += (bits & 4 ? 'r' : '-') + (bits & 2 ? 'w' : '-') + (bits & 1 ? 'x' : '-');
  }
  return t + s;
}

function path(req: Message, field = 'path'): string {
  const v = req[field];
  if (typeof v !== 'string' || v === '') throw new ConnectError('invalid_argument', `${field} is required`);
  return v;
}

interface Snapshot {
  type: FileStat['type'];
  size: number;
  mtime: string;
  mode: string;
}

/** One watcher: a directory snapshot and the events found by comparing the next one with it. */
class DirWatcher {
  #last: Map<string, Snapshot> | undefined;

  constructor(
    private readonly fs: FilesystemService,
    private readonly side: SandboxSide,
    readonly dir: string,
    readonly recursive: boolean,
  ) {}

  async start(): Promise<void> {
    this.#last = await this.fs.snapshot(this.side, this.dir, this.recursive);
  }

  /** Events since the last poll: create, write (size or mtime changed), chmod, remove. */
  async poll(): Promise<Message[]> {
    const next = await this.fs.snapshot(this.side, this.dir, this.recursive);
    const last = this.#last ?? new Map<string, Snapshot>();
    const events: Message[] = [];
    for (const [name, s] of next) {
      const before = last.get(name);
      if (!before || before.type !== s.type) events.push({ name, type: 'EVENT_TYPE_CREATE' });
      else if (before.size !== s.size || before.mtime !== s.mtime) events.push({ name, type: 'EVENT_TYPE_WRITE' });
      else if (before.mode !== s.mode) events.push({ name, type: 'EVENT_TYPE_CHMOD' });
    }
    for (const name of last.keys()) if (!next.has(name)) events.push({ name, type: 'EVENT_TYPE_REMOVE' });
    this.#last = next;
    return events;
  }
}

/**
 * E2B's filesystem service (stat, make dir, move, list with depth, remove, watch) over the control
 * plane's confined file operations. Paths resolve against the calling user's home; what a
 * non-root user creates is handed to that user, as it would be had the user made it.
 */
export class FilesystemService {
  readonly #watchers = new Map<string, { sandboxId: string; w: DirWatcher }>();
  #nextWatcher = 1;

  constructor(
    private readonly control: ControlPlane,
    private readonly users: SandboxUsers,
  ) {}

  service(): RpcService {
    return {
      name: 'filesystem.Filesystem',
      keepalive: { keepalive: {} },
      unary: {
        Stat: async (ctx, req) => ({ entry: await this.#entry(ctx, resolvePath(path(req), await this.#user(ctx))) }),
        MakeDir: (ctx, req) => this.#makeDir(ctx, req),
        Move: (ctx, req) => this.#move(ctx, req),
        ListDir: (ctx, req) => this.#listDir(ctx, req),
        Remove: (ctx, req) => this.#remove(ctx, req),
        CreateWatcher: (ctx, req) => this.#createWatcher(ctx, req),
        GetWatcherEvents: (ctx, req) => this.#getWatcherEvents(ctx, req),
        RemoveWatcher: async (ctx, req) => {
          this.#watcherOf(ctx, req);
          this.#watchers.delete(String(req['watcherId']));
          return {};
        },
      },
      stream: { WatchDir: (ctx, req, emit) => this.#watchDir(ctx, req, emit) },
    };
  }

  #user(ctx: CallContext): Promise<SandboxUser> {
    return this.users.resolve(ctx, ctx.user);
  }

  /** EntryInfo for a dsec FileStat, with owner and group by name where the sandbox knows them. */
  async entryOf(side: SandboxSide, st: FileStat, at: string): Promise<Message> {
    const names = await this.users.names(side);
    const mode = parseInt(st.mode, 8);
    const out: Message = {
      name: posix.basename(at) || '/',
      type: FILE_TYPE[st.type],
      path: at,
      size: String(st.size),
      mode,
      permissions: permissionString(st.type, mode),
      owner: names.users.get(st.uid) ?? String(st.uid),
      group: names.groups.get(st.gid) ?? String(st.gid),
      modifiedTime: st.mtime,
    };
    if (st.linkTarget !== undefined) out['symlinkTarget'] = st.linkTarget;
    return out;
  }

  async #entry(ctx: CallContext, p: string): Promise<Message> {
    return this.entryOf(ctx, await this.control.files.stat(ctx.caller, ctx.sandboxId, p), p);
  }

  async #exists(side: SandboxSide, p: string): Promise<boolean> {
    try {
      await this.control.files.stat(side.caller, side.sandboxId, p);
      return true;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'FILE_NOT_FOUND') return false;
      throw err;
    }
  }

  /** The directories above `p` (nearest first) that do not exist yet: what a mkdir -p would create. */
  async missingParents(side: SandboxSide, p: string): Promise<string[]> {
    const missing: string[] = [];
    for (let d = posix.dirname(p); d !== '/' && !(await this.#exists(side, d)); d = posix.dirname(d)) missing.push(d);
    return missing;
  }

  /** Hands paths dsec just created (as root, from outside) to the user who asked for them. */
  async chown(side: SandboxSide, user: SandboxUser, paths: string[]): Promise<void> {
    if (user.uid === 0 || paths.length === 0) return;
    const r = await this.control.exec.exec(side.caller, side.sandboxId, {
      cmd: ['chown', '-h', `${user.uid}:${user.gid}`, '--', ...paths],
    });
    if (r.exitCode !== 0) throw new ConnectError('internal', `could not give ${paths.join(', ')} to ${user.name}: ${r.stderr.trim()}`);
  }

  async #makeDir(ctx: CallContext, req: Message): Promise<Message> {
    const user = await this.#user(ctx);
    const p = resolvePath(path(req), user);
    if (await this.#exists(ctx, p)) throw new ConnectError('already_exists', `${p} already exists`);
    const created = [p, ...(await this.missingParents(ctx, p))];
    await this.control.files.makeDir(ctx.caller, ctx.sandboxId, p, true);
    await this.chown(ctx, user, created);
    return { entry: await this.#entry(ctx, p) };
  }

  async #move(ctx: CallContext, req: Message): Promise<Message> {
    const user = await this.#user(ctx);
    const from = resolvePath(path(req, 'source'), user);
    const to = resolvePath(path(req, 'destination'), user);
    await this.control.files.renamePath(ctx.caller, ctx.sandboxId, from, to);
    return { entry: await this.#entry(ctx, to) };
  }

  async #remove(ctx: CallContext, req: Message): Promise<Message> {
    const p = resolvePath(path(req), await this.#user(ctx));
    await this.control.files.removePath(ctx.caller, ctx.sandboxId, p, true);
    return {};
  }

  async #listDir(ctx: CallContext, req: Message): Promise<Message> {
    const p = resolvePath(path(req), await this.#user(ctx));
    const depth = req['depth'] === undefined ? 1 : Number(req['depth']);
    if (!Number.isInteger(depth) || depth < 1) throw new ConnectError('invalid_argument', 'depth must be at least 1');
    const root = await this.control.files.stat(ctx.caller, ctx.sandboxId, p);
    if (root.type !== 'dir') throw new ConnectError('invalid_argument', `${p} is not a directory`);
    const entries: Message[] = [];
    for (const { at, st } of await this.#walk(ctx, p, depth)) entries.push(await this.entryOf(ctx, st, at));
    return { entries };
  }

  /** Entries under `dir` down to `depth` levels (symlinks are listed, not followed). */
  async #walk(side: SandboxSide, dir: string, depth: number): Promise<{ at: string; st: FileStat }[]> {
    const out: { at: string; st: FileStat }[] = [];
    let level = [dir];
    for (let d = 0; d < depth && level.length > 0; d++) {
      const next: string[] = [];
      for (const parent of level) {
        let listing: FileStat[];
        try {
          listing = (await this.control.files.listDir(side.caller, side.sandboxId, parent)).entries;
        } catch (err) {
          // a directory removed while we walk is skipped, not an error
          if (parent !== dir && err instanceof ApiError && err.code === 'FILE_NOT_FOUND') continue;
          throw err;
        }
        for (const st of listing) {
          const at = posix.join(parent, st.name);
          out.push({ at, st });
          if (st.type === 'dir') next.push(at);
          if (out.length >= MAX_WALK_ENTRIES) return out;
        }
      }
      level = next;
    }
    return out;
  }

  /** name (relative to `dir`) → what a change would show in. */
  async snapshot(side: SandboxSide, dir: string, recursive: boolean): Promise<Map<string, Snapshot>> {
    const map = new Map<string, Snapshot>();
    for (const { at, st } of await this.#walk(side, dir, recursive ? 64 : 1)) {
      map.set(posix.relative(dir, at), { type: st.type, size: st.size, mtime: st.mtime, mode: st.mode });
    }
    return map;
  }

  async #watcherFor(ctx: CallContext, req: Message): Promise<DirWatcher> {
    const p = resolvePath(path(req), await this.#user(ctx));
    const st = await this.control.files.stat(ctx.caller, ctx.sandboxId, p);
    if (st.type !== 'dir') throw new ConnectError('invalid_argument', `${p} is not a directory`);
    const w = new DirWatcher(this, { sandboxId: ctx.sandboxId, caller: ctx.caller }, p, req['recursive'] === true);
    await w.start();
    return w;
  }

  async #watchDir(ctx: CallContext, req: Message, emit: (m: Message) => void): Promise<void> {
    const w = await this.#watcherFor(ctx, req);
    emit({ start: {} });
    while (!ctx.signal.aborted) {
      await new Promise((r) => setTimeout(r, WATCH_POLL_MS));
      if (ctx.signal.aborted) break;
      for (const ev of await w.poll()) emit({ filesystem: ev });
    }
  }

  async #createWatcher(ctx: CallContext, req: Message): Promise<Message> {
    const w = await this.#watcherFor(ctx, req);
    const id = `w-${this.#nextWatcher++}`;
    this.#watchers.set(id, { sandboxId: ctx.sandboxId, w });
    return { watcherId: id };
  }

  #watcherOf(ctx: CallContext, req: Message): DirWatcher {
    const entry = this.#watchers.get(String(req['watcherId']));
    if (!entry || entry.sandboxId !== ctx.sandboxId) throw new ConnectError('not_found', `watcher ${String(req['watcherId'])} not found`);
    return entry.w;
  }

  async #getWatcherEvents(ctx: CallContext, req: Message): Promise<Message> {
    return { events: await this.#watcherOf(ctx, req).poll() };
  }

  forget(sandboxId: string): void {
    for (const [id, e] of this.#watchers) if (e.sandboxId === sandboxId) this.#watchers.delete(id);
  }

  /** Sandboxes this service holds watchers for. */
  sandboxes(): string[] {
    return [...new Set([...this.#watchers.values()].map((e) => e.sandboxId))];
  }
}
