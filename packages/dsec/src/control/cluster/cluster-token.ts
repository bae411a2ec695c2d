import { randomBytes } from 'node:crypto';
import { chmodSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The cluster's shared secret: edges present it when they join and on every heartbeat, and the
 * control plane presents it on every call to an edge. It is not an API key: it opens the edge
 * protocol and the blob endpoint, nothing of the public API's sandboxes.
 */
export function loadOrCreateClusterToken(dataDir: string): string {
  const file = join(dataDir, 'cluster-token');
  try {
    const t = readFileSync(file, 'utf8').trim();
    if (t) return t;
  } catch {
    // first start
  }
  const token = `dsecjoin_${randomBytes(32).toString('base64url')}`;
  writeFileSync(file, token + '\n', { mode: 0o600 });
  chmodSync(file, 0o600);
  return token;
}
