import type { CreateSandboxRequest, SandboxInfo } from '@dsec/sdk/schema';
import type { StateStore } from './state-store.js';
import { keptSpec } from './store/sandboxes.js';

/** How long a killed sandbox's trajectory stays readable, unless configured. */
export const DEFAULT_TRAJECTORY_RETENTION_HOURS = 24;

/**
 * Sandboxes that were killed, kept as a tombstone for a while so that their trajectory stays
 * readable by id (`GET /v1/sandboxes/{id}/trajectory`, `dsec log ID`) after the kill: a trainer
 * often reads the log of a rollout it already ended. The sandbox row goes at kill; the trajectory
 * rows stay until the tombstone expires.
 */
export class EndedSandboxes {
  constructor(
    private readonly store: StateStore,
    /** 0 keeps nothing: the trajectory goes with the sandbox. */
    readonly retentionMs: number,
  ) {}

  /** Removes the sandbox's record; its trajectory stays for the retention time (or goes now when that is 0). */
  async retire(s: SandboxInfo, reason: string, now = Date.now()): Promise<void> {
    if (this.retentionMs <= 0) return this.store.sandboxes.delete(s.id);
    await this.store.db.transaction(async (tx) => {
      // Labels and batch stay with the log: a bulk read by label or batch (GET /v1/trajectories)
      // still finds a rollout its trainer already killed, and a fork's lineage its killed parent.
      // Its create request and exact image go too (the spec's row goes with the sandbox's), so the
      // killed sandbox can still be replayed from its trajectory. A second retire (its row gone
      // by then) keeps the first one's request rather than the poorer one it can rebuild.
      // A batch's item keeps no spec of its own: its batch's row has it (store/sandbox-rows.ts).
      const row = await tx.get<{ batch_id: string | null; spec: string | null; batch_spec: string | null }>(
        `SELECT s.batch_id AS batch_id, p.spec AS spec, b.spec AS batch_spec FROM sandboxes s
           LEFT JOIN sandbox_specs p ON p.id = s.id LEFT JOIN batches b ON b.id = s.batch_id WHERE s.id = ?`,
        [s.id],
      );
      const spec = keptSpec<CreateSandboxRequest>(row) ?? { image: s.imageId, resources: s.resources, labels: s.labels };
      const replayFrom = JSON.stringify({ imageId: s.imageId, spec } satisfies ReplaySource);
      await tx.run(
        `INSERT INTO ended_sandboxes (id, ended_at, reason, project, labels, batch_id, replay_from) VALUES (?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT (id) DO UPDATE SET ended_at = excluded.ended_at, reason = excluded.reason, project = excluded.project,
           labels = excluded.labels, batch_id = coalesce(excluded.batch_id, ended_sandboxes.batch_id),
           replay_from = coalesce(ended_sandboxes.replay_from, excluded.replay_from)`,
        [s.id, now, reason, s.project ?? null, JSON.stringify(s.labels), row?.batch_id ?? null, replayFrom],
      );
      await tx.run('DELETE FROM sandboxes WHERE id = ?', [s.id]);
    });
  }

  /** When and why a sandbox ended, and until when its trajectory is kept; undefined if unknown or expired. */
  async get(id: string, now = Date.now()): Promise<{ endedAt: string; reason: string; keptUntil: string } | undefined> {
    const row = await this.store.db.get<{ ended_at: number; reason: string }>('SELECT ended_at, reason FROM ended_sandboxes WHERE id = ?', [
      id,
    ]);
    if (!row || row.ended_at + this.retentionMs <= now) return undefined;
    return {
      endedAt: new Date(row.ended_at).toISOString(),
      reason: row.reason,
      keptUntil: new Date(row.ended_at + this.retentionMs).toISOString(),
    };
  }

  /** The project of a killed sandbox whose trajectory is still kept (null: one from before projects, `default`'s). */
  async projectOf(id: string, now = Date.now()): Promise<string | undefined> {
    const row = await this.store.db.get<{ ended_at: number; project: string | null }>(
      'SELECT ended_at, project FROM ended_sandboxes WHERE id = ?',
      [id],
    );
    if (!row || Number(row.ended_at) + this.retentionMs <= now) return undefined;
    return row.project ?? 'default';
  }

  /**
   * What a replay of a killed sandbox starts from: its image and create request, and its project;
   * undefined when it is not a kept tombstone or one from before tombstones kept them.
   */
  async replaySource(id: string, now = Date.now()): Promise<(ReplaySource & { project: string }) | undefined> {
    const row = await this.store.db.get<{ ended_at: number; project: string | null; replay_from: string | null }>(
      'SELECT ended_at, project, replay_from FROM ended_sandboxes WHERE id = ?',
      [id],
    );
    if (!row || Number(row.ended_at) + this.retentionMs <= now || row.replay_from === null) return undefined;
    return { ...(JSON.parse(row.replay_from) as ReplaySource), project: row.project ?? 'default' };
  }

  /**
   * The project and labels of a killed sandbox whose trajectory is still kept (labels: undefined
   * for a tombstone from before they were kept).
   */
  async record(id: string, now = Date.now()): Promise<{ project: string; labels: Record<string, string> | undefined } | undefined> {
    const row = await this.store.db.get<{ ended_at: number; project: string | null; labels: string | null }>(
      'SELECT ended_at, project, labels FROM ended_sandboxes WHERE id = ?',
      [id],
    );
    if (!row || Number(row.ended_at) + this.retentionMs <= now) return undefined;
    return {
      project: row.project ?? 'default',
      labels: row.labels === null ? undefined : (JSON.parse(row.labels) as Record<string, string>),
    };
  }

  /** Deletes tombstones past the retention time with their trajectories; returns how many. */
  async expire(now = Date.now()): Promise<number> {
    const cutoff = now - this.retentionMs;
    return this.store.db.transaction(async (tx) => {
      await tx.run('DELETE FROM trajectory WHERE sandbox_id IN (SELECT id FROM ended_sandboxes WHERE ended_at <= ?)', [cutoff]);
      return (await tx.run('DELETE FROM ended_sandboxes WHERE ended_at <= ?', [cutoff])).changes;
    });
  }
}

/** A killed sandbox's exact image and the create request it was made from. */
export interface ReplaySource {
  imageId: string;
  spec: CreateSandboxRequest;
}
