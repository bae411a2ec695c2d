import type { SqlDb } from './sql.js';

export interface StoredVolume {
  name: string;
  /** The project whose keys and sandboxes may use it. */
  project: string;
  edge: string;
  labels: Record<string, string>;
  createdAt: string;
}

/** Named volumes: which edge holds each, and who mounts it (control/volumes.ts). */
export interface VolumeRecords {
  /** False when a volume of that name exists. */
  insert(v: StoredVolume): Promise<boolean>;
  get(name: string): Promise<StoredVolume | undefined>;
  list(): Promise<StoredVolume[]>;
  delete(name: string): Promise<void>;
  /** Sandboxes that mount the volume and may still hold it: creating, running, paused or lost. */
  users(name: string): Promise<string[]>;
}

interface VolumeRow {
  name: string;
  project: string;
  edge: string;
  labels: string;
  created_at: string;
}

function fromRow(r: VolumeRow): StoredVolume {
  return {
    name: r.name,
    project: r.project,
    edge: r.edge,
    labels: JSON.parse(r.labels) as Record<string, string>,
    createdAt: r.created_at,
  };
}

export class SqlVolumeRecords implements VolumeRecords {
  constructor(private readonly db: SqlDb) {}

  async insert(v: StoredVolume): Promise<boolean> {
    const { changes } = await this.db.run(
      'INSERT INTO volumes (name, project, edge, labels, created_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING',
      [v.name, v.project, v.edge, JSON.stringify(v.labels), v.createdAt],
    );
    return changes === 1;
  }

  async get(name: string): Promise<StoredVolume | undefined> {
    const r = await this.db.get<VolumeRow>('SELECT * FROM volumes WHERE name = ?', [name]);
    return r && fromRow(r);
  }

  async list(): Promise<StoredVolume[]> {
    return (await this.db.all<VolumeRow>('SELECT * FROM volumes ORDER BY name')).map(fromRow);
  }

  async delete(name: string): Promise<void> {
    await this.db.run('DELETE FROM volumes WHERE name = ?', [name]);
  }

  async users(name: string): Promise<string[]> {
    const rows = await this.db.all<{ id: string }>(
      "SELECT s.id FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox_id WHERE m.volume = ? AND s.status IN ('creating', 'running', 'paused', 'lost') ORDER BY s.id",
      [name],
    );
    return rows.map((r) => r.id);
  }
}
