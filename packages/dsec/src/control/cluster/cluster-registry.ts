import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { ApiError } from '../../api-error.js';
import type { BlobSource } from '../../image/blob-source.js';
import type { ImageId, ImageManifest, ImagePublisher } from '../../image/image-store.js';
import { sha256File, type LayerDigest, type LayerStore } from '../../image/layer-store.js';
import { configBlob, dsecManifest, OCI_MANIFEST_MEDIA_TYPE, sha256Digest } from '../../image/registry/dsec-artifact.js';
import type { RegistryCredentials } from '../../image/registry/registry-auth.js';
import { RegistryClient, RegistryError } from '../../image/registry/registry-client.js';
import type { RegistryRef } from '../../image/registry/registry-ref.js';
import type { StateStore } from '../state-store.js';

/** What an edge is told at join: where the cluster's registry is and the account to read it with. */
export interface EdgeRegistryGrant {
  /** HOST/REPOSITORY (or https://HOST/REPOSITORY), as `dsec edge --registry` takes it. */
  repository: string;
  username?: string;
  password?: string;
}

/** A blob the control plane stored in the registry (migration 8), which image GC may delete there. */
export interface StoredBlob {
  digest: LayerDigest;
  sizeBytes: number;
  storedAt: number;
}

/** The registry refused to delete a blob: its deletes are disabled. */
export class RegistryKeepsBlobsError extends Error {
  override readonly name = 'RegistryKeepsBlobsError';
}

/** The tag an image's OCI artifact has in the cluster's repository: its id, as a tag may spell it. */
export function imageTag(id: ImageId): string {
  return `sha256-${id.slice('sha256:'.length)}`;
}

/**
 * The cluster's OCI registry (`dsec control --registry HOST/REPOSITORY`, DSEC_REGISTRY): the
 * control plane's blob store, and the layer blobs edges read.
 *
 * - As the blob store (LayerStore.remote): an image goes into the image records only once its
 *   layers, and the image itself as a dsec OCI artifact tagged `sha256-<id>`, are in the registry
 *   (publish), so a replica on another machine, sharing no directory, can serve every image any
 *   replica made: it fetches a blob it lacks into its layer directory, which is only a cache.
 *   Each blob stored is recorded in the state store, because a registry cannot list its blobs:
 *   image GC deletes there the recorded blobs nothing refers to (DELETE needs the registry's
 *   deletes enabled: distribution's `storage.delete.enabled`; without it the blobs stay and GC
 *   says so in the log).
 * - For edges: they get its address and account when they join (no `--registry` on each node),
 *   and every layer a create needs is in it before the edge is asked (ensure: HEAD, then an
 *   upload of what it lacks; each blob once per process, concurrent creates sharing one upload).
 *   A registry that cannot take a blob does not fail the create: the edge falls back to the
 *   control plane's blob endpoint for it, as it does for any blob the registry lacks.
 */
export class ClusterRegistry implements BlobSource, ImagePublisher {
  readonly client: RegistryClient;
  /** Blobs known to be in the registry and recorded, with their sizes. */
  readonly #present = new Map<string, number>();
  readonly #uploading = new Map<string, Promise<number>>();
  #deletesRefused = false;

  constructor(
    readonly repository: string,
    ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>,
    private readonly credentials: RegistryCredentials | undefined,
    private readonly layers: LayerStore,
    private readonly store: StateStore,
    private readonly log: Logger,
  ) {
    this.client = new RegistryClient(ref, { credentials, attempts: 3, onRetry: (why) => log.warn(`registry: retrying: ${why}`) });
  }

  /** The grant a joining edge gets (the account is sent over the join, under the cluster token). */
  forEdges(): EdgeRegistryGrant {
    return {
      repository: this.repository,
      ...(this.credentials ? { username: this.credentials.username, password: this.credentials.password } : {}),
    };
  }

