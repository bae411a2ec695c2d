import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { Caller } from '../../http/access.js';

export type { Caller };

/**
 * The caller of work dsec does on its own behalf: batch drivers, warm pools, expiry sweeps, a
 * build's owned sandboxes, forks and replays of a sandbox the caller was already allowed to see.
 * It sees every project, like an admin key; nothing a request sends can become it.
 */
export const SYSTEM: Caller = Object.freeze({ keyId: 'dsec-system', project: DEFAULT_PROJECT, admin: true });

/**
 * The caller of an E2B sandbox-side request, which carries the sandbox's access token rather than
 * a key: it acts in that sandbox's project and no other.
 */
export function sandboxTokenCaller(sandbox: { id: string; project?: string | undefined }): Caller {
  return { keyId: `sandbox-token:${sandbox.id}`, project: sandbox.project ?? DEFAULT_PROJECT, admin: false };
}

/**
 * The caller of a request through a signed port link: the link's project, as it was when a key of
 * it made the link (a sandbox that changed project since opens nothing through it).
 */
export function portLinkCaller(claims: { sandbox: string; project: string }): Caller {
  return { keyId: `port-link:${claims.sandbox}`, project: claims.project, admin: false };
}

/** Whether `caller` may see what belongs to `project` (an admin key sees every project). */
export function sees(caller: Caller, project: string | undefined): boolean {
  return caller.admin || (project ?? DEFAULT_PROJECT) === caller.project;
}
