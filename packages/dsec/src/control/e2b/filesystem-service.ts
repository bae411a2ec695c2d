import { posix } from 'node:path';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import { ConnectError } from './connect-protocol.js';
import type { CallContext, Message, RpcService } from './rpc-router.js';
import { fileActor, resolvePath, userNamed, type SandboxUser, type SandboxUsers } from './sandbox-users.js';
import { cachedStat, entryInfo, realPath, type OwnerNames, type StatFn } from './entry-info.js';

/** How often a watch compares the directory with its last snapshot (there is no inotify across the sandbox boundary). */
export const WATCH_POLL_MS = 100;
/** Entries a ListDir with depth, or a watch snapshot, walks at most. */
const MAX_WALK_ENTRIES = 20_000;

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

/** Event types whose event carries the entry when the watch asked for it (`includeEntry`), as envd's do. */
const CARRIES_ENTRY = new Set(['EVENT_TYPE_CREATE', 'EVENT_TYPE_WRITE', 'EVENT_TYPE_CHMOD']);

/** envd keeps a file's metadata as user xattrs under this prefix (its filesystem package). */
export const METADATA_XATTR_PREFIX = 'user.e2b.';

/**
 * A sandbox and the user a call acts as: every file operation goes to the kernel as that user
 * (FileService's `as`), so it is refused where the user's own call would be (FILE_PERMISSION_DENIED
 * → `permission_denied`), and what it creates is the user's.
 */
export interface Acting extends SandboxSide {
  user: SandboxUser;
  /** The sandbox's uid and gid names as the call found them (for entries' owner and group). */
  names: OwnerNames;
}

/**
 * One watcher: a directory snapshot and the events found by comparing the next one with it. A
 * recursive watch walks the whole tree each time, so directories made after it started are
 * watched from the poll that first sees them (inotify watchers have to add them one by one).
 */
class DirWatcher {
  #last: Map<string, Snapshot> | undefined;

  constructor(
    private readonly fs: FilesystemService,
    private readonly acting: Acting,
    readonly dir: string,
    readonly opts: { recursive: boolean; includeEntry: boolean },
  ) {}

  async start(): Promise<void> {
    this.#last = await this.fs.snapshot(this.acting, this.dir, this.opts.recursive);
  }

  /** Events since the last poll: create, write (size or mtime changed), chmod, remove. */
  async poll(): Promise<Message[]> {
    const next = await this.fs.snapshot(this.acting, this.dir, this.opts.recursive);
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
    if (this.opts.includeEntry && events.some((ev) => CARRIES_ENTRY.has(String(ev['type'])))) {
      const stat = this.fs.statFor(this.acting); // one poll is one call: its links share one budget (entry-info.ts)
      // Owner names as the sandbox has them at this poll (a user added since shows by name).
      const acting = await this.fs.withNamesNow(this.acting);
      for (const ev of events) {
        if (!CARRIES_ENTRY.has(String(ev['type']))) continue;
        // Gone again since the walk: the event goes without its entry, as envd's does.
        const entry = await this.fs.entryAt(acting, posix.join(this.dir, String(ev['name'])), stat).catch(() => undefined);
        if (entry) ev['entry'] = entry;
      }
    }
    return events;
  }
}

function missing(err: unknown): boolean {
  return err instanceof ApiError && err.code === 'FILE_NOT_FOUND';
}

