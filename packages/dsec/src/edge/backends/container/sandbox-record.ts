import { mkdirSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { SandboxLimits } from '../../protocol/edge-api.js';
import type { Link } from '../../../net/address-pool.js';
import type { NetworkPolicy } from '../../../net/policy.js';
import type { UidRange } from '../../../host/uid-ranges.js';

/**
 * A sandbox as the edge remembers it on disk (`node/sandboxes/<id>/state.json`), so a restarted
 * edge knows which layers each sandbox holds and can adopt or clean it up.
 */
export interface SandboxRecord {
  id: string;
  phase: 'creating' | 'running';
  layers: LayerDigest[];
  config: ImageConfig;
  env: Record<string, string>;
  limits: SandboxLimits;
  createdAt: string;
  pid?: number;
  /** Egress policy and, unless it is none, the sandbox's link to the host. */
  network?: { policy: NetworkPolicy; link?: Link };
  /** Volumes of the node it mounts (a volume's delete is refused while any record names it). */
  volumes?: { name: string; path: string; readOnly: boolean }[];
  /** Frozen by pause (the freezer keeps it so across an edge restart too). */
  paused?: boolean;
  /** Runs in a user namespace as this host uid range (edge option `userns`). */
  userns?: UidRange;
}

/** The files of one sandbox: its bundle (config.json), overlay dirs and state. */
export class SandboxPaths {
  /** `withDisk`: the upper and work dirs live on the sandbox's own size-limited filesystem. */
  constructor(
    readonly dir: string,
    readonly withDisk = false,
  ) {}
  get disk(): string {
    return join(this.dir, 'disk');
  }
  get state(): string {
    return join(this.dir, 'state.json');
  }
  /**
   * Present while the edge holds a running sandbox frozen for its own work: a move
   * (container-quiesce.ts) or a snapshot's copy (container-snapshot.ts). An edge that restarts
   * meanwhile thaws it at adoption: a move its control plane could not finish left the sandbox
   * here, to run on (one that finished removed it, marker and all), and a snapshot in flight died
   * with the edge. A pause by its user is not marked and stays a pause. (The file keeps the name
   * it had when only moves made it, so an edge upgraded mid-move still finds it.)
   */
  get held(): string {
    return join(this.dir, 'quiesced');
  }
  get config(): string {
    return join(this.dir, 'config.json');
  }
  get rootfs(): string {
    return join(this.dir, 'rootfs');
  }
  get upper(): string {
    return join(this.withDisk ? this.disk : this.dir, 'upper');
  }
  get work(): string {
    return join(this.withDisk ? this.disk : this.dir, 'work');
  }
  get crunLog(): string {
    return join(this.dir, 'crun.log');
  }
  get pidFile(): string {
    return join(this.dir, 'init.pid');
  }
  get scratch(): string {
    return join(this.dir, 'run');
  }
  /**
   * The seccomp program crun loaded for the sandbox (raw BPF, as in its config's annotation):
   * the edge's command starter loads the same one into each command (exec/enter-child.ts).
   */
  get seccompBpf(): string {
    return join(this.dir, 'seccomp.bpf');
  }
  /** The sandbox's user namespace, bound here from dsec-idmap until crun has joined it. */
  get userns(): string {
    return join(this.dir, 'userns');
  }
  /** Where volume `i` is mounted id-mapped for crun to bind (user-namespaced sandboxes). */
  volume(i: number): string {
    return join(this.dir, 'volumes', String(i));
  }
}

export class SandboxRecords {
  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true });
  }

  paths(id: string, record?: SandboxRecord): SandboxPaths {
    return new SandboxPaths(join(this.dir, id), record?.limits.diskMiB !== undefined);
  }

  save(record: SandboxRecord): void {
    writeFileAtomic(this.paths(record.id).state, JSON.stringify(record));
  }

  load(id: string): SandboxRecord | undefined {
    try {
      return JSON.parse(readFileSync(this.paths(id).state, 'utf8')) as SandboxRecord;
    } catch {
      return undefined;
    }
  }

  /** Every sandbox directory, with its record when one was written. */
  scan(): { id: string; record: SandboxRecord | undefined }[] {
    return readdirSync(this.dir).map((id) => ({ id, record: this.load(id) }));
  }
}
