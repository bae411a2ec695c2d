import { createHash, randomBytes } from 'node:crypto';
import type { StateStore } from './state-store.js';

/**
 * API keys are 32 random bytes (base64url), so a plain sha256 is a safe stored form: there is
 * nothing to brute-force. The key itself is shown once, when created, and never stored.
 */
export function hashKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

export async function createApiKey(store: StateStore, name: string): Promise<{ id: string; key: string }> {
  const id = `key_${randomBytes(6).toString('hex')}`;
  const key = `dsec_${randomBytes(32).toString('base64url')}`;
  await store.insertKey(id, hashKey(key), name);
  return { id, key };
}

/** A key in E2B's shape (`e2b_` + 40 hex digits, as some E2B SDK versions check), stored like any other. */
export async function createE2bApiKey(store: StateStore, name: string): Promise<{ id: string; key: string }> {
  const id = `key_${randomBytes(6).toString('hex')}`;
  const key = `e2b_${randomBytes(20).toString('hex')}`;
  await store.insertKey(id, hashKey(key), name);
  return { id, key };
}

/** Returns the key's id when the bearer token is a known key. */
export async function authenticate(store: StateStore, authorization: string | undefined): Promise<string | undefined> {
  const m = /^Bearer\s+(\S+)$/i.exec(authorization ?? '');
  if (!m) return undefined;
  return (await store.keyByHash(hashKey(m[1]!)))?.id;
}
