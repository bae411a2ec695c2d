import type { Dialect, Sql, SqlDb } from './sql.js';

/**
 * Every change to the control plane's schema, in order, for both engines (one file: the schema's
 * history, read top to bottom, which a split would scatter): a store applies the ones
 * it has not yet (recorded in schema_migrations), in one transaction. Add a new entry at the end
 * for a new table or column; never edit one that has shipped. Types are ones both engines know
 * (BIGINT for epoch milliseconds, DOUBLE PRECISION for fractions); `blob` is the one that differs.
 */
export interface Migration {
  id: number;
  name: string;
  up: (db: Sql) => Promise<void>;
}

const types = (d: Dialect) => ({ blob: d === 'postgres' ? 'BYTEA' : 'BLOB' });

export const MIGRATIONS: readonly Migration[] = [
  {
    id: 1,
    name: 'baseline: keys, sandboxes, specs, trajectories, edges, batches, snapshot owners, ended sandboxes',
    up: async (db) => {
      const t = types(db.dialect);
      await db.exec(`
        CREATE TABLE IF NOT EXISTS api_keys (
          id TEXT PRIMARY KEY,
          hash TEXT NOT NULL UNIQUE,
          name TEXT NOT NULL,
          created_at TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS sandboxes (
          id TEXT PRIMARY KEY,
          edge TEXT NOT NULL,
          status TEXT NOT NULL,
          image TEXT NOT NULL,
          image_id TEXT NOT NULL,
          resources TEXT NOT NULL,
          labels TEXT NOT NULL,
          created_at TEXT NOT NULL,
          reason TEXT,
          layers TEXT NOT NULL DEFAULT '[]',
          ttl_seconds INTEGER,
          idle_timeout_seconds INTEGER,
          on_expiry TEXT NOT NULL DEFAULT 'stop',
          expires_at BIGINT,
          last_activity BIGINT NOT NULL DEFAULT 0,
          batch_id TEXT,
          batch_index INTEGER,
          backend TEXT NOT NULL DEFAULT 'container',
          trajectory_dropped INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE IF NOT EXISTS sandbox_specs (
          id TEXT PRIMARY KEY REFERENCES sandboxes(id) ON DELETE CASCADE,
          spec TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS trajectory (
          sandbox_id TEXT NOT NULL,
          seq INTEGER NOT NULL,
          at TEXT NOT NULL,
          kind TEXT NOT NULL,
          request TEXT NOT NULL,
          result TEXT,
          payload ${t.blob},
          duration_ms DOUBLE PRECISION,
          exit_code INTEGER,
          replayable INTEGER NOT NULL,
          PRIMARY KEY (sandbox_id, seq)
        );
        CREATE TABLE IF NOT EXISTS edges (
          id TEXT PRIMARY KEY,
          url TEXT NOT NULL,
          pool TEXT NOT NULL,
          labels TEXT NOT NULL,
          state TEXT NOT NULL,
          info TEXT NOT NULL,
          cpu_overcommit DOUBLE PRECISION NOT NULL
        );
        CREATE TABLE IF NOT EXISTS batches (
          id TEXT PRIMARY KEY,
          count INTEGER NOT NULL,
          spec TEXT NOT NULL,
          state TEXT NOT NULL,
          created_at TEXT NOT NULL,
          finished_at TEXT
        );
        CREATE TABLE IF NOT EXISTS batch_events (
          batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
          seq INTEGER NOT NULL,
          event TEXT NOT NULL,
          PRIMARY KEY (batch_id, seq)
        );
        CREATE TABLE IF NOT EXISTS snapshot_images (
          image_id TEXT PRIMARY KEY,
          sandbox_id TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS ended_sandboxes (
          id TEXT PRIMARY KEY,
          ended_at BIGINT NOT NULL,
          reason TEXT NOT NULL
        );
      `);
      if (db.dialect === 'sqlite') await addLegacyColumns(db);
      await db.exec(`
        CREATE INDEX IF NOT EXISTS sandboxes_edge ON sandboxes(edge);
        CREATE INDEX IF NOT EXISTS sandboxes_status ON sandboxes(status);
        CREATE UNIQUE INDEX IF NOT EXISTS sandboxes_batch ON sandboxes(batch_id, batch_index) WHERE batch_id IS NOT NULL;
        CREATE INDEX IF NOT EXISTS snapshot_images_sandbox ON snapshot_images(sandbox_id);
        CREATE INDEX IF NOT EXISTS ended_sandboxes_at ON ended_sandboxes(ended_at);
      `);
    },
  },
  {
    id: 2,
    name: 'warm pools',
    up: async (db) => {
      await db.exec(`
        CREATE TABLE IF NOT EXISTS pools (
          name TEXT PRIMARY KEY,
          size INTEGER NOT NULL,
          spec TEXT NOT NULL,
          created_at TEXT NOT NULL
        );
      `);
    },
  },
  {
    id: 3,
    name: 'projects: keys, sandboxes, batches and ended sandboxes belong to a project; quotas; image owners',
    up: async (db) => {
      // Everything from before projects belongs to `default`; the bootstrap key (client.json's)
      // becomes an admin key. cpu and memory_mib make a project's usage one portable SUM.
      await db.exec(`
        CREATE TABLE IF NOT EXISTS projects (
          name TEXT PRIMARY KEY,
          quota TEXT NOT NULL,
          created_at TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS image_owners (
          image_id TEXT NOT NULL,
          project TEXT NOT NULL,
          PRIMARY KEY (image_id, project)
        );
        CREATE TABLE IF NOT EXISTS image_name_owners (
          name TEXT PRIMARY KEY,
          project TEXT NOT NULL
        );
        ALTER TABLE api_keys ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE api_keys ADD COLUMN revoked_at TEXT;
        ALTER TABLE sandboxes ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE sandboxes ADD COLUMN cpu DOUBLE PRECISION NOT NULL DEFAULT 0;
        ALTER TABLE sandboxes ADD COLUMN memory_mib INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE batches ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
        ALTER TABLE ended_sandboxes ADD COLUMN project TEXT;
        CREATE INDEX IF NOT EXISTS sandboxes_project ON sandboxes(project, status);
      `);
      await db.run("INSERT INTO projects (name, quota, created_at) VALUES ('default', '{}', ?) ON CONFLICT (name) DO NOTHING", [
        new Date().toISOString(),
      ]);
      await db.run("UPDATE api_keys SET admin = 1 WHERE name = 'client.json'");
      for (const r of await db.all<{ id: string; resources: string }>('SELECT id, resources FROM sandboxes')) {
        const res = JSON.parse(r.resources) as { cpu?: number; memoryMiB?: number };
        await db.run('UPDATE sandboxes SET cpu = ?, memory_mib = ? WHERE id = ?', [res.cpu ?? 0, res.memoryMiB ?? 0, r.id]);
      }
    },
  },
  {
    id: 4,
    name: 'replicas: leases for background work, shared settings, edge heartbeat times, batch owners',
    up: async (db) => {
      await db.exec(`
        CREATE TABLE IF NOT EXISTS leases (
          name TEXT PRIMARY KEY,
          holder TEXT NOT NULL,
          expires_at BIGINT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS settings (
          name TEXT PRIMARY KEY,
          value TEXT NOT NULL
        );
        ALTER TABLE edges ADD COLUMN last_seen BIGINT NOT NULL DEFAULT 0;
        ALTER TABLE batches ADD COLUMN owner TEXT;
        ALTER TABLE batches ADD COLUMN lease_until BIGINT;
        ALTER TABLE batches ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
      `);
    },
  },
  {
    id: 5,
    name: 'volumes and the sandboxes that mount them',
    up: async (db) => {
      await db.exec(`
        CREATE TABLE IF NOT EXISTS volumes (
          name TEXT PRIMARY KEY,
          project TEXT NOT NULL,
          edge TEXT NOT NULL,
          labels TEXT NOT NULL,
          created_at TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS volume_mounts (
          volume TEXT NOT NULL,
          sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
          PRIMARY KEY (volume, sandbox_id)
        );
        CREATE INDEX IF NOT EXISTS volume_mounts_sandbox ON volume_mounts(sandbox_id);
      `);
    },
  },
  {
    id: 6,
    name: 'create leases: the replica creating a sandbox, and until when it vouches for the create',
    up: async (db) => {
      await db.exec(`
        ALTER TABLE sandboxes ADD COLUMN create_owner TEXT;
        ALTER TABLE sandboxes ADD COLUMN create_lease_until BIGINT;
        CREATE INDEX IF NOT EXISTS sandboxes_creating ON sandboxes(status, create_lease_until);
      `);
    },
  },
  {
    id: 7,
    name: 'image records (manifests, names, builds) in the store, shared by every replica',
    up: async (db) => {
      await db.exec(`
        CREATE TABLE IF NOT EXISTS images (
          id TEXT PRIMARY KEY,
          manifest TEXT NOT NULL,
          created_at TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS image_names (
          name TEXT PRIMARY KEY,
          image_id TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS image_builds (
          cache_key TEXT PRIMARY KEY,
          image_id TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS image_tombstones (
          kind TEXT NOT NULL,
          entry TEXT NOT NULL,
          removed_at TEXT NOT NULL,
          PRIMARY KEY (kind, entry)
        );
        CREATE TABLE IF NOT EXISTS image_catalog (
          one INTEGER PRIMARY KEY,
          version BIGINT NOT NULL
        );
        INSERT INTO image_catalog (one, version) VALUES (1, 0) ON CONFLICT (one) DO NOTHING;
      `);
    },
  },
  {
    id: 8,
    name: "the blobs replicas stored in the cluster's registry (their blob store), which image GC deletes there",
    up: async (db) => {
      await db.exec(`
        CREATE TABLE IF NOT EXISTS registry_blobs (
          digest TEXT PRIMARY KEY,
          size_bytes BIGINT NOT NULL,
          stored_at BIGINT NOT NULL
        );
      `);
    },
  },
  {
    id: 9,
    name: 'the key that minted a key (E2B keys a project key mints), so revoking it revokes them',
    up: async (db) => {
      await db.exec(`
        ALTER TABLE api_keys ADD COLUMN minted_by TEXT;
        CREATE INDEX IF NOT EXISTS api_keys_minted_by ON api_keys(minted_by);
      `);
    },
  },
  {
    id: 10,
    name: "a killed sandbox's labels and batch, so a bulk trajectory read (GET /v1/trajectories) and a fork's lineage still find it",
    up: async (db) => {
      // Tombstones from before this have neither: they stay readable by id, and match no filter.
      // (Live rows are found by batch through sandboxes_batch, whose batch_id leads.)
      await db.exec(`
        ALTER TABLE ended_sandboxes ADD COLUMN labels TEXT;
        ALTER TABLE ended_sandboxes ADD COLUMN batch_id TEXT;
        CREATE INDEX IF NOT EXISTS ended_sandboxes_batch ON ended_sandboxes(batch_id);
      `);
    },
  },
  {
    id: 11,
    name: "sandboxes counted by status, edge and project from an index (each /metrics scrape's grouped count), which also serves sandboxes_status's lookups",
    up: async (db) => {
      // Covering: the count reads the index alone (400,000 rows: 60 ms in SQLite, against 370 ms
      // with a sort of the table). Its first column is status, so it replaces sandboxes_status.
      await db.exec(`
        CREATE INDEX IF NOT EXISTS sandboxes_counts ON sandboxes(status, edge, project);
        DROP INDEX IF EXISTS sandboxes_status;
      `);
    },
  },
  {
    id: 12,
    name: "E2B's envd access token in a column of its own, out of the labels every key of the project lists (and specs, which forks copy)",
    up: async (db) => {
      await db.exec('ALTER TABLE sandboxes ADD COLUMN access_token TEXT;');
      const label = 'e2b.access-token';
      const rows = await db.all<{ id: string; labels: string }>('SELECT id, labels FROM sandboxes WHERE labels LIKE ?', [`%"${label}"%`]);
      for (const r of rows) {
        const { [label]: token, ...labels } = JSON.parse(r.labels) as Record<string, string>;
        await db.run('UPDATE sandboxes SET labels = ?, access_token = ? WHERE id = ?', [JSON.stringify(labels), token ?? null, r.id]);
      }
      const specs = await db.all<{ id: string; spec: string }>('SELECT id, spec FROM sandbox_specs WHERE spec LIKE ?', [`%"${label}"%`]);
      for (const r of specs) {
        const spec = JSON.parse(r.spec) as { labels?: Record<string, string> };
        if (spec.labels) delete spec.labels[label];
        await db.run('UPDATE sandbox_specs SET spec = ? WHERE id = ?', [JSON.stringify(spec), r.id]);
      }
    },
  },
  {
    id: 13,
    name: 'killed sandboxes keep what a replay starts from (image and create request) beside their trajectory',
    up: async (db) => {
      await db.exec('ALTER TABLE ended_sandboxes ADD COLUMN replay_from TEXT;');
    },
  },
  {
    id: 14,
    name: "an edge's cached layers in a column of their own with their version, written when they change, not with every heartbeat",
    up: async (db) => {
      await db.exec("ALTER TABLE edges ADD COLUMN layers TEXT NOT NULL DEFAULT '[]'; ALTER TABLE edges ADD COLUMN layers_version INTEGER;");
      for (const r of await db.all<{ id: string; info: string }>('SELECT id, info FROM edges')) {
        const info = JSON.parse(r.info) as { cachedLayers?: string[] };
        await db.run('UPDATE edges SET layers = ?, info = ? WHERE id = ?', [
          JSON.stringify(info.cachedLayers ?? []),
          JSON.stringify({ ...info, cachedLayers: [] }),
          r.id,
        ]);
      }
    },
  },
  {
    id: 15,
    name: "a sandbox's labels as indexed rows (a list or kill by label reads the matches, not every row's JSON); a batch's counts on its row",
    up: async (db) => {
      // At 400,000 rows, json_each over every row's labels took longer than the 50 ms a list has.
      await db.exec(`
        CREATE TABLE IF NOT EXISTS sandbox_labels (
          sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
          key TEXT NOT NULL,
          value TEXT NOT NULL,
          created_at TEXT NOT NULL,
          PRIMARY KEY (sandbox_id, key)
        );
        -- The sandbox's created_at beside each pair: a page of a list by label is one range of
        -- this index in list order (32,000 matches: each page reads its rows, not all matches).
        CREATE INDEX IF NOT EXISTS sandbox_labels_page ON sandbox_labels(key, value, created_at, sandbox_id);
        CREATE INDEX IF NOT EXISTS sandboxes_created ON sandboxes(created_at, id);
        ALTER TABLE batches ADD COLUMN placed INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE batches ADD COLUMN running INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE batches ADD COLUMN failed INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE batches ADD COLUMN last_seq INTEGER NOT NULL DEFAULT -1;
      `);
      await db.exec(
        db.dialect === 'postgres'
          ? 'INSERT INTO sandbox_labels (sandbox_id, key, value, created_at) SELECT s.id, kv.key, kv.value, s.created_at FROM sandboxes s, jsonb_each_text(CAST(s.labels AS jsonb)) kv'
          : 'INSERT INTO sandbox_labels (sandbox_id, key, value, created_at) SELECT s.id, j.key, j.value, s.created_at FROM sandboxes s, json_each(s.labels) j',
      );
      // Counted once from the events a batch already has; from here on its events update them.
      const like = (type: string): string => `'%"type":"${type}"%'`;
      await db.exec(`
        UPDATE batches SET
          placed = (SELECT count(*) FROM batch_events e WHERE e.batch_id = batches.id AND e.event LIKE ${like('placed')}),
          running = (SELECT count(*) FROM batch_events e WHERE e.batch_id = batches.id AND e.event LIKE ${like('running')}),
          failed = (SELECT count(*) FROM batch_events e WHERE e.batch_id = batches.id AND e.event LIKE ${like('failed')}),
          last_seq = COALESCE((SELECT max(seq) FROM batch_events e WHERE e.batch_id = batches.id), -1);
      `);
    },
  },
  {
    id: 16,
    name: 'a sandbox moving to another edge: where to, which replica moves it and until when it vouches for the move',
    up: async (db) => {
      await db.exec(`
        ALTER TABLE sandboxes ADD COLUMN move_to TEXT;
        ALTER TABLE sandboxes ADD COLUMN move_owner TEXT;
        ALTER TABLE sandboxes ADD COLUMN move_until BIGINT;
        ALTER TABLE sandboxes ADD COLUMN move_since BIGINT;
        CREATE INDEX IF NOT EXISTS sandboxes_move_to ON sandboxes (move_to) WHERE move_to IS NOT NULL;
      `);
    },
  },
  {
    id: 17,
    name: 'the expiry sweep reads only sandboxes with a TTL or an idle timeout; sandboxes counted as they change (sandbox_counts), not recounted at each /metrics scrape',
    up: async (db) => {
      // The sweep runs every second: at 400,000 running rows without either, its scan of every
      // running row took 75 ms (130 ms under bench cluster's load), a stall every request met.
      await db.exec(`
        CREATE INDEX IF NOT EXISTS sandboxes_expiry ON sandboxes (status, expires_at) WHERE expires_at IS NOT NULL;
        CREATE INDEX IF NOT EXISTS sandboxes_idle ON sandboxes (status, (last_activity + idle_timeout_seconds * 1000)) WHERE idle_timeout_seconds IS NOT NULL;
        CREATE TABLE IF NOT EXISTS sandbox_counts (
          status TEXT NOT NULL,
          edge TEXT NOT NULL,
          project TEXT NOT NULL,
          n BIGINT NOT NULL,
          cpu DOUBLE PRECISION NOT NULL,
          memory_mib BIGINT NOT NULL,
          PRIMARY KEY (status, edge, project)
        );
      `);
      await db.exec(db.dialect === 'postgres' ? POSTGRES_COUNT_TRIGGERS : SQLITE_COUNT_TRIGGERS);
      // After the triggers: on PostgreSQL, CREATE TRIGGER locks the table against writes until this
      // migration commits, so no row is both counted here and by a trigger, or by neither.
      await db.exec(`
        INSERT INTO sandbox_counts (status, edge, project, n, cpu, memory_mib)
          SELECT status, edge, project, count(*), COALESCE(SUM(cpu), 0), COALESCE(SUM(memory_mib), 0) FROM sandboxes GROUP BY status, edge, project;
      `);
    },
  },
  {
    id: 18,
    name: 'lists of sandboxes by project, edge or status page by index in list order; a create writes fewer index pages',
    up: async (db) => {
      // A project key's list (every GET /v1/sandboxes it makes), a list by edge and a list by
      // status (the dashboard's tiles) read an index on (project, status), (edge) or (status, edge,
      // project), then sorted all of the project's, edge's or status's rows to return one page: at
      // 400,000 sandboxes, every row for each page of 100 (22 ms a page at 100,000 here). With
      // created_at and id next, a page is one range of the index in list order, as a list by label
      // is (sandbox_labels_page). sandboxes_counts served the count by status, edge and project,
      // which sandbox_counts keeps now (migration 17). sandboxes_creating goes: every create put
      // its row into it and its settle took it out again, one more index page written back at each
      // commit of a turn's creates; its queries (a replica's creates to renew, an edge's creates in
      // flight, leases run out) all ask for status 'creating', a short range of the status index.
      await db.exec(`
        CREATE INDEX IF NOT EXISTS sandboxes_project_page ON sandboxes(project, created_at, id);
        CREATE INDEX IF NOT EXISTS sandboxes_edge_page ON sandboxes(edge, created_at, id);
        CREATE INDEX IF NOT EXISTS sandboxes_status_page ON sandboxes(status, created_at, id);
        DROP INDEX IF EXISTS sandboxes_project;
        DROP INDEX IF EXISTS sandboxes_edge;
        DROP INDEX IF EXISTS sandboxes_counts;
        DROP INDEX IF EXISTS sandboxes_creating;
      `);
    },
  },
  {
    id: 19,
    name: "a batch's events as runs, one row per flush, not one row per event",
    up: async (db) => {
      // A batch of 32,000 made ~64,000 event rows, each a row and an index entry written back at
      // the commit of its flush: 6.5 % of the control plane's thread placing it. A flush's events
      // for one batch are consecutive, so they are one row, keyed by the run's last seq: a read
      // after seq N is one range of the key. Rows from before are runs of one event.
      await db.exec(`
        CREATE TABLE IF NOT EXISTS batch_event_runs (
          batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
          last_seq BIGINT NOT NULL,
          first_seq BIGINT NOT NULL,
          events TEXT NOT NULL,
          PRIMARY KEY (batch_id, last_seq)
        );
        INSERT INTO batch_event_runs (batch_id, last_seq, first_seq, events)
          SELECT batch_id, seq, seq, '[' || event || ']' FROM batch_events;
        DROP TABLE batch_events;
      `);
    },
  },
  {
    id: 20,
    name: "the bytes of payloads a sandbox's trajectory keeps, bounded per sandbox (trajectory-log.ts)",
    up: async (db) => {
      await db.exec(`
        ALTER TABLE sandboxes ADD COLUMN trajectory_payload_bytes BIGINT NOT NULL DEFAULT 0;
        UPDATE sandboxes SET trajectory_payload_bytes = (SELECT coalesce(sum(length(t.payload)), 0) FROM trajectory t WHERE t.sandbox_id = sandboxes.id)
          WHERE id IN (SELECT sandbox_id FROM trajectory WHERE payload IS NOT NULL);
      `);
    },
  },
];

