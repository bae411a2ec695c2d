import { randomBytes } from 'node:crypto';
import { renameSync, writeFileSync } from 'node:fs';

/** Writes a file so readers see the old or the new content, never a half-written one. */
export function writeFileAtomic(path: string, data: string | Uint8Array, mode = 0o644): void {
  const tmp = `${path}.tmp-${randomBytes(4).toString('hex')}`;
  writeFileSync(tmp, data, { mode });
  renameSync(tmp, path);
}
