import type { ApiKeyInfo, BatchEvent, ProjectQuota, ProjectUsage, SandboxInfo, SandboxStatus } from '@dsec/sdk/schema';
import { DEFAULT_PROJECT } from '@dsec/sdk/schema';
import type { EdgeInfo } from '../edge/protocol/edge-api.js';
import { migrate } from './store/migrations.js';
import type { Sql, SqlDb, SqlValue } from './store/sql.js';
import { PostgresDb } from './store/postgres-db.js';
import { SqliteDb } from './store/sqlite-db.js';

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
}

/**
 * Everything the control plane keeps (API keys, sandboxes, batches, trajectories, edges), in SQL
 * both engines run, on SQLite (a file: the embedded default) or PostgreSQL (a `postgres://` URL:
 * shared by several control-plane replicas). The schema comes from the one migration list
 * (store/migrations.ts).
 */
export class StateStore {
  private constructor(readonly db: SqlDb) {}

  /**
   * Opens (and migrates) the store at `location`: a `postgres://` or `postgresql://` URL
   * (PostgreSQL, which several control-plane replicas may share), else a file path (SQLite).
   */
  static async open(location: string, opts: { onError?: (err: Error) => void } = {}): Promise<StateStore> {
    const db: SqlDb = isPostgresUrl(location) ? new PostgresDb(location, opts) : new SqliteDb(location);
    try {
      await migrate(db);
      // Rows an older dsec appended after their sandbox was deleted (the table has no foreign key);
      // an ended sandbox's trajectory stays until its tombstone expires.
      await db.run(
        'DELETE FROM trajectory WHERE sandbox_id NOT IN (SELECT id FROM sandboxes) AND sandbox_id NOT IN (SELECT id FROM ended_sandboxes)',
      );
    } catch (err) {
      await db.close();
      throw err;
    }
    return new StateStore(db);
  }

  // --- projects (docs/PROJECTS.md) -------------------------------------------------------------

  /** False when a project of that name exists already. */
  async insertProject(name: string, quota: ProjectQuota): Promise<boolean> {
    const { changes } = await this.db.run('INSERT INTO projects (name, quota, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING', [
      name,
      JSON.stringify(quota),
      new Date().toISOString(),
    ]);
    return changes === 1;
  }

  async getProject(name: string): Promise<StoredProject | undefined> {
    const r = await this.db.get<{ name: string; quota: string; created_at: string }>(
      'SELECT name, quota, created_at FROM projects WHERE name = ?',
      [name],
    );
    return r && { name: r.name, quota: JSON.parse(r.quota) as ProjectQuota, createdAt: r.created_at };
  }

  async listProjects(): Promise<StoredProject[]> {
    const rows = await this.db.all<{ name: string; quota: string; created_at: string }>(
      'SELECT name, quota, created_at FROM projects ORDER BY name',
    );
    return rows.map((r) => ({ name: r.name, quota: JSON.parse(r.quota) as ProjectQuota, createdAt: r.created_at }));
  }

  async setProjectQuota(name: string, quota: ProjectQuota): Promise<void> {
    await this.db.run('UPDATE projects SET quota = ? WHERE name = ?', [JSON.stringify(quota), name]);
  }

  /** What a project's live sandboxes (creating, running, paused) hold: what its quotas count. */
  async projectUsage(project: string): Promise<ProjectUsage> {
    const r = await this.db.get<{ n: number | string; cpu: number | string; mem: number | string }>(
      "SELECT count(*) AS n, COALESCE(SUM(cpu), 0) AS cpu, COALESCE(SUM(memory_mib), 0) AS mem FROM sandboxes WHERE project = ? AND status IN ('creating', 'running', 'paused')",
      [project],
    );
    // PostgreSQL answers count and SUM over integers as bigint (a string in node-postgres).
    return { sandboxes: Number(r?.n ?? 0), cpu: Math.round(Number(r?.cpu ?? 0) * 1000) / 1000, memoryMiB: Number(r?.mem ?? 0) };
  }

  /** The project of a sandbox the store has a row for (live or not). */
  async sandboxProject(id: string): Promise<string | undefined> {
    return (await this.db.get<{ project: string }>('SELECT project FROM sandboxes WHERE id = ?', [id]))?.project;
  }

  // --- image ownership: an image id or name with rows here is private to those projects --------