/**
 * SQLite has one writer at a time: a trigger adds a row's change to its group at once.
 * n, cpu and memory_mib follow every insert, delete and change of a row's group or size.
 */
const SQLITE_COUNT_TRIGGERS = `
  CREATE TRIGGER IF NOT EXISTS sandbox_counts_insert AFTER INSERT ON sandboxes BEGIN
    INSERT INTO sandbox_counts (status, edge, project, n, cpu, memory_mib) VALUES (NEW.status, NEW.edge, NEW.project, 1, NEW.cpu, NEW.memory_mib)
      ON CONFLICT (status, edge, project) DO UPDATE SET n = n + 1, cpu = cpu + excluded.cpu, memory_mib = memory_mib + excluded.memory_mib;
  END;
  CREATE TRIGGER IF NOT EXISTS sandbox_counts_delete AFTER DELETE ON sandboxes BEGIN
    UPDATE sandbox_counts SET n = n - 1, cpu = cpu - OLD.cpu, memory_mib = memory_mib - OLD.memory_mib
      WHERE status = OLD.status AND edge = OLD.edge AND project = OLD.project;
  END;
  CREATE TRIGGER IF NOT EXISTS sandbox_counts_update AFTER UPDATE OF status, edge, project, cpu, memory_mib ON sandboxes
    WHEN OLD.status IS NOT NEW.status OR OLD.edge IS NOT NEW.edge OR OLD.project IS NOT NEW.project OR OLD.cpu IS NOT NEW.cpu OR OLD.memory_mib IS NOT NEW.memory_mib
  BEGIN
    UPDATE sandbox_counts SET n = n - 1, cpu = cpu - OLD.cpu, memory_mib = memory_mib - OLD.memory_mib
      WHERE status = OLD.status AND edge = OLD.edge AND project = OLD.project;
    INSERT INTO sandbox_counts (status, edge, project, n, cpu, memory_mib) VALUES (NEW.status, NEW.edge, NEW.project, 1, NEW.cpu, NEW.memory_mib)
      ON CONFLICT (status, edge, project) DO UPDATE SET n = n + 1, cpu = cpu + excluded.cpu, memory_mib = memory_mib + excluded.memory_mib;
  END;
`;

