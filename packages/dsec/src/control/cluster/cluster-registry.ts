import type { Logger } from 'pino';
import type { LayerStore } from '../../image/layer-store.js';
import type { RegistryCredentials } from '../../image/registry/registry-auth.js';
import { RegistryClient } from '../../image/registry/registry-client.js';
import type { RegistryRef } from '../../image/registry/registry-ref.js';

/** What an edge is told at join: where the cluster's registry is and the account to read it with. */
export interface EdgeRegistryGrant {
  /** HOST/REPOSITORY (or https://HOST/REPOSITORY), as `dsec edge --registry` takes it. */
  repository: string;
  username?: string;
  password?: string;
}

/**
 * The cluster's OCI registry (`dsec control --registry HOST/REPOSITORY`, DSEC_REGISTRY): the
 * layer blobs edges read. Edges get its address and account when they join (no `--registry` on
 * each node), and every layer a create needs is in it before the edge is asked (HEAD, then an
 * upload of what it lacks; each blob once per process, concurrent creates sharing one upload),
 * so edges read layers from the registry rather than from this control plane. A registry that
 * cannot take a blob does not fail the create: the edge falls back to the control plane's blob
 * endpoint for it, as it does for any blob the registry lacks.
 */
export class ClusterRegistry {
  readonly client: RegistryClient;
  readonly #present = new Set<string>();
  readonly #uploading = new Map<string, Promise<void>>();

  constructor(
    readonly repository: string,
    ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>,
    private readonly credentials: RegistryCredentials | undefined,
    private readonly layers: LayerStore,
    private readonly log: Logger,
  ) {
    this.client = new RegistryClient(ref, { credentials, attempts: 3, onRetry: (why) => log.warn(`registry: retrying: ${why}`) });
  }

  /** The grant a joining edge gets (the account is sent over the join, under the cluster token). */
  forEdges(): EdgeRegistryGrant {
    return { repository: this.repository, ...(this.credentials ? { username: this.credentials.username, password: this.credentials.password } : {}) };
  }

  /** Makes sure the registry holds every one of `layers` (see the class). Never throws. */
  async ensure(layers: readonly string[]): Promise<void> {
    await Promise.all(layers.map((d) => this.#ensureOne(d)));
  }

  #ensureOne(digest: string): Promise<void> {
    if (this.#present.has(digest)) return Promise.resolve();
    let up = this.#uploading.get(digest);
    if (!up) {
      up = this.client
        .putBlobFile(digest, this.layers.path(digest as `sha256:${string}`))
        .then((r) => {
          this.#present.add(digest);
          if (r.uploaded) this.log.info({ layer: digest }, 'layer uploaded to the cluster registry');
        })
        .catch((err: unknown) => this.log.warn({ layer: digest, err: (err as Error).message }, 'the cluster registry did not take a layer; edges fetch it from the control plane'))
        .finally(() => this.#uploading.delete(digest));
      this.#uploading.set(digest, up);
    }
    return up;
  }
}
