import type { CreateSandboxRequest, ForkRequest, ForkResult, SandboxInfo, SnapshotRequest, SnapshotResult } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import { CACHE_KEY_LABEL } from '../../image/builders/builder.js';
import type { ImageStore } from '../../image/image-store.js';
import type { LayerDigest } from '../../image/layer-store.js';
import type { ProjectImages } from '../project-images.js';
import type { ProjectQuotas } from '../project-quotas.js';
import type { SnapshotImages } from '../snapshot-images.js';
import type { StateStore } from '../state-store.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import { SYSTEM, type Caller } from './callers.js';
import type { NetworkService } from './network.js';
import type { SandboxLookup } from './sandbox-lookup.js';
import type { SandboxService } from './sandboxes.js';
import { FORK_AT_SEQ_LABEL, FORK_OF_LABEL } from './trajectories.js';

/** Snapshots (pack_diff → an image) and forks (one snapshot, many sandboxes; a VM's from its live state). */
export class SnapshotService {
  constructor(
    private readonly deps: {
      store: StateStore;
      images: ImageStore;
      lookup: SandboxLookup;
      sandboxes: SandboxService;
      network: NetworkService;
      quotas: ProjectQuotas;
      projectImages: ProjectImages;
      snapshotImages: SnapshotImages;
      trajectory: TrajectoryLog;
    },
  ) {}

