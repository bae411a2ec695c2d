import { Sandbox } from '@dsec/sdk';
import type { SandboxLimits } from 'dsec/container';
import { CGROUP_PARENT } from 'dsec/host';
import type { CgroupScope } from '../cgroup-memory.js';
import type { Peer, SnapshotOps } from './peer.js';

/** dsec as a trainer uses it: the SDK over HTTP to the control plane, which drives the edge. */
export class DsecApiPeer implements Peer {
  readonly name = 'dsec' as const;
  readonly description = 'dsec HTTP API through the SDK: Sandbox.create / commands.run / kill (control plane + SQLite + edge + crun)';
  readonly execDescription =
    'POST /v1/sandboxes/:id/exec {cmd:["true"]} through the SDK (control plane + edge: the enter request of dsec-spawn)';
  readonly pauseDescription = 'POST /v1/sandboxes/:id/pause and /resume through the SDK (control plane + edge: crun pause/resume)';
  readonly cgroupScope: CgroupScope;
  readonly snapshots: { ops: SnapshotOps };
  readonly #live = new Map<string, Sandbox>();

  constructor(
    /** The server's URL and key (the hardening benchmark makes its own sandboxes through them). */
    readonly conn: { url: string; apiKey: string },
    private readonly image: string,
    private readonly limits: SandboxLimits,
    private readonly labels: Record<string, string>,
    readonly version: string,
    sandboxPrefix: string,
  ) {
    this.cgroupScope = { parent: CGROUP_PARENT, prefix: sandboxPrefix };
    this.snapshots = {
      ops: {
        description:
          'sandbox.snapshot() (freeze + pack_diff into an EROFS layer) / Sandbox.create({ image: snapshot }) / sandbox.fork(N) (one snapshot + N creates)',
        snapshot: async (id) => (await this.#sandbox(id).snapshot()).imageId,
        createFrom: (image) => this.#create(image),
        fork: async (id, count) => {
          const { sandboxes, result } = await this.#sandbox(id).fork(count, { labels: this.labels });
          for (const sb of sandboxes) this.#live.set(sb.id, sb);
          if (result.failures.length) throw new Error(`fork: ${result.failures.length} of ${count} failed: ${result.failures[0]?.message}`);
          return { ids: sandboxes.map((s) => s.id), image: result.snapshot.imageId };
        },
        // Snapshot images stay in the run's data dir, which is removed with it.
        removeImage: async () => undefined,
      },
    };
  }

  create(): Promise<string> {
    return this.#create(this.image);
  }

  async #create(image: string): Promise<string> {
    const sb = await Sandbox.create({ ...this.conn, image, resources: { ...this.limits }, labels: this.labels });
    this.#live.set(sb.id, sb);
    return sb.id;
  }

  async exec(id: string, cmd: string[] = ['true']): Promise<string> {
    const r = await this.#sandbox(id).commands.run(cmd);
    if (r.exitCode !== 0) throw new Error(`exec ${cmd.join(' ')} in ${id} exited ${r.exitCode}: ${r.stderr.trim()}`);
    return r.stdout;
  }

  async pause(id: string): Promise<void> {
    await this.#sandbox(id).pause();
  }

  async resume(id: string): Promise<void> {
    await this.#sandbox(id).resume();
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