/**
 * PostgreSQL has concurrent writers: a trigger updating the group's row would hold that row's lock
 * until its transaction ends, so creates in flight on one edge would queue behind each other (and
 * two batches' transactions touching two groups in opposite orders would deadlock). Each change is
 * appended to sandbox_count_deltas instead, which no two writers share; readers fold the deltas
 * into sandbox_counts (SandboxRecords.foldCounts) before they read.
 */
const POSTGRES_COUNT_TRIGGERS = `
  CREATE TABLE IF NOT EXISTS sandbox_count_deltas (
    status TEXT NOT NULL,
    edge TEXT NOT NULL,
    project TEXT NOT NULL,
    n BIGINT NOT NULL,
    cpu DOUBLE PRECISION NOT NULL,
    memory_mib BIGINT NOT NULL
  );
  CREATE OR REPLACE FUNCTION dsec_sandbox_count_delta() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN
    IF TG_OP = 'UPDATE' AND OLD.status IS NOT DISTINCT FROM NEW.status AND OLD.edge IS NOT DISTINCT FROM NEW.edge
       AND OLD.project IS NOT DISTINCT FROM NEW.project AND OLD.cpu IS NOT DISTINCT FROM NEW.cpu
       AND OLD.memory_mib IS NOT DISTINCT FROM NEW.memory_mib THEN
      RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
      INSERT INTO sandbox_count_deltas VALUES (OLD.status, OLD.edge, OLD.project, -1, -OLD.cpu, -OLD.memory_mib);
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
      INSERT INTO sandbox_count_deltas VALUES (NEW.status, NEW.edge, NEW.project, 1, NEW.cpu, NEW.memory_mib);
    END IF;
    RETURN NULL;
  END $$;
  DROP TRIGGER IF EXISTS sandbox_counts_change ON sandboxes;
  CREATE TRIGGER sandbox_counts_change AFTER INSERT OR DELETE OR UPDATE OF status, edge, project, cpu, memory_mib ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION dsec_sandbox_count_delta();
`;