  /**
   * pack_diff → an image (parent layers + the delta) that new sandboxes start from. A project's
   * key makes the image (and its name) that project's own; an admin key's snapshot (or a build
   * step's, made as SYSTEM) is shared. `signal`: the caller has gone; the edge stops the copy and
   * mkfs.erofs and keeps nothing.
   */
  async snapshot(caller: Caller, id: string, req: SnapshotRequest = {}, signal?: AbortSignal): Promise<SnapshotResult> {
    const privateTo = caller.admin ? undefined : caller.project;
    const s = await this.deps.lookup.settled(caller, await this.deps.lookup.get(caller, id));
    const nameOwner = req.name && privateTo !== undefined ? await this.deps.projectImages.checkName(privateTo, req.name, false) : undefined;
    if (s.status !== 'running' && s.status !== 'paused') {
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${s.status}: only running or paused sandboxes can be snapshotted`, {
        id,
      });
    }
    const snap = await this.deps.lookup.edgeOf(s).snapshotSandbox(id, {
      ...(req.scrub ? { scrub: req.scrub } : {}),
      ...(signal ? { signal } : {}),
    });
    const images = this.deps.images;
    const layers = (snap.layer ? [...snap.baseLayers, snap.layer] : snap.baseLayers) as LayerDigest[];
    // A snapshot is not a builder's output: it must not carry the builder's cache key.
    const { [CACHE_KEY_LABEL]: _key, ...labels } = snap.config.labels;
    const manifest = { layers, config: { ...snap.config, labels } };
    // An image that existed already (an unchanged sandbox's) keeps the lifetime it had.
    const existed = images.get(images.idOf(manifest)) !== undefined;
    const kept = Boolean(req.name) || req.keep === true || existed;
    // The edge gave the new layer to the replica it reads blobs from, which may be another one: with
    // the cluster's registry as the blob store that one put it there, and it is fetched from there.
    if (snap.layer) await images.layers.fetch(snap.layer as LayerDigest);
    const imageId = images.put(manifest);
    if (privateTo !== undefined) await this.deps.projectImages.claim(privateTo, imageId, existed);
    if (req.name) {
      images.tag(req.name, imageId);
      await this.deps.projectImages.recordName(req.name, nameOwner);
    }
    if (!kept) await this.deps.snapshotImages.own(imageId, id);
    return { imageId, layers, layerAdded: snap.layer !== null, frozenMs: Math.round(snap.frozenMs * 100) / 100, ...snap.stats, kept };
  }

  /**
   * One snapshot, then `count` sandboxes from it, created concurrently in the parent's project
   * (within its quotas: refused before the snapshot when the count cannot fit; paced to its
   * create rate). The snapshot is the caller's as for snapshot().
   */
  async fork(caller: Caller, id: string, req: ForkRequest): Promise<ForkResult> {
    const parent = await this.deps.lookup.get(caller, id);
    const project = parent.project ?? DEFAULT_PROJECT;
    const spec = (await this.deps.store.sandboxes.spec<CreateSandboxRequest>(id)) ?? { image: parent.imageId };
    await this.deps.quotas.precheck(project, this.deps.sandboxes.limitsFor(spec), req.count, true);
    if (parent.backend !== undefined && parent.backend !== 'container') return this.#forkVm(caller, parent, req, project);
    const snapshot = await this.snapshot(caller, id, {});
    const forkLabels = await this.#forkLabels(id);
    // Forks start with the policy in force now, not the one the parent was created with: a
    // parent switched to none for its rollout phase must not hand its forks the setup phase's.
    const network = await this.deps.network.currentPolicy(caller, id);
    const results = await Promise.allSettled(
      Array.from({ length: req.count }, () =>
        // Created as dsec itself in the parent's project, which the caller was just allowed to see.
        this.deps.sandboxes.create(
          SYSTEM,
          {
            ...spec,
            image: snapshot.imageId,
            layers: [],
            labels: { ...(spec.labels ?? {}), ...(req.labels ?? {}) },
            ...(network ? { network } : {}),
          },
          forkLabels,
          { project, pace: true },
        ),
      ),
    );
    return { snapshot, ...settled(results) };
  }

  /**
   * A live fork of a VM: its edge saves the VM's memory, devices and disk (the VM runs on), then
   * `count` VMs are restored from that state on the same edge (where it lives), each with its own
   * copy of the disk: processes, their memory and the guest's files continue in every fork.
   * `snapshot.imageId` is the parent's image (the state itself is not an image).
   */
  async #forkVm(caller: Caller, unsettled: SandboxInfo, req: ForkRequest, project: string): Promise<ForkResult> {
    const parent = await this.deps.lookup.settled(caller, unsettled);
    const id = parent.id;
    if (parent.status !== 'running' && parent.status !== 'paused') {
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${parent.status}: only running or paused VMs can be forked`, { id });
    }
    const snap = await this.deps.lookup.edgeOf(parent).snapshotSandbox(id, { memory: true });
    const forkLabels = await this.#forkLabels(id);
    const spec = (await this.deps.store.sandboxes.spec<CreateSandboxRequest>(id)) ?? { image: parent.imageId, backend: parent.backend };
    const network = await this.deps.network.currentPolicy(caller, id);
    const results = await Promise.allSettled(
      Array.from({ length: req.count }, () =>
        this.deps.sandboxes.create(
          SYSTEM,
          { ...spec, image: parent.imageId, labels: { ...(spec.labels ?? {}), ...(req.labels ?? {}) }, ...(network ? { network } : {}) },
          forkLabels,
          { restore: { edge: parent.edge, from: id }, project, pace: true },
        ),
      ),
    );
    const snapshot = {
      imageId: parent.imageId,
      layers: snap.baseLayers,
      layerAdded: false,
      frozenMs: Math.round(snap.frozenMs * 100) / 100,
      ...snap.stats,
      kept: true,
    };
    return { snapshot, ...settled(results) };
  }

  /**
   * What every fork of `parent` carries: its parent, and the parent's last logged step once the
   * snapshot is taken, where the fork's own steps continue (its lineage: GET …/trajectory?lineage=true).
   * Read after the snapshot: a step that finished before it is in both the snapshot and the count.
   * A step still running during the snapshot is left out of the fork's lineage (its entry is
   * written when it ends, past the count); a trainer that forks mid-command races itself anyway.
   */
  async #forkLabels(parent: string): Promise<Record<string, string>> {
    return { [FORK_OF_LABEL]: parent, [FORK_AT_SEQ_LABEL]: String(await this.deps.trajectory.lastSeq(parent)) };
  }
}

function settled(results: PromiseSettledResult<SandboxInfo>[]): Pick<ForkResult, 'sandboxes' | 'failures'> {
  const sandboxes: SandboxInfo[] = [];
  const failures: ForkResult['failures'] = [];
  for (const r of results) {
    if (r.status === 'fulfilled') sandboxes.push(r.value);
    else failures.push({ code: r.reason instanceof ApiError ? r.reason.code : 'INTERNAL', message: (r.reason as Error).message });
  }
  return { sandboxes, failures };
}