  async imageOwners(imageId: string): Promise<string[]> {
    return (await this.db.all<{ project: string }>('SELECT project FROM image_owners WHERE image_id = ?', [imageId])).map((r) => r.project);
  }

  async addImageOwner(imageId: string, project: string): Promise<void> {
    await this.db.run('INSERT INTO image_owners (image_id, project) VALUES (?, ?) ON CONFLICT (image_id, project) DO NOTHING', [
      imageId,
      project,
    ]);
  }

  async removeImageOwner(imageId: string, project: string): Promise<void> {
    await this.db.run('DELETE FROM image_owners WHERE image_id = ? AND project = ?', [imageId, project]);
  }

  async removeImageOwners(imageId: string): Promise<void> {
    await this.db.run('DELETE FROM image_owners WHERE image_id = ?', [imageId]);
  }

  /** The project an image name is private to; undefined: shared (or unused). */
  async imageNameOwner(name: string): Promise<string | undefined> {
    return (await this.db.get<{ project: string }>('SELECT project FROM image_name_owners WHERE name = ?', [name]))?.project;
  }

  async setImageNameOwner(name: string, project: string): Promise<void> {
    await this.db.run('INSERT INTO image_name_owners (name, project) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [name, project]);
  }

  async removeImageNameOwner(name: string): Promise<void> {
    await this.db.run('DELETE FROM image_name_owners WHERE name = ?', [name]);
  }

  // --- batches --------------------------------------------------------------------------------

  async insertBatch(
    id: string,
    count: number,
    req: unknown,
    createdAt: string,
    project: string = DEFAULT_PROJECT,
    owner?: { id: string; until: number },
  ): Promise<void> {
    await this.db.run(
      "INSERT INTO batches (id, count, spec, state, created_at, project, owner, lease_until) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
      [id, count, JSON.stringify(req), createdAt, project, owner?.id ?? null, owner?.until ?? null],
    );
  }

  async getBatch(id: string): Promise<StoredBatch | undefined> {
    const r = await this.db.get<BatchRow>('SELECT * FROM batches WHERE id = ?', [id]);
    return r && fromBatchRow(r);
  }

  async listBatches(state?: StoredBatch['state']): Promise<StoredBatch[]> {
    const rows = state
      ? await this.db.all<BatchRow>('SELECT * FROM batches WHERE state = ? ORDER BY created_at', [state])
      : await this.db.all<BatchRow>('SELECT * FROM batches ORDER BY created_at');
    return rows.map(fromBatchRow);
  }

  async finishBatch(id: string, state: 'done' | 'cancelled', at: string): Promise<void> {
    await this.db.run('UPDATE batches SET state = ?, finished_at = ? WHERE id = ?', [state, at, id]);
  }

  /** One transaction for many events (a 32,000-sandbox batch makes ~64,000). */
  async appendBatchEvents(groups: { id: string; events: { seq: number }[] }[]): Promise<void> {
    await this.db.transaction(async (tx) => {
      for (const g of groups) {
        for (const e of g.events) {
          await tx.run('INSERT INTO batch_events (batch_id, seq, event) VALUES (?, ?, ?) ON CONFLICT DO NOTHING', [
            g.id,
            e.seq,
            JSON.stringify(e),
          ]);
        }
      }
    });
  }

  async batchEvents(id: string, after: number): Promise<BatchEvent[]> {
    const rows = await this.db.all<{ event: string }>('SELECT event FROM batch_events WHERE batch_id = ? AND seq > ? ORDER BY seq', [
      id,
      after,
    ]);
    return rows.map((r) => JSON.parse(r.event) as BatchEvent);
  }

  /** The sandbox rows a batch made, by item index (whatever their status). */
  async batchSandboxes(batchId: string): Promise<{ index: number; id: string }[]> {
    return this.db.all<{ index: number; id: string }>('SELECT batch_index AS "index", id FROM sandboxes WHERE batch_id = ?', [batchId]);
  }

  // --- warm pools ---------------------------------------------------------------------------

  async insertPool(p: StoredPool): Promise<void> {
    await this.db.run('INSERT INTO pools (name, size, spec, created_at) VALUES (?, ?, ?, ?)', [
      p.name,
      p.size,
      JSON.stringify(p.spec),
      p.createdAt,
    ]);
  }

  async listPools(): Promise<StoredPool[]> {
    const rows = await this.db.all<{ name: string; size: number; spec: string; created_at: string }>(
      'SELECT name, size, spec, created_at FROM pools ORDER BY name',
    );
    return rows.map((r) => ({ name: r.name, size: r.size, spec: JSON.parse(r.spec) as unknown, createdAt: r.created_at }));
  }

  async deletePool(name: string): Promise<void> {
    await this.db.run('DELETE FROM pools WHERE name = ?', [name]);
  }

  /**
   * Hands an unclaimed pool sandbox to a caller: its labels (which said it was ready) become the
   * caller's, with the caller's expiry. False when it was claimed already (by another
   * control-plane replica, say): the update is conditional on the labels it had, so it is the claim.
   */
  async claimPoolSandbox(
    sandboxId: string,
    readyLabels: Record<string, string>,
    claim: {
      labels: Record<string, string>;
      ttlSeconds?: number | undefined;
      idleTimeoutSeconds?: number | undefined;
      onExpiry: 'stop' | 'pause';
      at: number;
      project: string;
    },
  ): Promise<boolean> {
    const expiresAt = claim.ttlSeconds === undefined ? null : claim.at + claim.ttlSeconds * 1000;
    const r = await this.db.run(
      "UPDATE sandboxes SET labels = ?, ttl_seconds = ?, idle_timeout_seconds = ?, on_expiry = ?, expires_at = ?, last_activity = ?, project = ? WHERE id = ? AND labels = ? AND status = 'running'",
      [
        JSON.stringify(claim.labels),
        claim.ttlSeconds ?? null,
        claim.idleTimeoutSeconds ?? null,
        claim.onExpiry,
        expiresAt,
        claim.at,
        claim.project,
        sandboxId,
        JSON.stringify(readyLabels),
      ],
    );
    return r.changes === 1;
  }

  // --- edges ----------------------------------------------------------------------------------

  async upsertEdge(e: StoredEdge): Promise<void> {
    await this.db.run(
      `INSERT INTO edges (id, url, pool, labels, state, info, cpu_overcommit, last_seen) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
       ON CONFLICT (id) DO UPDATE SET url = excluded.url, pool = excluded.pool, labels = excluded.labels, state = excluded.state,
         info = excluded.info, cpu_overcommit = excluded.cpu_overcommit,
         last_seen = CASE WHEN excluded.last_seen > edges.last_seen THEN excluded.last_seen ELSE edges.last_seen END`,
      [e.id, e.url, e.pool, JSON.stringify(e.labels), e.state, JSON.stringify(e.info), e.cpuOvercommit, e.lastSeen ?? 0],
    );
  }

  async listEdges(): Promise<StoredEdge[]> {
    const rows = await this.db.all<{
      id: string;
      url: string;
      pool: string;
      labels: string;
      state: StoredEdge['state'];
      info: string;
      cpu_overcommit: number;
      last_seen: number;
    }>('SELECT * FROM edges');
    return rows.map((r) => ({
      id: r.id,
      url: r.url,
      pool: r.pool,
      labels: JSON.parse(r.labels) as Record<string, string>,
      state: r.state,
      info: JSON.parse(r.info) as EdgeInfo,
      cpuOvercommit: r.cpu_overcommit,
      lastSeen: r.last_seen,
    }));
  }

  async deleteEdge(id: string): Promise<void> {
    await this.db.run('DELETE FROM edges WHERE id = ?', [id]);
  }

  /** Every live sandbox of a lost edge becomes `lost` with the reason, in one transaction. */
  async markEdgeLost(edge: string, reason: string): Promise<string[]> {
    const rows = await this.db.all<{ id: string }>(
      "UPDATE sandboxes SET status = 'lost', reason = ? WHERE edge = ? AND status IN ('creating', 'running', 'paused') RETURNING id",
      [reason, edge],
    );
    return rows.map((r) => r.id);
  }

  /** A heartbeat: the edge's facts and when it was heard from, for every replica to read. */
  async touchEdge(id: string, info: EdgeInfo, at: number): Promise<void> {
    await this.db.run('UPDATE edges SET info = ?, last_seen = ? WHERE id = ?', [JSON.stringify(info), at, id]);
  }

  // --- replicas: leases and shared settings ---------------------------------------------------

  /**
   * Takes or renews the lease `name` for `holder` until `now + ttlMs`: granted when nobody holds
   * it, the holder already does, or the last holder's lease ran out (it stopped renewing: dead or
   * cut off). One statement, so two replicas asking at once cannot both get it.
   */
  async lease(name: string, holder: string, ttlMs: number, now = Date.now()): Promise<boolean> {
    const row = await this.db.get<{ holder: string }>(
      `INSERT INTO leases (name, holder, expires_at) VALUES (?, ?, ?)
       ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
       WHERE leases.holder = excluded.holder OR leases.expires_at < ?
       RETURNING holder`,
      [name, holder, now + ttlMs, now],
    );
    return row?.holder === holder;
  }

  /** Gives a lease up (a replica shutting down), so another takes it at once. */
  async releaseLease(name: string, holder: string): Promise<void> {
    await this.db.run('DELETE FROM leases WHERE name = ? AND holder = ?', [name, holder]);
  }

  /** A value every replica shares (the cluster token); the first one written stays. */
  async sharedSetting(name: string, proposed: string): Promise<string> {
    await this.db.run('INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING', [name, proposed]);
    return (await this.db.get<{ value: string }>('SELECT value FROM settings WHERE name = ?', [name]))!.value;
  }

  // --- batch owners ---------------------------------------------------------------------------

  /** Renews this replica's batches; returns those whose cancel another replica asked for. */
  async renewBatches(ids: string[], owner: string, until: number): Promise<string[]> {
    if (ids.length === 0) return [];
    const marks = ids.map(() => '?').join(', ');
    await this.db.run(`UPDATE batches SET lease_until = ? WHERE owner = ? AND id IN (${marks})`, [until, owner, ...ids]);
    const rows = await this.db.all<{ id: string }>(`SELECT id FROM batches WHERE cancel_requested = 1 AND id IN (${marks})`, ids);
    return rows.map((r) => r.id);
  }

  /**
   * Running batches nobody drives (no owner, or an owner whose lease ran out) become `owner`'s;
   * `all` takes every running batch (a lone control plane after its own restart).
   */
  async claimBatches(owner: string, until: number, now: number, all = false): Promise<StoredBatch[]> {
    const rows = await this.db.all<BatchRow>(
      `UPDATE batches SET owner = ?, lease_until = ? WHERE state = 'running' AND (? = 1 OR owner IS NULL OR lease_until IS NULL OR lease_until < ?) RETURNING *`,
      [owner, until, all ? 1 : 0, now],
    );
    return rows.map(fromBatchRow).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  }

  async requestBatchCancel(id: string): Promise<void> {
    await this.db.run('UPDATE batches SET cancel_requested = 1 WHERE id = ?', [id]);
  }

  async close(): Promise<void> {
    await this.db.close();
  }

  // --- API keys -------------------------------------------------------------------------------

  async countKeys(): Promise<number> {
    return (await this.db.get<{ n: number }>('SELECT count(*) AS n FROM api_keys'))!.n;
  }

  /** `mintedBy`: the key that made this one (an E2B key a project key minted): revoked with it. */
  async insertKey(
    id: string,
    hash: string,
    name: string,
    project: string = DEFAULT_PROJECT,
    admin = false,
    mintedBy?: string,
  ): Promise<void> {
    await this.db.run('INSERT INTO api_keys (id, hash, name, created_at, project, admin, minted_by) VALUES (?, ?, ?, ?, ?, ?, ?)', [
      id,
      hash,
      name,
      new Date().toISOString(),
      project,
      admin ? 1 : 0,
      mintedBy ?? null,
    ]);
  }

  /** A key that is not revoked, by the hash of its secret. */
  async keyByHash(hash: string): Promise<{ id: string; name: string; project: string; admin: boolean } | undefined> {
    const r = await this.db.get<{ id: string; name: string; project: string; admin: number }>(
      'SELECT id, name, project, admin FROM api_keys WHERE hash = ? AND revoked_at IS NULL',
      [hash],
    );
    return r && { id: r.id, name: r.name, project: r.project, admin: Number(r.admin) === 1 };
  }

  async listKeys(project?: string): Promise<ApiKeyInfo[]> {
    const sql = `SELECT id, name, project, admin, created_at, revoked_at, minted_by FROM api_keys ${project ? 'WHERE project = ?' : ''} ORDER BY created_at, id`;
    const rows = await this.db.all<{
      id: string;
      name: string;
      project: string;
      admin: number;
      created_at: string;
      revoked_at: string | null;
      minted_by: string | null;
    }>(sql, project ? [project] : []);
    return rows.map((r) => {
      const k: ApiKeyInfo = { id: r.id, name: r.name, project: r.project, admin: Number(r.admin) === 1, createdAt: r.created_at };
      if (r.revoked_at) k.revokedAt = r.revoked_at;
      if (r.minted_by) k.mintedBy = r.minted_by;
      return k;
    });
  }

  /** Revokes a key at once (the next request with it is a 401); false when there is no such key. */
  /** Revokes a key and every key minted from it, at any depth (an E2B key may mint E2B keys). */
  async revokeKey(id: string): Promise<boolean> {
    if (!(await this.db.get('SELECT 1 AS one FROM api_keys WHERE id = ?', [id]))) return false;
    const now = new Date().toISOString();
    await this.db.transaction(async (tx) => {
      let ids = [id];
      const seen = new Set(ids);
      while (ids.length) {
        const marks = ids.map(() => '?').join(', ');
        await tx.run(`UPDATE api_keys SET revoked_at = ? WHERE id IN (${marks}) AND revoked_at IS NULL`, [now, ...ids]);
        const children = await tx.all<{ id: string }>(`SELECT id FROM api_keys WHERE minted_by IN (${marks})`, ids);
        ids = children.map((c) => c.id).filter((c) => !seen.has(c));
        for (const c of ids) seen.add(c);
      }
    });
    return true;
  }

  // --- sandboxes ------------------------------------------------------------------------------

  /**
   * `batch`: the sandbox is item `index` of a batch (unique: a batch never creates an item twice).
   * `spec`: the create request as the caller sent it (saveSpec), written in the same transaction:
   * one commit per create instead of two.
   */
  async insertSandbox(s: SandboxInfo, batch?: { id: string; index: number }, spec?: unknown, lease?: CreateLease): Promise<void> {
    if (spec === undefined) return insertSandboxRow(this.db, s, batch, lease);
    await this.db.transaction(async (tx) => {
      await insertSandboxRow(tx, s, batch, lease);
      await saveSpecRow(tx, s.id, spec);
    });
  }

  /** Many rows (a batch's group) in one transaction: one commit instead of one per sandbox. */
  async insertSandboxes(
    rows: { info: SandboxInfo; batch?: { id: string; index: number }; spec: unknown }[],
    lease?: CreateLease,
  ): Promise<void> {
    await this.db.transaction(async (tx) => {
      for (const r of rows) {
        await insertSandboxRow(tx, r.info, r.batch, lease);
        await saveSpecRow(tx, r.info.id, r.spec);
      }
    });
  }

  // --- create leases: a create in flight is vouched for by its replica (control/create-leases.ts)

  /** Extends the lease of every create `owner` has in flight (one statement, whatever their number). */
  async renewCreates(owner: string, until: number): Promise<number> {
    const { changes } = await this.db.run("UPDATE sandboxes SET create_lease_until = ? WHERE create_owner = ? AND status = 'creating'", [
      until,
      owner,
    ]);
    return changes;
  }

  /** The replica whose create lease a row carries (undefined: none, a row from before create leases). */
  async createOwner(id: string): Promise<string | undefined> {
    return (
      (await this.db.get<{ owner: string | null }>('SELECT create_owner AS owner FROM sandboxes WHERE id = ?', [id]))?.owner ?? undefined
    );
  }

  /** Creates on `edge` some replica still vouches for at `now`: reconcile leaves them to their create. */
  async leasedCreates(edge: string, now: number): Promise<Set<string>> {
    const rows = await this.db.all<{ id: string }>(
      "SELECT id FROM sandboxes WHERE edge = ? AND status = 'creating' AND create_lease_until >= ?",
      [edge, now],
    );
    return new Set(rows.map((r) => r.id));
  }

  /** Creates whose replica stopped renewing their lease before `now` (it died, or lost the store). */
  async abandonedCreates(now: number): Promise<{ id: string; edge: string; owner: string }[]> {
    return this.db.all<{ id: string; edge: string; owner: string }>(
      "SELECT id, edge, create_owner AS owner FROM sandboxes WHERE status = 'creating' AND create_lease_until IS NOT NULL AND create_lease_until < ? ORDER BY created_at",
      [now],
    );
  }

  /**
   * Settles a create: the row becomes `status` only while it is still `creating` (another replica
   * may have taken the create over, or the edge been lost, meanwhile). Returns the row's status
   * after the call (undefined: the row is gone).
   */
  async settleCreate(id: string, status: SandboxStatus, reason?: string): Promise<SandboxStatus | undefined> {
    const { changes } = await this.db.run("UPDATE sandboxes SET status = ?, reason = ? WHERE id = ? AND status = 'creating'", [
      status,
      reason ?? null,
      id,
    ]);
    if (changes === 1) return status;
    return (await this.db.get<{ status: SandboxStatus }>('SELECT status FROM sandboxes WHERE id = ?', [id]))?.status;
  }

  /**
   * A group's create outcomes in one transaction; a row no longer `creating` keeps what it says
   * (its edge was lost, or another replica settled it). Returns those rows with their status.
   */
  async setStatuses(
    updates: { id: string; status: SandboxStatus; reason?: string }[],
  ): Promise<Map<string, { status: SandboxStatus; reason?: string }>> {
    const kept = new Map<string, { status: SandboxStatus; reason?: string }>();
    await this.db.transaction(async (tx) => {
      for (const u of updates) {
        // No row changed: lost meanwhile, taken over by another replica (control/create-leases.ts),
        // or gone altogether (killed); the first two are kept with what they say.
        const { changes } = await tx.run("UPDATE sandboxes SET status = ?, reason = ? WHERE id = ? AND status = 'creating'", [
          u.status,
          u.reason ?? null,
          u.id,
        ]);
        if (changes === 1) continue;
        const now = await tx.get<{ status: SandboxStatus; reason: string | null }>('SELECT status, reason FROM sandboxes WHERE id = ?', [
          u.id,
        ]);
        if (now && now.status !== u.status) kept.set(u.id, { status: now.status, ...(now.reason ? { reason: now.reason } : {}) });
      }
    });
    return kept;
  }

  /** Records activity (exec, files, sessions) for the idle timeout. */
  async touch(id: string, at = Date.now()): Promise<void> {
    await this.db.run('UPDATE sandboxes SET last_activity = ? WHERE id = ?', [at, id]);
  }

  /** Moves a sandbox's TTL expiry; the TTL stays the span from creation to it. */
  async setExpiry(id: string, ttlSeconds: number, expiresAt: number): Promise<void> {
    await this.db.run('UPDATE sandboxes SET ttl_seconds = ?, expires_at = ? WHERE id = ?', [ttlSeconds, expiresAt, id]);
  }

  /** Running sandboxes whose TTL or idle timeout has passed at `now`. */
  async expired(now = Date.now()): Promise<{ id: string; onExpiry: 'stop' | 'pause'; why: string }[]> {
    const rows = await this.db.all<{
      id: string;
      on_expiry: 'stop' | 'pause';
      expires_at: number | null;
      idle_timeout_seconds: number | null;
      last_activity: number;
    }>(
      `SELECT id, on_expiry, expires_at, idle_timeout_seconds, last_activity FROM sandboxes
       WHERE (status = 'running' AND ((expires_at IS NOT NULL AND expires_at <= ?) OR (idle_timeout_seconds IS NOT NULL AND last_activity + idle_timeout_seconds * 1000 <= ?)))
          OR (status = 'paused' AND on_expiry = 'stop' AND expires_at IS NOT NULL AND expires_at <= ?)`,
      [now, now, now],
    );
    return rows.map((r) => ({
      id: r.id,
      onExpiry: r.on_expiry,
      why: r.expires_at !== null && r.expires_at <= now ? 'ttl expired' : `idle for ${r.idle_timeout_seconds} s`,
    }));
  }

  /** The create request as the caller sent it: what a replay re-creates from. */
  async saveSpec(id: string, spec: unknown): Promise<void> {
    await saveSpecRow(this.db, id, spec);
  }

  // --- volumes --------------------------------------------------------------------------------

  /** False when a volume of that name exists. */
  async insertVolume(v: StoredVolume): Promise<boolean> {
    const { changes } = await this.db.run(
      'INSERT INTO volumes (name, project, edge, labels, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING',
      [v.name, v.project, v.edge, JSON.stringify(v.labels), v.createdAt],
    );
    return changes === 1;
  }

  async getVolume(name: string): Promise<StoredVolume | undefined> {
    const r = await this.db.get<VolumeRow>('SELECT * FROM volumes WHERE name = ?', [name]);
    return r && fromVolumeRow(r);
  }

  async listVolumes(): Promise<StoredVolume[]> {
    return (await this.db.all<VolumeRow>('SELECT * FROM volumes ORDER BY name')).map(fromVolumeRow);
  }

  async deleteVolume(name: string): Promise<void> {
    await this.db.run('DELETE FROM volumes WHERE name = ?', [name]);
  }

  /** Sandboxes that mount the volume and may still hold it: creating, running, paused or lost. */
  async volumeUsers(name: string): Promise<string[]> {
    const rows = await this.db.all<{ id: string }>(
      "SELECT s.id FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox_id WHERE m.volume = ? AND s.status IN ('creating', 'running', 'paused', 'lost') ORDER BY s.id",
      [name],
    );
    return rows.map((r) => r.id);
  }

  async getSpec<T>(id: string): Promise<T | undefined> {
    const row = await this.db.get<{ spec: string }>('SELECT spec FROM sandbox_specs WHERE id = ?', [id]);
    return row && (JSON.parse(row.spec) as T);
  }

  async setStatus(id: string, status: SandboxStatus, reason?: string): Promise<void> {
    await this.db.run('UPDATE sandboxes SET status = ?, reason = ? WHERE id = ?', [status, reason ?? null, id]);
  }

  async deleteSandbox(id: string): Promise<void> {
    await this.db.transaction(async (tx) => {
      await tx.run('DELETE FROM trajectory WHERE sandbox_id = ?', [id]);
      await tx.run('DELETE FROM sandboxes WHERE id = ?', [id]);
    });
  }

  async getSandbox(id: string): Promise<SandboxInfo | undefined> {
    const row = await this.db.get<SandboxRow>('SELECT * FROM sandboxes WHERE id = ?', [id]);
    return row && fromRow(row);
  }

  /** Sandboxes whose labels contain every pair in `labels`, oldest first. */
  async listSandboxes(
    filter: { labels?: Record<string, string>; status?: SandboxStatus; edge?: string; project?: string } = {},
  ): Promise<SandboxInfo[]> {
    const where: string[] = [];
    const params: SqlValue[] = [];
    for (const [k, v] of Object.entries(filter.labels ?? {})) {
      // The engine's JSON functions, not a JSON path built from the key: keys may hold any character.
      where.push(
        this.db.dialect === 'postgres'
          ? 'CAST(sandboxes.labels AS jsonb) ->> CAST(? AS text) = ?'
          : 'EXISTS (SELECT 1 FROM json_each(sandboxes.labels) WHERE key = ? AND value = ?)',
      );
      params.push(k, v);
    }
    if (filter.status) {
      where.push('status = ?');
      params.push(filter.status);
    }
    if (filter.edge) {
      where.push('edge = ?');
      params.push(filter.edge);
    }
    if (filter.project) {
      where.push('project = ?');
      params.push(filter.project);
    }
    const sql = `SELECT * FROM sandboxes ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY created_at, id`;
    return (await this.db.all<SandboxRow>(sql, params)).map(fromRow);
  }
}

/** Whether a --store value names a PostgreSQL database rather than a SQLite file. */
export function isPostgresUrl(location: string): boolean {
  return /^postgres(ql)?:\/\//.test(location);
}

/** The replica creating a sandbox and until when it vouches for the create (renewed while it runs). */
export interface CreateLease {
  owner: string;
  until: number;
}

async function insertSandboxRow(db: Sql, s: SandboxInfo, batch?: { id: string; index: number }, lease?: CreateLease): Promise<void> {
  await db.run(
    `INSERT INTO sandboxes (id, edge, status, image, image_id, resources, labels, created_at, reason, layers, ttl_seconds, idle_timeout_seconds,
      on_expiry, expires_at, last_activity, batch_id, batch_index, backend, project, cpu, memory_mib, create_owner, create_lease_until)
      VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    [
      s.id,
      s.edge,
      s.status,
      s.image,
      s.imageId,
      JSON.stringify(s.resources),
      JSON.stringify(s.labels),
      s.createdAt,
      s.reason ?? null,
      JSON.stringify(s.layers),
      s.ttlSeconds ?? null,
      s.idleTimeoutSeconds ?? null,
      s.onExpiry,
      s.expiresAt ? Date.parse(s.expiresAt) : null,
      Date.parse(s.lastActivityAt),
      batch?.id ?? null,
      batch?.index ?? null,
      s.backend,
      s.project ?? DEFAULT_PROJECT,
      s.resources.cpu,
      s.resources.memoryMiB,
      lease?.owner ?? null,
      lease?.until ?? null,
    ],
  );
}

async function saveSpecRow(db: Sql, id: string, spec: unknown): Promise<void> {
  await db.run('INSERT INTO sandbox_specs (id, spec) VALUES (?, ?) ON CONFLICT (id) DO UPDATE SET spec = excluded.spec', [
    id,
    JSON.stringify(spec),
  ]);
  // The volumes it mounts, so a volume in use is found without reading every spec (rows go with the sandbox's).
  for (const v of (spec as { volumes?: { name: string }[] } | null)?.volumes ?? []) {
    await db.run('INSERT INTO volume_mounts (volume, sandbox_id) VALUES (?, ?) ON CONFLICT DO NOTHING', [v.name, id]);
  }
}

export interface StoredVolume {
  name: string;
  /** The project whose keys and sandboxes may use it. */
  project: string;
  edge: string;
  labels: Record<string, string>;
  createdAt: string;
}

interface VolumeRow {
  name: string;
  project: string;
  edge: string;
  labels: string;
  created_at: string;
}

function fromVolumeRow(r: VolumeRow): StoredVolume {
  return {
    name: r.name,
    project: r.project,
    edge: r.edge,
    labels: JSON.parse(r.labels) as Record<string, string>,
    createdAt: r.created_at,
  };
}

export interface StoredPool {
  name: string;
  size: number;
  spec: unknown;
  createdAt: string;
}

export interface StoredProject {
  name: string;
  quota: ProjectQuota;
  createdAt: string;
}

export interface StoredBatch {
  id: string;
  project: string;
  count: number;
  spec: string;
  state: 'running' | 'done' | 'cancelled';
  createdAt: string;
  finishedAt?: string;
}

interface BatchRow {
  id: string;
  count: number;
  spec: string;
  state: StoredBatch['state'];
  created_at: string;
  finished_at: string | null;
  project: string;
}

function fromBatchRow(r: BatchRow): StoredBatch {
  const b: StoredBatch = { id: r.id, project: r.project, count: r.count, spec: r.spec, state: r.state, createdAt: r.created_at };
  if (r.finished_at) b.finishedAt = r.finished_at;
  return b;
}

interface SandboxRow {
  id: string;
  edge: string;
  status: SandboxStatus;
  image: string;
  image_id: string;
  resources: string;
  labels: string;
  created_at: string;
  reason: string | null;
  layers: string;
  ttl_seconds: number | null;
  idle_timeout_seconds: number | null;
  on_expiry: 'stop' | 'pause';
  expires_at: number | null;
  last_activity: number;
  backend: SandboxInfo['backend'];
  project: string;
}

function fromRow(r: SandboxRow): SandboxInfo {
  const info: SandboxInfo = {
    id: r.id,
    edge: r.edge,
    project: r.project,
    backend: r.backend,
    status: r.status,
    image: r.image,
    imageId: r.image_id,
    resources: JSON.parse(r.resources) as SandboxInfo['resources'],
    labels: JSON.parse(r.labels) as Record<string, string>,
    layers: JSON.parse(r.layers) as string[],
    createdAt: r.created_at,
    onExpiry: r.on_expiry,
    lastActivityAt: new Date(r.last_activity || Date.parse(r.created_at)).toISOString(),
  };
  if (r.reason !== null) info.reason = r.reason;
  if (r.ttl_seconds !== null) info.ttlSeconds = r.ttl_seconds;
  if (r.idle_timeout_seconds !== null) info.idleTimeoutSeconds = r.idle_timeout_seconds;
  if (r.expires_at !== null) info.expiresAt = new Date(r.expires_at).toISOString();
  return info;
}
