import { readFileSync } from 'node:fs';
import { credentialsFromEnv } from './registry-auth.js';
import { RegistryClient, type RegistryClientOptions } from './registry-client.js';
import type { RegistryRef } from './registry-ref.js';

/** A client for the reference's repository, with the credentials of the environment (DSEC_REGISTRY_USER, DSEC_REGISTRY_PASSWORD[_FILE]). */
export function registryClientFor(ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>, opts: Omit<RegistryClientOptions, 'credentials'> = {}, env = process.env): RegistryClient {
  return new RegistryClient(ref, { ...opts, credentials: credentialsFromEnv(env, (p) => readFileSync(p, 'utf8')) });
}
