import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { ApiError } from '../../api-error.js';
import { removeTree } from '../../host/remove-tree.js';
import { runTool } from '../../host/run-tool.js';

const NAME = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/**
 * A node's named volumes: `DATA/node/volumes/<name>/data`, plain directories on the node's disk
 * that outlive the sandboxes mounting them (bind mounts in each sandbox's OCI config, nosuid and
 * nodev, read-only or read-write). The control plane keeps which edge holds which volume and
 * places sandboxes accordingly; the edge refuses to delete one a sandbox of its mounts.
 */
export class NodeVolumes {
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  }

  /** The directory a sandbox sees at its mount point. */
  dataDir(name: string): string {
    return join(this.dir, name, 'data');
  }

  has(name: string): boolean {
    return NAME.test(name) && existsSync(this.dataDir(name));
  }

  create(name: string): void {
    if (!NAME.test(name)) throw new ApiError('INVALID_REQUEST', `bad volume name ${JSON.stringify(name)}`, { field: 'name' });
    if (this.has(name)) throw new ApiError('VOLUME_EXISTS', `volume ${name} already exists on this edge`, { name });
    mkdirSync(join(this.dir, name), { mode: 0o700 });
    mkdirSync(this.dataDir(name), { mode: 0o755 });
  }

  async remove(name: string): Promise<void> {
    if (!this.has(name)) throw new ApiError('VOLUME_NOT_FOUND', `no volume ${name} on this edge`, { name });
    // The tree a sandbox wrote: removed without following any link in it.
    await removeTree(join(this.dir, name));
  }

  /** Apparent size of its files (du -sb, one file system, links not followed). */
  async bytes(name: string): Promise<number> {
    if (!this.has(name)) throw new ApiError('VOLUME_NOT_FOUND', `no volume ${name} on this edge`, { name });
    const r = await runTool('du', ['-s', '-b', '-x', '-P', this.dataDir(name)]);
    return Number.parseInt(r.stdout, 10) || 0;
  }
}
