import type { EdgeInfo } from '../../edge/protocol/edge-api.js';
import type { SqlDb } from './sql.js';

/** An edge as the store keeps it between control-plane restarts. */
export interface StoredEdge {
  id: string;
  url: string;
  pool: string;
  labels: Record<string, string>;
  state: 'ready' | 'draining' | 'lost';
  info: EdgeInfo;
  cpuOvercommit: number;
  /** When a heartbeat last arrived, at any replica (epoch ms; 0: not since the store has kept it). */
  lastSeen?: number;
  /** The version of `info.cachedLayers` (edge/protocol/layer-delta.ts); undefined: none agreed. */
  layersVersion?: number | undefined;
  /** list() left `info.cachedLayers` empty: its version is the one the caller said it holds. */
  layersUnchanged?: boolean;
}

/** The edges every replica knows (control/edges/edge-registry.ts). */
export interface EdgeRecords {
  /** Inserts or replaces an edge; its last heartbeat only moves forward. */
  upsert(e: StoredEdge): Promise<void>;
  /**
   * Every edge. `heldVersion`: the layers version the caller holds for an edge; an edge whose
   * stored layers have that version comes with `layersUnchanged` and no list (not parsed again).
   */
  list(heldVersion?: (id: string) => number | undefined): Promise<StoredEdge[]>;
  delete(id: string): Promise<void>;
  /** Every live sandbox of a lost edge becomes `lost` with the reason, in one transaction. */
  markLost(edge: string, reason: string): Promise<string[]>;
  /**
   * A heartbeat: the edge's facts and when it was heard from, for every replica to read. Its
   * cached layers are written only with `layers` (they changed, or their version did).
   */
  touch(id: string, info: EdgeInfo, at: number, layers?: { version: number | undefined }): Promise<void>;
}

interface EdgeRow {
  id: string;
  url: string;
  pool: string;
  labels: string;
  state: StoredEdge['state'];
  info: string;
  cpu_overcommit: number;
  last_seen: number;
  layers: string;
  layers_version: number | null;
}

/** info as stored: its cached layers live in their own column, written only when they change. */
function infoText(info: EdgeInfo): string {
  return JSON.stringify({ ...info, cachedLayers: [] });
}

export class SqlEdgeRecords implements EdgeRecords {
  constructor(private readonly db: SqlDb) {}

  async upsert(e: StoredEdge): Promise<void> {
    await this.db.run(
      `INSERT INTO edges (id, url, pool, labels, state, info, cpu_overcommit, last_seen, layers, layers_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (id) DO UPDATE SET url = excluded.url, pool = excluded.pool, labels = excluded.labels, state = excluded.state,
         info = excluded.info, cpu_overcommit = excluded.cpu_overcommit, layers = excluded.layers, layers_version = excluded.layers_version,
         last_seen = CASE WHEN excluded.last_seen > edges.last_seen THEN excluded.last_seen ELSE edges.last_seen END`,
      [
        e.id,
        e.url,
        e.pool,
        JSON.stringify(e.labels),
        e.state,
        infoText(e.info),
        e.cpuOvercommit,
        e.lastSeen ?? 0,
        JSON.stringify(e.info.cachedLayers),
        e.layersVersion ?? null,
      ],
    );
  }

  async list(heldVersion?: (id: string) => number | undefined): Promise<StoredEdge[]> {
    const rows = await this.db.all<EdgeRow>('SELECT * FROM edges');
    return rows.map((r) => {
      const version = r.layers_version ?? undefined;
      const unchanged = version !== undefined && heldVersion?.(r.id) === version;
      const info = JSON.parse(r.info) as EdgeInfo;
      return {
        id: r.id,
        url: r.url,
        pool: r.pool,
        labels: JSON.parse(r.labels) as Record<string, string>,
        state: r.state,
        info: { ...info, cachedLayers: unchanged ? [] : (JSON.parse(r.layers) as string[]) },
        cpuOvercommit: r.cpu_overcommit,
        lastSeen: r.last_seen,
        layersVersion: version,
        ...(unchanged ? { layersUnchanged: true } : {}),
      };
    });
  }

  async delete(id: string): Promise<void> {
    await this.db.run('DELETE FROM edges WHERE id = ?', [id]);
  }

  async markLost(edge: string, reason: string): Promise<string[]> {
    const rows = await this.db.all<{ id: string }>(
      "UPDATE sandboxes SET status = 'lost', reason = ? WHERE edge = ? AND status IN ('creating', 'running', 'paused') RETURNING id",
      [reason, edge],
    );
    return rows.map((r) => r.id);
  }

  async touch(id: string, info: EdgeInfo, at: number, layers?: { version: number | undefined }): Promise<void> {
    if (!layers) {
      await this.db.run('UPDATE edges SET info = ?, last_seen = ? WHERE id = ?', [infoText(info), at, id]);
      return;
    }
    await this.db.run('UPDATE edges SET info = ?, last_seen = ?, layers = ?, layers_version = ? WHERE id = ?', [
      infoText(info),
      at,
      JSON.stringify(info.cachedLayers),
      layers.version ?? null,
      id,
    ]);
  }
}
