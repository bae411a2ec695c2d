import { Sandbox } from '@dsec/sdk';
import type { SandboxLimits } from '../../edge/edge-api.js';
import { CGROUP_PARENT } from '../../host/cgroups.js';
import type { CgroupScope } from '../cgroup-memory.js';
import type { Peer } from './peer.js';

/** dsec as a trainer uses it: the SDK over HTTP to the control plane, which drives the edge. */
export class DsecApiPeer implements Peer {
  readonly name = 'dsec' as const;
  readonly description = 'dsec HTTP API through the SDK: Sandbox.create / commands.run / kill (control plane + SQLite + edge + crun)';
  readonly execDescription =
    'POST /v1/sandboxes/:id/exec {cmd:["true"]} through the SDK (control plane + edge: process spec file + crun exec)';
  readonly cgroupScope: CgroupScope;
  readonly #live = new Map<string, Sandbox>();

  constructor(
    private readonly conn: { url: string; apiKey: string },
    private readonly image: string,
    private readonly limits: SandboxLimits,
    private readonly labels: Record<string, string>,
    readonly version: string,
    sandboxPrefix: string,
  ) {
    this.cgroupScope = { parent: CGROUP_PARENT, prefix: sandboxPrefix };
  }

  async create(): Promise<string> {
    const sb = await Sandbox.create({ ...this.conn, image: this.image, resources: { ...this.limits }, labels: this.labels });
    this.#live.set(sb.id, sb);
    return sb.id;
  }

  async exec(id: string): Promise<void> {
    const r = await this.#sandbox(id).commands.run(['true']);
    if (r.exitCode !== 0) throw new Error(`exec true in ${id} exited ${r.exitCode}: ${r.stderr.trim()}`);
  }

  async remove(id: string): Promise<void> {
    await this.#sandbox(id).kill();
    this.#live.delete(id);
  }

  async close(): Promise<void> {
    await Promise.allSettled([...this.#live.keys()].map((id) => this.remove(id)));
  }

  #sandbox(id: string): Sandbox {
    const sb = this.#live.get(id);
    if (!sb) throw new Error(`no sandbox ${id} made by this benchmark`);
    return sb;
  }
}
