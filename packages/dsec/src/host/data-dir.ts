import { chmodSync, mkdirSync } from 'node:fs';

/**
 * Makes the data dir and keeps its listing root's (0711, as doctor's tmpfs for it): host users
 * may pass through it (a user-namespaced sandbox's root is such a user when its crun reaches the
 * sandbox's tree below) but not list it. What must stay secret has a mode of its own: the state
 * store 0600 (the cluster token, E2B access tokens, trajectories), client.json and cluster-token
 * 0600, the node's dirs 0700.
 */
export function confineDataDir(dataDir: string): void {
  mkdirSync(dataDir, { recursive: true });
  chmodSync(dataDir, 0o711);
}
