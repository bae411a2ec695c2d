import { posix } from 'node:path';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import { ApiError } from '../../api-error.js';
import { ConnectError } from './connect-protocol.js';
import type { FileActor } from '../../edge/protocol/edge-api.js';

/** E2B's default user: the base template has it, and the SDK sends no user when none is given. */
export const DEFAULT_USER = 'user';

export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
  /** Its supplementary groups (those of /etc/group that list it), its own gid first. */
  groups: number[];
}

const ROOT: SandboxUser = { name: 'root', uid: 0, gid: 0, home: '/root', groups: [0] };

/** Who a file call acts as for `user`: the kernel then checks it as it would that user's own call. */
export function fileActor(user: SandboxUser): FileActor | undefined {
  return user.uid === 0 ? undefined : { uid: user.uid, gid: user.gid, groups: user.groups };
}

/**
 * The sandbox's users, read from its own /etc/passwd (through the control plane's confined file
 * read) and kept per sandbox: a template decides who exists, dsec does not assume.
 */
export class SandboxUsers {
  readonly #cache = new Map<string, SandboxAccounts & { version: string }>();

  constructor(private readonly control: ControlPlane) {}

  /**
   * Which /etc/passwd and /etc/group the sandbox has now (their mtimes and sizes): a user or a
   * group membership added inside the sandbox (useradd, usermod -aG) counts from the next call,
   * as it does for envd, which looks users up on every call.
   */
  async #version(side: SandboxSide): Promise<string> {
    const one = async (p: string): Promise<string> => {
      try {
        const st = await this.control.files.stat(side.caller, side.sandboxId, p);
        return `${st.mtime}/${st.size}`;
      } catch (err) {
        if (err instanceof ApiError && err.code === 'FILE_NOT_FOUND') return 'none';
        throw err;
      }
    };
    return `${await one('/etc/passwd')} ${await one('/etc/group')}`;
  }

  /**
   * The sandbox's accounts now: its users by name (with their groups) and the names of its uids
   * and gids, read from its /etc/passwd and /etc/group once per version of those files. One E2B
   * call takes them once (FilesystemService.acting), however many entries it then describes.
   */
  async accounts(side: SandboxSide): Promise<SandboxAccounts> {
    const { sandboxId, caller } = side;
    const version = await this.#version(side);
    const cached = this.#cache.get(sandboxId);
    if (cached?.version === version) return cached;
    const users = new Map([['root', { ...ROOT, groups: [...ROOT.groups] }]]); // a copy: /etc/group adds to its groups
    try {
      const text = (await this.control.files.readFile(caller, sandboxId, '/etc/passwd', 1 << 20)).toString('utf8');
      for (const line of text.split('\n')) {
        const [name, , uid, gid, , home] = line.split(':');
        if (!name || uid === undefined || gid === undefined || !/^\d+$/.test(uid) || !/^\d+$/.test(gid)) continue;
        users.set(name, { name, uid: Number(uid), gid: Number(gid), home: home || '/', groups: [Number(gid)] });
      }
    } catch {
      // an image without /etc/passwd (a bare busybox) has root only
    }
    const groupNames = new Map<number, string>([[0, 'root']]);
    try {
      const text = (await this.control.files.readFile(caller, sandboxId, '/etc/group', 1 << 20)).toString('utf8');
      // Memberships gathered in sets: the sandbox writes this file, and Array.includes per line
      // made 95k memberships of one user (1 MiB) 5·10⁹ comparisons on the control plane's loop.
      const memberships = new Map<SandboxUser, Set<number>>();
      for (const line of text.split('\n')) {
        const [group, , gid, members] = line.split(':');
        if (!gid || !/^\d+$/.test(gid)) continue;
        if (group) groupNames.set(Number(gid), group);
        if (!members) continue;
        for (const member of members.split(',')) {
          const u = users.get(member.trim());
          if (!u) continue;
          let set = memberships.get(u);
          if (!set) memberships.set(u, (set = new Set(u.groups)));
          set.add(Number(gid));
        }
      }
      for (const [u, set] of memberships) u.groups = [...set];
    } catch {
      // no /etc/group: each user has its own gid only, and gids are shown as numbers
    }
    const userNames = new Map<number, string>();
    for (const u of users.values()) if (!userNames.has(u.uid)) userNames.set(u.uid, u.name);
    const out = { version, users, names: { users: userNames, groups: groupNames } };
    if (this.#cache.size > 10_000) this.#cache.clear();
    this.#cache.set(sandboxId, out);
    return out;
  }

  /**
   * The user a call runs as: the one named by `Authorization: Basic base64(name:)`, else E2B's
   * default user when the image has it, else root.
   */
  async resolve(side: SandboxSide, requested: string | undefined): Promise<SandboxUser> {
    return userNamed((await this.accounts(side)).users, requested);
  }

  forget(sandboxId: string): void {
    this.#cache.delete(sandboxId);
  }

  /** Sandboxes this cache holds users for. */
  sandboxes(): string[] {
    return [...this.#cache.keys()];
  }
}

/** A sandbox's users by name, and the names of its uids and gids (for a file's owner and group). */
export interface SandboxAccounts {
  users: Map<string, SandboxUser>;
  names: { users: Map<number, string>; groups: Map<number, string> };
}

/** The user `requested` names among `users`, else E2B's default user when there is one, else root. */
export function userNamed(users: Map<string, SandboxUser>, requested: string | undefined): SandboxUser {
  if (requested) {
    const u = users.get(requested);
    if (!u)
      throw new ConnectError(
        'invalid_argument',
        `user ${JSON.stringify(requested)} does not exist in this sandbox (its /etc/passwd has: ${[...users.keys()].join(', ')})`,
      );
    return u;
  }
  return users.get(DEFAULT_USER) ?? ROOT;
}

/** The user name in `Authorization: Basic base64("name:")`, E2B's way of naming the caller's user. */
export function userFromAuthorization(header: string | undefined): string | undefined {
  const m = /^Basic\s+(\S+)$/i.exec(header ?? '');
  if (!m) return undefined;
  const decoded = Buffer.from(m[1]!, 'base64').toString('utf8');
  const name = decoded.split(':')[0];
  return name || undefined;
}

/**
 * A path as envd resolves it for `user`: `~` and `~/…` are the user's home, relative paths are
 * under it; `~name` (another user's home) is refused, as envd refuses it.
 */
export function resolvePath(path: string, user: SandboxUser): string {
  if (!path) throw new ConnectError('invalid_argument', 'path is empty');
  if (path.startsWith('~')) {
    if (path.length > 1 && path[1] !== '/')
      throw new ConnectError(
        'invalid_argument',
        `cannot expand ${JSON.stringify(path)}: only ~ and ~/… (the calling user's home) are expanded`,
      );
    path = posix.join(user.home, path.slice(1));
  }
  return posix.normalize(path.startsWith('/') ? path : posix.join(user.home, path));
}

/**
 * The argv that runs `argv` as `user`: setpriv (util-linux) drops to the user's uid, gid and
 * supplementary groups. Root needs no wrapper. The environment of a login is set by the caller.
 */
export function asUser(user: SandboxUser, argv: string[]): string[] {
  if (user.uid === 0) return argv;
  return ['setpriv', `--reuid=${user.uid}`, `--regid=${user.gid}`, '--init-groups', '--', ...argv];
}

/** HOME, USER and LOGNAME as a login of `user` would have them. */
export function userEnv(user: SandboxUser): Record<string, string> {
  return { HOME: user.home, USER: user.name, LOGNAME: user.name };
}
