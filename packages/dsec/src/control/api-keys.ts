import * as crypto from 'node:crypto';
import { createHash, randomBytes } from 'node:crypto';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { StateStore } from './state-store.js';
import type { ActiveKey } from './store/api-keys.js';
import { thenOrNow, type MaybePromise } from '../maybe-promise.js';

import type { Caller } from '../http/access.js';

/** Who is calling: the key, its project, and whether it is an admin key (docs/PROJECTS.md). */
export type { Caller };

/** What a new key is for: its project (default `default`) and whether it is an admin key. */
export interface KeyScope {
  project?: string;
  admin?: boolean;
}

/**
 * API keys are 32 random bytes (base64url), so a plain sha256 is a safe stored form: there is
 * nothing to brute-force. The key itself is shown once, when created, and never stored.
 */
export function hashKey(key: string): string {
  return oneShotHash ? oneShotHash('sha256', key, 'hex') : createHash('sha256').update(key).digest('hex');
}

/**
 * crypto.hash (Node ≥ 20.12; engines allow any 20): the same digest as createHash().update()
 * .digest('hex') without a Hash object. Every request hashes its key, and createHash was ~2 % of
 * the control plane's CPU under `dsec bench cluster`'s single creates (perf), ~3× crypto.hash's.
 */
const oneShotHash = (crypto as Partial<Pick<typeof crypto, 'hash'>>).hash;

export async function createApiKey(
  store: Pick<StateStore, 'keys'>,
  name: string,
  scope: KeyScope = {},
): Promise<{ id: string; key: string }> {
  const id = `key_${randomBytes(6).toString('hex')}`;
  const key = `dsec_${randomBytes(32).toString('base64url')}`;
  await store.keys.insert(id, hashKey(key), name, scope.project ?? DEFAULT_PROJECT, scope.admin ?? false);
  return { id, key };
}

/**
 * A key in E2B's shape (`e2b_` + 40 hex digits, as some E2B SDK versions check), stored like any
 * other. `mintedBy`: the key whose caller asked for it; revoking that key revokes this one.
 */
export async function createE2bApiKey(
  store: Pick<StateStore, 'keys'>,
  name: string,
  scope: KeyScope = {},
  mintedBy?: string,
): Promise<{ id: string; key: string }> {
  const id = `key_${randomBytes(6).toString('hex')}`;
  const key = `e2b_${randomBytes(20).toString('hex')}`;
  await store.keys.insert(id, hashKey(key), name, scope.project ?? DEFAULT_PROJECT, scope.admin ?? false, mintedBy);
  return { id, key };
}

/** The caller when the key is a known key that is not revoked: at once when the key is kept in memory (store/read-cache.ts). */
export function authenticate(store: Pick<StateStore, 'keys'>, key: string | undefined): MaybePromise<Caller | undefined> {
  if (!key) return undefined;
  return thenOrNow(store.keys.byHash(hashKey(key)), callerOf);
}

function callerOf(k: ActiveKey | undefined): Caller | undefined {
  return k && { keyId: k.id, project: k.project, admin: k.admin };
}