  /** Makes sure the registry holds every one of `layers` (see the class). Never throws. */
  async ensure(layers: readonly string[]): Promise<void> {
    await Promise.all(
      layers.map((d) =>
        this.#store(d as LayerDigest).catch((err: unknown) =>
          this.log.warn(
            { layer: d, err: (err as Error).message },
            'the cluster registry did not take a layer; edges fetch it from the control plane',
          ),
        ),
      ),
    );
  }

  /**
   * Puts one blob in the registry unless it is there (from this replica's layer directory) and
   * records it, with now as its time (GC spares it for its grace); its size. Throws when the
   * registry has it not and this replica cannot give it. `ask`: the registry is asked even when
   * this process put the blob there before, since GC at another replica may have deleted it once
   * nothing used it (publish asks; a create's layers belong to a recorded image, which GC spares).
   */
  #store(digest: LayerDigest, ask = false): Promise<number> {
    const known = this.#present.get(digest);
    if (known !== undefined && !ask) return Promise.resolve(known);
    let up = this.#uploading.get(digest);
    if (!up) {
      up = (async () => {
        const there = await this.client.headBlob(digest);
        let size = there?.size;
        if (size === undefined) {
          if (!this.layers.has(digest)) throw new Error(`layer ${digest} is neither in the registry nor in this replica's layer directory`);
          await this.client.putBlobFile(digest, this.layers.path(digest));
          size = this.layers.size(digest);
          this.log.info({ layer: digest }, 'layer stored in the cluster registry');
        }
        await this.store.db.run(
          'INSERT INTO registry_blobs (digest, size_bytes, stored_at) VALUES (?, ?, ?) ON CONFLICT (digest) DO UPDATE SET stored_at = excluded.stored_at',
          [digest, size, Date.now()],
        );
        this.#present.set(digest, size);
        return size;
      })().finally(() => this.#uploading.delete(digest));
      this.#uploading.set(digest, up);
    }
    return up;
  }

  // --- the blob store (BlobSource), attached to the layer directory as its remote ---

  localPath(digest: LayerDigest): string | undefined {
    return this.layers.has(digest) ? this.layers.path(digest) : undefined;
  }

  has(digest: LayerDigest): boolean | undefined {
    return this.layers.has(digest) ? true : undefined;
  }

  async open(digest: LayerDigest): Promise<Readable> {
    try {
      if (!(await this.client.headBlob(digest)))
        throw new ApiError('IMAGE_NOT_FOUND', `layer ${digest} is not in the cluster registry ${this.repository}`, { layer: digest });
      return (await this.client.getBlob(digest)).body;
    } catch (err) {
      if (err instanceof RegistryError)
        throw new ApiError('INTERNAL', `reading layer ${digest} from the cluster registry: ${err.message}`, { layer: digest });
      throw err;
    }
  }

  /** Stores a finished blob file: into this replica's layer directory (it is consumed), then the registry. */
  async put(file: string): Promise<LayerDigest> {
    const digest = await sha256File(file);
    await this.layers.add(file);
    await this.#store(digest);
    return digest;
  }

  /**
   * Deletes the blob from the registry and from this replica's layer directory; the bytes freed in
   * the registry. A registry that refuses deletes: RegistryKeepsBlobsError (the record stays, so a
   * GC after the registry allows deletes still finds the blob; this replica's copy goes).
   */
  async remove(digest: LayerDigest): Promise<number> {
    const row = await this.store.db.get<{ size_bytes: number | string }>('SELECT size_bytes FROM registry_blobs WHERE digest = ?', [
      digest,
    ]);
    try {
      await this.client.deleteBlob(digest);
    } catch (err) {
      if (!(err instanceof RegistryError) || err.status !== 405) throw err;
      if (!this.#deletesRefused)
        this.log.warn(
          `the cluster registry refuses deletes (${err.message}): its unused blobs stay until it allows them (distribution: storage.delete.enabled: true)`,
        );
      this.#deletesRefused = true;
      this.layers.remove(digest);
      throw new RegistryKeepsBlobsError(err.message);
    }
    await this.store.db.run('DELETE FROM registry_blobs WHERE digest = ?', [digest]);
    this.#present.delete(digest);
    this.layers.remove(digest);
    return row ? Number(row.size_bytes) : 0;
  }

  /** Every blob stored in the registry by a replica of this cluster and not deleted since. */
  async stored(): Promise<StoredBlob[]> {
    const rows = await this.store.db.all<{ digest: LayerDigest; size_bytes: number | string; stored_at: number | string }>(
      'SELECT digest, size_bytes, stored_at FROM registry_blobs ORDER BY digest',
    );
    return rows.map((r) => ({ digest: r.digest, sizeBytes: Number(r.size_bytes), storedAt: Number(r.stored_at) }));
  }

  // --- images (ImagePublisher): the records' blobs are in the registry before the records are ---

  /** Stores the image's layers, then the image as a dsec OCI artifact tagged `sha256-<id>`; the layers' sizes. */
  async publish(id: ImageId, manifest: ImageManifest): Promise<number[]> {
    const sizes = await Promise.all(manifest.layers.map((d) => this.#store(d, true)));
    const config = configBlob(manifest.config);
    await this.client.putBlobBytes(sha256Digest(config), config);
    const body = Buffer.from(
      JSON.stringify(
        dsecManifest(
          config,
          manifest.layers.map((digest, i) => ({ digest, size: sizes[i]! })),
          manifest.createdAt,
        ),
      ),
    );
    await this.client.putManifest(imageTag(id), OCI_MANIFEST_MEDIA_TYPE, body);
    return sizes;
  }

  /** Deletes the image's artifact (its blobs wait for GC: other images may share them). Never throws. */
  async withdraw(id: ImageId): Promise<void> {
    try {
      const m = await this.client.getManifest(imageTag(id));
      if (m?.digest) await this.client.deleteManifest(m.digest);
    } catch (err) {
      this.log.warn({ image: id, err: (err as Error).message }, 'the image artifact stays in the cluster registry');
    }
  }
}
