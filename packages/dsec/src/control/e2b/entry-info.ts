import { posix } from 'node:path';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { ConnectError } from './connect-protocol.js';
import type { Message } from './rpc-router.js';

/**
 * E2B's view of one file (envd's EntryInfo), made from dsec's lstat-like FileStat. envd describes
 * a symlink by what it leads to: its type and permission bits are the target's, `symlinkTarget`
 * is the target's full path with every link on the way resolved (Go's filepath.EvalSymlinks),
 * and a link that leads nowhere has no type (the SDK's list leaves such entries out) and itself
 * as target. `permissions` is Go's FileMode.String of the entry itself: `Lrwxrwxrwx` for a link,
 * `dtrwxrwxrwx` for a sticky directory, `urwxr-xr-x` for a setuid file. `metadata` is the entry's
 * user xattrs under envd's prefix (the StatFn asks for them).
 */

const FILE_TYPE: Record<FileStat['type'], string> = {
  file: 'FILE_TYPE_FILE',
  dir: 'FILE_TYPE_DIRECTORY',
  symlink: 'FILE_TYPE_SYMLINK',
  other: 'FILE_TYPE_UNSPECIFIED',
};

/** Links followed before a path is taken for a loop (Go's EvalSymlinks gives up at 255). */
const MAX_LINKS = 255;

/** Go's os.FileMode.String() for a dsec type and octal mode (type letters, then rwx triples). */
export function goModeString(type: FileStat['type'], mode: number): string {
  let prefix = '';
  if (type === 'dir') prefix += 'd';
  if (type === 'symlink') prefix += 'L';
  if (mode & 0o4000) prefix += 'u';
  if (mode & 0o2000) prefix += 'g';
  if (mode & 0o1000) prefix += 't';
  // A device, pipe or socket: FileStat does not say which, and Go's catch-all letter is `?`.
  if (type === 'other') prefix += '?';
  let rwx = '';
  for (let shift = 6; shift >= 0; shift -= 3) {
    const bits = (mode >> shift) & 7;
    rwx += (bits & 4 ? 'r' : '-') + (bits & 2 ? 'w' : '-') + (bits & 1 ? 'x' : '-');
  }
  return (prefix || '-') + rwx;
}

/**
 * Path components (links' targets included) realPath walks for one E2B call, all its paths
 * together (a component is counted when it joins the walk): the sandbox plants the links, and their resolution runs on the control plane's event
 * loop (a remembered stat does not yield to it), so a listing of links to chains of 255 links with
 * targets near PATH_MAX must end, not hold every other caller for minutes. One path takes at most
 * about 255 × 2048 + 2048 steps, so any single path still resolves as Go's EvalSymlinks would.
 */
export const MAX_CALL_STEPS = 1_000_000;

/** An lstat of a path inside the sandbox (parents followed, the last component not). */
export interface StatFn {
  (path: string): Promise<FileStat>;
  /** realPath's steps left for the call this stat serves (MAX_CALL_STEPS). */
  steps?: { left: number };
}

/** `stat` that remembers what it saw: one E2B call resolves many paths through the same links. */
export function cachedStat(stat: StatFn): StatFn {
  const seen = new Map<string, Promise<FileStat>>();
  const fn: StatFn = (p) => {
    let st = seen.get(p);
    if (!st) seen.set(p, (st = stat(p)));
    return st;
  };
  fn.steps = { left: MAX_CALL_STEPS };
  return fn;
}

function missing(err: unknown): boolean {
  return err instanceof ApiError && (err.code === 'FILE_NOT_FOUND' || err.code === 'PATH_CONFLICT');
}

/**
 * The canonical path of `path` inside the sandbox, every symlink on the way resolved, as
 * filepath.EvalSymlinks gives it; undefined when a component is missing or the links loop.
 */
export async function realPath(stat: StatFn, path: string): Promise<string | undefined> {
  const budget = stat.steps ?? { left: MAX_CALL_STEPS };
  // Every component walked is charged once, when it joins the walk: the path's own, then each
  // link's target's (a chain of links stops at MAX_LINKS before its padding is popped, but pushing
  // it is the cost).
  const charge = (n: number): void => {
    budget.left -= n;
    if (budget.left < 0)
      throw new ConnectError('resource_exhausted', `the symlinks under ${path} take too many steps to resolve in one call`);
  };
  let done = '/';
  // The components still to walk, the next one last: a link's target is pushed in O(its length)
  // and each step pops in O(1) (shift() and re-spreading the rest made a padded chain quadratic).
  const rest = path.split('/').reverse();
  charge(rest.length);
  let links = 0;
  while (rest.length > 0) {
    const c = rest.pop()!;
    if (c === '' || c === '.') continue;
    if (c === '..') {
      done = posix.dirname(done);
      continue;
    }
    const next = posix.join(done, c);
    let st: FileStat;
    try {
      st = await stat(next);
    } catch (err) {
      if (missing(err)) return undefined;
      throw err;
    }
    if (st.type !== 'symlink' || st.linkTarget === undefined) {
      // A file used as a directory. Scanned once at most: either a name is left (the end) or
      // only `.` and empty components are, and the walk ends after them.
      if (st.type !== 'dir' && rest.some((r) => r !== '' && r !== '.')) return undefined;
      done = next;
      continue;
    }
    if (++links > MAX_LINKS) return undefined;
    if (st.linkTarget.startsWith('/')) done = '/';
    const target = st.linkTarget.split('/');
    charge(target.length);
    for (let i = target.length - 1; i >= 0; i--) rest.push(target[i]!);
  }
  return done;
}

/** What a symlink leads to: its canonical path and that entry's stat, or nothing when it dangles. */
async function followLink(stat: StatFn, at: string): Promise<{ target: string; st: FileStat } | undefined> {
  const target = await realPath(stat, at);
  if (target === undefined) return undefined;
  try {
    return { target, st: await stat(target) };
  } catch (err) {
    if (missing(err)) return undefined;
    throw err;
  }
}

/** uid → user name and gid → group name of the sandbox (its /etc/passwd and /etc/group). */
export interface OwnerNames {
  users: Map<number, string>;
  groups: Map<number, string>;
}

/** envd's EntryInfo of the entry `st` found at `at`. */
export async function entryInfo(stat: StatFn, names: OwnerNames, st: FileStat, at: string): Promise<Message> {
  const ownMode = parseInt(st.mode, 8);
  let type = FILE_TYPE[st.type];
  let mode = ownMode & 0o777;
  let symlinkTarget: string | undefined;
  // Followed once: its type, mode and metadata (resolution takes steps of the call's budget).
  const to = st.type === 'symlink' ? await followLink(stat, at) : undefined;
  if (st.type === 'symlink') {
    symlinkTarget = to?.target ?? at;
    type = to ? FILE_TYPE[to.st.type] : FILE_TYPE.other;
    mode = to ? parseInt(to.st.mode, 8) & 0o777 : 0;
  }
  const out: Message = {
    name: posix.basename(at) || '/',
    type,
    path: at,
    size: String(st.size),
    mode,
    permissions: goModeString(st.type, ownMode),
    owner: names.users.get(st.uid) ?? String(st.uid),
    group: names.groups.get(st.gid) ?? String(st.gid),
    modifiedTime: st.mtime,
  };
  if (symlinkTarget !== undefined) out['symlinkTarget'] = symlinkTarget;
  // envd reads metadata through a link (getxattr follows it): a link shows its target's.
  const metadata = st.type === 'symlink' ? to?.st.metadata : st.metadata;
  if (metadata && Object.keys(metadata).length > 0) out['metadata'] = metadata;
  return out;
}