/**
 * State files from before schema_migrations have the first release's sandboxes table: the
 * baseline's CREATE TABLE IF NOT EXISTS leaves it as it is, so the later columns are added here.
 */
async function addLegacyColumns(db: Sql): Promise<void> {
  const have = new Set((await db.all<{ name: string }>('PRAGMA table_info(sandboxes)')).map((c) => c.name));
  const add: [string, string][] = [
    ['layers', "TEXT NOT NULL DEFAULT '[]'"],
    ['ttl_seconds', 'INTEGER'],
    ['idle_timeout_seconds', 'INTEGER'],
    ['on_expiry', "TEXT NOT NULL DEFAULT 'stop'"],
    ['expires_at', 'INTEGER'],
    ['last_activity', 'INTEGER NOT NULL DEFAULT 0'],
    ['batch_id', 'TEXT'],
    ['batch_index', 'INTEGER'],
    ['backend', "TEXT NOT NULL DEFAULT 'container'"],
    ['trajectory_dropped', 'INTEGER NOT NULL DEFAULT 0'],
  ];
  for (const [col, type] of add) if (!have.has(col)) await db.exec(`ALTER TABLE sandboxes ADD COLUMN ${col} ${type}`);
}

/** Any constant: the PostgreSQL advisory lock that keeps replicas starting together from migrating twice. */
const MIGRATION_LOCK = 0x64736563; // "dsec"

/** Applies the migrations `db` has not had yet, in one transaction. */
export async function migrate(db: SqlDb, migrations: readonly Migration[] = MIGRATIONS): Promise<void> {
  await db.transaction(async (tx) => {
    if (tx.dialect === 'postgres') await tx.get('SELECT pg_advisory_xact_lock(?)', [MIGRATION_LOCK]);
    await tx.exec('CREATE TABLE IF NOT EXISTS schema_migrations (id INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)');
    const applied = new Set((await tx.all<{ id: number }>('SELECT id FROM schema_migrations')).map((r) => r.id));
    for (const m of migrations) {
      if (applied.has(m.id)) continue;
      await m.up(tx);
      await tx.run('INSERT INTO schema_migrations (id, name, applied_at) VALUES (?, ?, ?)', [m.id, m.name, new Date().toISOString()]);
    }
  });
}
