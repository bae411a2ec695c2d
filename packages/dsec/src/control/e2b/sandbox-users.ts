import { posix } from 'node:path';
import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import { ConnectError } from './connect-protocol.js';

/** E2B's default user: the base template has it, and the SDK sends no user when none is given. */
export const DEFAULT_USER = 'user';

export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

const ROOT: SandboxUser = { name: 'root', uid: 0, gid: 0, home: '/root' };

/**
 * The sandbox's users, read from its own /etc/passwd (through the control plane's confined file
 * read) and kept per sandbox: a template decides who exists, dsec does not assume.
 */
export class SandboxUsers {
  readonly #cache = new Map<string, Map<string, SandboxUser>>();
  readonly #names = new Map<string, { users: Map<number, string>; groups: Map<number, string> }>();

  constructor(private readonly control: ControlPlane) {}

  async #passwd(side: SandboxSide): Promise<Map<string, SandboxUser>> {
    const { sandboxId, caller } = side;
    let users = this.#cache.get(sandboxId);
    if (users) return users;
    users = new Map([['root', ROOT]]);
    try {
      const text = (await this.control.files.readFile(caller, sandboxId, '/etc/passwd', 1 << 20)).toString('utf8');
      for (const line of text.split('\n')) {
        const [name, , uid, gid, , home] = line.split(':');
        if (!name || uid === undefined || gid === undefined || !/^\d+$/.test(uid) || !/^\d+$/.test(gid)) continue;
        users.set(name, { name, uid: Number(uid), gid: Number(gid), home: home || '/' });
      }
    } catch {
      // an image without /etc/passwd (a bare busybox) has root only
    }
    if (this.#cache.size > 10_000) this.#cache.clear();
    this.#cache.set(sandboxId, users);
    return users;
  }

  /**
   * The user a call runs as: the one named by `Authorization: Basic base64(name:)`, else E2B's
   * default user when the image has it, else root.
   */
  async resolve(side: SandboxSide, requested: string | undefined): Promise<SandboxUser> {
    let users = await this.#passwd(side);
    if (requested && !users.has(requested)) {
      // a user added inside the sandbox since we last read /etc/passwd
      this.forget(side.sandboxId);
      users = await this.#passwd(side);
    }
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

  /** uid → user name and gid → group name, for the owner and group of a file. */
  async names(side: SandboxSide): Promise<{ users: Map<number, string>; groups: Map<number, string> }> {
    const { sandboxId, caller } = side;
    const cached = this.#names.get(sandboxId);
    if (cached) return cached;
    const users = new Map<number, string>();
    for (const u of (await this.#passwd(side)).values()) if (!users.has(u.uid)) users.set(u.uid, u.name);
    const groups = new Map<number, string>([[0, 'root']]);
    try {
      const text = (await this.control.files.readFile(caller, sandboxId, '/etc/group', 1 << 20)).toString('utf8');
      for (const line of text.split('\n')) {
        const [name, , gid] = line.split(':');
        if (name && gid && /^\d+$/.test(gid)) groups.set(Number(gid), name);
      }
    } catch {
      // no /etc/group: numbers only
    }
    const out = { users, groups };
    if (this.#names.size > 10_000) this.#names.clear();
    this.#names.set(sandboxId, out);
    return out;
  }

  forget(sandboxId: string): void {
    this.#cache.delete(sandboxId);
    this.#names.delete(sandboxId);
  }

  /** Sandboxes this cache holds users for. */
  sandboxes(): string[] {
    return [...new Set([...this.#cache.keys(), ...this.#names.keys()])];
  }
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
