import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { HostNotReadyError } from '../host/host-not-ready.js';
import { isProcessAlive } from '../host/process-tree.js';

export { HostNotReadyError };

/**
 * One process of a kind per data dir (`file` names the kind: dsec.pid for `dsec up`/`control`,
 * dsec-edge.pid for `dsec edge`): two on one data dir would fight over mounts and crun state.
 * Returns the release.
 */
export function takePidLock(dataDir: string, file: string, what: string): () => void {
  const path = join(dataDir, file);
  if (existsSync(path)) {
    const pid = Number(readFileSync(path, 'utf8'));
    if (pid !== process.pid && isProcessAlive(pid))
      throw new HostNotReadyError(`${what} (pid ${pid}) already runs on ${dataDir}; stop it first or use another --data-dir`);
  }
  writeFileSync(path, String(process.pid));
  return () => rmSync(path, { force: true });
}
