import { Type, type Static } from 'typebox';

/**
 * An edge's cached layers travel with its heartbeats as changes, not as the whole list every
 * second: a node with a thousand cached layers would otherwise send, and every control-plane
 * replica parse and store, ~70 kB a second for a list that rarely changes. Each set of layers the
 * edge has had gets a version; the control plane answers each heartbeat with the version it now
 * holds, and the edge sends the next one as what was added and removed since that version. Any
 * doubt (no version held, a base that is not the one held) is settled by the whole list once.
 */
export const LayerSync = Type.Object(
  {
    version: Type.Integer({ minimum: 0, description: 'The version of the set of cached layers this heartbeat brings the holder to.' }),
    base: Type.Optional(
      Type.Integer({ minimum: 0, description: 'The version `added`/`removed` apply to; absent: `cachedLayers` is the whole set.' }),
    ),
    added: Type.Optional(Type.Array(Type.String(), { maxItems: 100_000 })),
    removed: Type.Optional(Type.Array(Type.String(), { maxItems: 100_000 })),
  },
  { additionalProperties: false },
);
export type LayerSync = Static<typeof LayerSync>;

/** The edge's half: what to send with a heartbeat, and what the control plane said it holds. */
export class LayerDeltaSender {
  #version = 0;
  #current = new Set<string>();
  /** Sets sent and not yet known to be held, by version (a few: one per heartbeat in flight). */
  readonly #sent = new Map<number, Set<string>>();
  #held: number | undefined;

  /** The heartbeat's layers: the whole list when the control plane holds none, else a delta. */
  next(cachedLayers: readonly string[]): { cachedLayers?: string[]; layers: LayerSync } {
    const now = new Set(cachedLayers);
    if (now.size !== this.#current.size || [...now].some((l) => !this.#current.has(l))) {
      this.#version++;
      this.#current = now;
    }
    this.#sent.set(this.#version, this.#current);
    const base = this.#held === undefined ? undefined : this.#sent.get(this.#held);
    if (this.#held === undefined || !base) return { cachedLayers: [...this.#current], layers: { version: this.#version } };
    return {
      layers: {
        version: this.#version,
        base: this.#held,
        added: [...this.#current].filter((l) => !base.has(l)),
        removed: [...base].filter((l) => !this.#current.has(l)),
      },
    };
  }

  /** The control plane's answer: the version it holds now (undefined: none, send the whole list). */
  held(version: number | undefined): void {
    this.#held = version;
    for (const v of this.#sent.keys()) if (version === undefined || v < version) this.#sent.delete(v);
  }
}

/**
 * The control plane's half: the layers a heartbeat brings an edge to, from what is held for it
 * (`held`, at `heldVersion`); undefined when the delta is against a version not held (the answer
 * then holds no version and the edge sends the whole list next).
 */
export function applyLayerSync(
  held: readonly string[],
  heldVersion: number | undefined,
  cachedLayers: readonly string[] | undefined,
  sync: LayerSync | undefined,
): { layers: string[]; version: number | undefined; changed: boolean } | undefined {
  if (cachedLayers !== undefined) {
    const changed = cachedLayers.length !== held.length || cachedLayers.some((l, i) => held[i] !== l);
    return { layers: [...cachedLayers], version: sync?.version, changed };
  }
  if (!sync || sync.base === undefined || sync.base !== heldVersion) return undefined;
  if (!sync.added?.length && !sync.removed?.length) return { layers: [...held], version: sync.version, changed: false };
  const gone = new Set(sync.removed ?? []);
  const layers = held.filter((l) => !gone.has(l));
  const have = new Set(layers);
  for (const l of sync.added ?? []) {
    if (have.has(l)) continue;
    have.add(l);
    layers.push(l);
  }
  return { layers, version: sync.version, changed: true };
}
