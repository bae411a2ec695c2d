import { readFileSync } from 'node:fs';
import { credentialsFromEnv } from './registry-auth.js';
import { RegistryClient, type RegistryClientOptions } from './registry-client.js';
import type { RegistryRef } from './registry-ref.js';

export interface RegistryClientForOptions extends Omit<RegistryClientOptions, 'credentials'> {
  /**
   * The one registry (its base URL, `scheme://host[:port]`) the environment's credentials may go
   * to; a reference to any other host, or to the same host over another scheme, gets a client
   * without them. Undefined: the reference's own registry (a shell's `dsec image push|pull`, where
   * whoever holds the credentials names the registry). Null: none (a control plane without a
   * cluster registry).
   */
  credentialsFor?: string | null;
}

/** A client for the reference's repository, with the credentials of the environment (DSEC_REGISTRY_USER, DSEC_REGISTRY_PASSWORD[_FILE]). */
export function registryClientFor(
  ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>,
  opts: RegistryClientForOptions = {},
  env = process.env,
): RegistryClient {
  const { credentialsFor, ...rest } = opts;
  const mayHave = credentialsFor === undefined || (credentialsFor !== null && sameOrigin(ref.baseUrl, credentialsFor));
  return new RegistryClient(ref, { ...rest, credentials: mayHave ? credentialsFromEnv(env, (p) => readFileSync(p, 'utf8')) : undefined });
}

/** Whether two base URLs are one origin (scheme, host, port; host names are case-insensitive). */
export function sameOrigin(a: string, b: string): boolean {
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}