/**
 * E2B's filesystem service (stat, make dir, move, list with depth, remove, watch) over the control
 * plane's confined file operations, with envd's semantics: paths resolve against the calling
 * user's home (`~` too), every operation acts as that user, a listing walks depth first in name
 * order, removing what is not there is done, and entries carry their metadata (user xattrs).
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
        Stat: async (ctx, req) => {
          const a = await this.acting(ctx, ctx.user);
          return { entry: await this.entryAt(a, resolvePath(path(req), a.user)) };
        },
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

  /** The same call's side with the sandbox's owner names read again (a long-lived watch's next poll). */
  async withNamesNow(a: Acting): Promise<Acting> {
    return { ...a, names: (await this.users.accounts(a)).names };
  }

  /**
   * The sandbox of a call, the user it names (E2B's default user when it names none) and the
   * sandbox's owner names, read once for the whole call (a listing names every entry's owner).
   */
  async acting(side: SandboxSide, user: string | undefined): Promise<Acting> {
    const accounts = await this.users.accounts(side);
    return { sandboxId: side.sandboxId, caller: side.caller, user: userNamed(accounts.users, user), names: accounts.names };
  }

  /** The sandbox's lstat as the user, with the entry's metadata, remembered for the length of one E2B call. */
  statFor(a: Acting): StatFn {
    return this.#stat(a);
  }

  #stat(a: Acting): StatFn {
    return cachedStat((p) =>
      this.control.files.stat(a.caller, a.sandboxId, p, { as: fileActor(a.user), metadataPrefix: METADATA_XATTR_PREFIX }),
    );
  }

  /** envd's EntryInfo of the entry `st` found at `at`. */
  async entryOf(a: Acting, st: FileStat, at: string, stat = this.#stat(a)): Promise<Message> {
    return entryInfo(stat, a.names, st, at);
  }

  /** envd's EntryInfo of the entry at `p` (FILE_NOT_FOUND when there is none). */
  async entryAt(a: Acting, p: string, stat = this.#stat(a)): Promise<Message> {
    return this.entryOf(a, await stat(p), p, stat);
  }

  async #makeDir(ctx: CallContext, req: Message): Promise<Message> {
    const a = await this.acting(ctx, ctx.user);
    const p = resolvePath(path(req), a.user);
    let existing: FileStat | undefined;
    try {
      existing = await this.control.files.stat(a.caller, a.sandboxId, p, { as: fileActor(a.user) });
    } catch (err) {
      if (!missing(err)) throw err;
    }
    if (existing?.type === 'dir') throw new ConnectError('already_exists', `directory already exists: ${p}`);
    if (existing) throw new ConnectError('invalid_argument', `path already exists but it is not a directory: ${p}`);
    await this.control.files.makeDir(a.caller, a.sandboxId, p, true, { as: fileActor(a.user) });
    return { entry: await this.entryAt(a, p) };
  }

  /** A rename; the destination's missing parents are made first (the user's), as envd does. */
  async #move(ctx: CallContext, req: Message): Promise<Message> {
    const a = await this.acting(ctx, ctx.user);
    const as = fileActor(a.user);
    const from = resolvePath(path(req, 'source'), a.user);
    const to = resolvePath(path(req, 'destination'), a.user);
    await this.control.files.stat(a.caller, a.sandboxId, from, { as }); // a missing source is not_found before anything is made
    await this.control.files.makeDir(a.caller, a.sandboxId, posix.dirname(to), true, { as });
    await this.control.files.renamePath(a.caller, a.sandboxId, from, to, { as });
    return { entry: await this.entryAt(a, to) };
  }

  /** rm -rf: a path that is not there is removed already (envd's os.RemoveAll). */
  async #remove(ctx: CallContext, req: Message): Promise<Message> {
    const a = await this.acting(ctx, ctx.user);
    const p = resolvePath(path(req), a.user);
    try {
      await this.control.files.removePath(a.caller, a.sandboxId, p, true, { as: fileActor(a.user) });
    } catch (err) {
      if (!missing(err)) throw err;
    }
    return {};
  }

  /**
   * The entries under a directory down to `depth` levels, depth first in byte order of names
   * (Go's filepath.WalkDir), links inside not followed. A path that is a link to a directory
   * lists the directory, its entries named under the path as asked.
   */
  async #listDir(ctx: CallContext, req: Message): Promise<Message> {
    const a = await this.acting(ctx, ctx.user);
    const asked = resolvePath(path(req), a.user);
    const depth = req['depth'] === undefined || req['depth'] === 0 ? 1 : Number(req['depth']);
    if (!Number.isInteger(depth) || depth < 1) throw new ConnectError('invalid_argument', 'depth must be at least 1');
    const stat = this.#stat(a);
    const dir = await realPath(stat, asked);
    if (dir === undefined) throw new ConnectError('not_found', `path not found: ${asked}`);
    if ((await stat(dir)).type !== 'dir') throw new ConnectError('invalid_argument', `path is not a directory: ${asked}`);
    const entries: Message[] = [];
    for (const { at, st } of await this.#walk(a, dir, depth, true)) {
      entries.push(await this.entryOf(a, st, posix.join(asked, posix.relative(dir, at)), stat));
    }
    return { entries };
  }

  /** Entries under `dir` down to `depth` levels (symlinks are listed, not followed). */
  async #walk(a: Acting, dir: string, depth: number, depthFirst: boolean): Promise<{ at: string; st: FileStat }[]> {
    const out: { at: string; st: FileStat }[] = [];
    const opts = { as: fileActor(a.user), metadataPrefix: METADATA_XATTR_PREFIX };
    const visit = async (parent: string, level: number): Promise<void> => {
      let listing: FileStat[];
      try {
        listing = (await this.control.files.listDir(a.caller, a.sandboxId, parent, opts)).entries;
      } catch (err) {
        // a directory removed while we walk is skipped, not an error
        if (parent !== dir && missing(err)) return;
        throw err;
      }
      const sorted = depthFirst ? [...listing].sort((x, y) => Buffer.compare(Buffer.from(x.name), Buffer.from(y.name))) : listing;
      const below: string[] = [];
      for (const st of sorted) {
        if (out.length >= MAX_WALK_ENTRIES) return;
        const at = posix.join(parent, st.name);
        out.push({ at, st });
        if (st.type === 'dir' && level < depth) {
          if (depthFirst) await visit(at, level + 1);
          else below.push(at);
        }
      }
      for (const at of below) await visit(at, level + 1);
    };
    await visit(dir, 1);
    return out;
  }

  /** name (relative to `dir`) → what a change would show in. */
  async snapshot(a: Acting, dir: string, recursive: boolean): Promise<Map<string, Snapshot>> {
    const map = new Map<string, Snapshot>();
    for (const { at, st } of await this.#walk(a, dir, recursive ? 64 : 1, false)) {
      map.set(posix.relative(dir, at), { type: st.type, size: st.size, mtime: st.mtime, mode: st.mode });
    }
    return map;
  }

  async #watcherFor(ctx: CallContext, req: Message): Promise<DirWatcher> {
    const a = await this.acting(ctx, ctx.user);
    const p = resolvePath(path(req), a.user);
    const st = await this.control.files.stat(a.caller, a.sandboxId, p, { as: fileActor(a.user) });
    if (st.type !== 'dir') throw new ConnectError('invalid_argument', `path ${p} not a directory`);
    // allowNetworkMounts needs nothing: polling sees changes on any filesystem, where inotify
    // (envd's) misses those made by other machines and so refuses network mounts by default.
    const w = new DirWatcher(this, a, p, { recursive: req['recursive'] === true, includeEntry: req['includeEntry'] === true });
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
