import type { Logger } from 'pino';
import type { CreateSandboxRequest, CreateVolumeRequest, VolumeInfo } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeCreateRequest } from '../../edge/protocol/edge-api.js';
import { volumeMountsError } from '../../edge/protocol/volume-paths.js';
import type { Caller } from '../api-keys.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import type { MaybePromise } from '../../maybe-promise.js';
import type { StateStore, StoredVolume } from '../state-store.js';

/** The volumes of a create request, resolved: the one edge that holds them all, and the mounts to ask it for. */
export interface ResolvedVolumes {
  edge?: string;
  mounts: NonNullable<EdgeCreateRequest['volumes']>;
}

/**
 * Named volumes: persistent directories with a lifecycle of their own, owned by a project (only its
 * keys see them, only its sandboxes mount them; an admin key sees all), kept on one edge's disk
 * (`DATA/node/volumes/<name>`), mounted into sandboxes at create. The store keeps which edge holds
 * each (placement pins a sandbox that mounts it there) and which sandboxes mount it (a delete is
 * refused while any of them may still hold it).
 */
export class Volumes {
  constructor(private readonly deps: { store: Pick<StateStore, 'volumes'>; edges: EdgeRegistry; log: Logger }) {}

  /** A volume of `caller`'s project (names are unique across projects). */
  async create(req: CreateVolumeRequest, caller: Caller): Promise<VolumeInfo> {
    const edge = req.edge ?? this.#pickEdge();
    if (req.edge !== undefined) {
      const c = this.deps.edges.candidates().find((e) => e.id === req.edge);
      if (!c) throw new ApiError('EDGE_NOT_FOUND', `no edge ${req.edge} (dsec nodes lists them)`, { edge: req.edge });
      if (c.state !== 'ready')
        throw new ApiError('EDGE_UNAVAILABLE', `edge ${req.edge} is ${c.state}: a volume can be made only on a ready edge`, {
          edge: req.edge,
        });
    }
    const v: StoredVolume = {
      name: req.name,
      project: caller.project,
      edge,
      labels: req.labels ?? {},
      createdAt: new Date().toISOString(),
    };
    // The row first: of two creates of one name, the second stops here.
    if (!(await this.deps.store.volumes.insert(v))) throw this.#exists(req.name);
    try {
      await this.deps.edges.api(edge).createVolume(req.name);
    } catch (err) {
      await this.deps.store.volumes.delete(req.name);
      throw err;
    }
    return { ...v, mountedBy: [] };
  }

  /** The caller's project's volumes (every project's for an admin key). */
  async list(caller: Caller): Promise<VolumeInfo[]> {
    const out: VolumeInfo[] = [];
    for (const v of await this.deps.store.volumes.list()) {
      if (caller.admin || v.project === caller.project) out.push({ ...v, mountedBy: await this.deps.store.volumes.users(v.name) });
    }
    return out;
  }

  /** One volume, with the apparent size of its files as its edge measures it now. */
  async get(name: string, caller: Caller): Promise<VolumeInfo> {
    const v = await this.#stored(name, caller.admin ? undefined : caller.project);
    const info: VolumeInfo = { ...v, mountedBy: await this.deps.store.volumes.users(name) };
    try {
      info.bytes = (await this.deps.edges.api(v.edge).volumeUsage(name)).bytes;
    } catch (err) {
      this.deps.log.warn({ volume: name, edge: v.edge, err: (err as Error).message }, 'volume size not measured');
    }
    return info;
  }

  /** Deletes a volume and its files; refused (VOLUME_IN_USE) while a sandbox mounts it. */
  async delete(name: string, caller: Caller): Promise<void> {
    const v = await this.#stored(name, caller.admin ? undefined : caller.project);
    const users = await this.deps.store.volumes.users(name);
    if (users.length) {
      throw new ApiError(
        'VOLUME_IN_USE',
        `volume ${name} is mounted by ${users.length} sandbox(es) (${users.slice(0, 5).join(', ')}${users.length > 5 ? ', …' : ''}): kill them first`,
        {
          name,
          sandboxes: users,
        },
      );
    }
    try {
      await this.deps.edges.api(v.edge).deleteVolume(name);
    } catch (err) {
      // Gone from the edge already (its node was rebuilt): the record goes too.
      if (!(err instanceof ApiError && err.code === 'VOLUME_NOT_FOUND')) throw err;
    }
    await this.deps.store.volumes.delete(name);
  }

  /**
   * The volumes a create asks for: each must exist, all on one edge (the sandbox runs there), at
   * paths the sandbox can take. Containers only.
   */
  resolve(req: CreateSandboxRequest, project: string): MaybePromise<ResolvedVolumes> {
    // Most creates mount none: answered at once, no promise.
    if (!req.volumes?.length) return { mounts: [] };
    return this.#resolve(req, req.volumes, project);
  }

  async #resolve(req: CreateSandboxRequest, list: NonNullable<CreateSandboxRequest['volumes']>, project: string): Promise<ResolvedVolumes> {
    checkVolumeMounts(req);
    let holder: StoredVolume | undefined;
    for (const m of list) {
      const v = await this.#stored(m.name, project);
      if (holder && v.edge !== holder.edge) {
        throw new ApiError(
          'INVALID_REQUEST',
          `volumes ${holder.name} (edge ${holder.edge}) and ${v.name} (edge ${v.edge}) live on different edges: a sandbox mounts volumes of one edge only`,
          {
            field: 'volumes',
          },
        );
      }
      holder ??= v;
    }
    return { edge: holder!.edge, mounts: list.map((m) => ({ name: m.name, path: m.path, readOnly: m.readOnly ?? false })) };
  }

  /** The volume, if it exists and (with `project`) belongs to that project: another project's is not found. */
  async #stored(name: string, project?: string): Promise<StoredVolume> {
    const found = await this.deps.store.volumes.get(name);
    const v = found && (project === undefined || found.project === project) ? found : undefined;
    if (!v)
      throw new ApiError('VOLUME_NOT_FOUND', `no volume ${name}; create it with \`dsec volume create ${name}\` (POST /v1/volumes)`, {
        name,
      });
    return v;
  }

  #exists(name: string): ApiError {
    return new ApiError('VOLUME_EXISTS', `a volume named ${name} exists already (delete it first, or pick another name)`, { name });
  }

  /** The ready edge with the most free sandbox slots. */
  #pickEdge(): string {
    const ready = this.deps.edges.candidates().filter((c) => c.state === 'ready');
    if (ready.length === 0) throw new ApiError('CAPACITY_EXCEEDED', 'no ready edge to keep the volume on');
    ready.sort((a, b) => b.info.maxSandboxes - b.info.sandboxes - (a.info.maxSandboxes - a.info.sandboxes));
    return ready[0]!.id;
  }
}

/** The syntax of a create's volume mounts (paths, duplicates, backend): a 400 before anything is looked up. */
export function checkVolumeMounts(req: CreateSandboxRequest): void {
  if (!req.volumes?.length) return;
  if (req.backend && req.backend !== 'container') {
    throw new ApiError('BACKEND_UNSUPPORTED', `volumes are not available for ${req.backend} sandboxes; use a container sandbox for them`, {
      backend: req.backend,
    });
  }
  const bad = volumeMountsError(req.volumes);
  if (bad) throw new ApiError('INVALID_REQUEST', bad, { field: 'volumes' });
}
