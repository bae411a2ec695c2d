/**
 * A real PostgreSQL for tests: Debian's server binaries, `initdb` in a temp dir as the
 * unprivileged `postgres` user (or `nobody`), listening on loopback on a free port, stopped and
 * removed when the test process exits. One cluster per test process; each test store gets a
 * database of its own.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { basename, join } from 'node:path';
import pg from 'pg';

/** DSEC_TEST_STORE=postgres runs the test servers' and stores' state on PostgreSQL instead of SQLite. */
export const TEST_STORE_POSTGRES = process.env['DSEC_TEST_STORE'] === 'postgres';

/** Debian's server binaries, newest major version first. */
function postgresBinDir(): string | undefined {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root)
    .filter((v) => existsSync(join(root, v, 'bin', 'initdb')))
    .sort((a, b) => Number(b) - Number(a));
  return versions[0] && join(root, versions[0], 'bin');
}

/** Why a PostgreSQL cannot be started here, or undefined when it can. */
export function postgresSkipReason(): string | undefined {
  if (process.getuid?.() !== 0) return 'starting PostgreSQL as another user needs root';
  if (!postgresBinDir())
    return "PostgreSQL server binaries not found under /usr/lib/postgresql (Debian's postgresql package; scripts/setup installs it)";
  return undefined;
}

function runAccount(): { uid: number; gid: number } {
  for (const name of ['postgres', 'nobody']) {
    const r = spawnSync('id', ['-u', name], { encoding: 'utf8' });
    const g = spawnSync('id', ['-g', name], { encoding: 'utf8' });
    if (r.status === 0 && g.status === 0) return { uid: Number(r.stdout.trim()), gid: Number(g.stdout.trim()) };
  }
  throw new Error('no unprivileged account (postgres or nobody) to run PostgreSQL as');
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const port = (srv.address() as { port: number }).port;
      srv.close(() => resolve(port));
    });
  });
}

export interface TestPostgres {
  port: number;
  /** A URL for database `name`, created when missing. */
  database(name: string): Promise<string>;
  stop(): void;
}

let running: Promise<TestPostgres> | undefined;

/** The test process's PostgreSQL, started at first use. */
export function testPostgres(): Promise<TestPostgres> {
  running ??= startPostgres();
  return running;
}

async function startPostgres(): Promise<TestPostgres> {
  const why = postgresSkipReason();
  if (why) throw new Error(why);
  const bin = postgresBinDir()!;
  const { uid, gid } = runAccount();
  const dir = mkdtempSync('/var/tmp/dsec-pg-');
  chownSync(dir, uid, gid);
  const data = join(dir, 'data');
  const as = { uid, gid, encoding: 'utf8' as const, cwd: dir };
  const init = spawnSync(
    join(bin, 'initdb'),
    ['-D', data, '-U', 'dsec', '--auth=trust', '-E', 'UTF8', '--no-sync', '--no-instructions'],
    as,
  );
  if (init.status !== 0) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`initdb failed: ${init.stderr || init.stdout}`);
  }
  const port = await freePort();
  // Loopback only, socket in the temp dir; durability off: the cluster is thrown away.
  const settings = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200`;
  const logFile = join(dir, 'postgres.log');
  writeFileSync(logFile, '');
  chownSync(logFile, uid, gid);
  const start = spawnSync(join(bin, 'pg_ctl'), ['-D', data, '-o', settings, '-l', logFile, '-w', '-t', '60', 'start'], as);
  if (start.status !== 0) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error(`pg_ctl start failed: ${start.stderr || start.stdout}`);
  }
  let stopped = false;
  const stop = (): void => {
    if (stopped) return;
    stopped = true;
    spawnSync(join(bin, 'pg_ctl'), ['-D', data, '-m', 'immediate', '-w', 'stop'], as);
    rmSync(dir, { recursive: true, force: true });
  };
  process.once('exit', stop);
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      stop();
      process.exit(128 + (signal === 'SIGINT' ? 2 : 15));
    });
  }
  const base = `postgres://dsec@127.0.0.1:${port}`;
  return {
    port,
    async database(name: string): Promise<string> {
      const client = new pg.Client({ connectionString: `${base}/postgres` });
      await client.connect();
      try {
        const have = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [name]);
        if (have.rowCount === 0) await client.query(`CREATE DATABASE "${name}"`);
      } finally {
        await client.end();
      }
      return `${base}/${name}`;
    },
    stop,
  };
}

/** A database name for a test path (a data dir, a SQLite file): the same path, the same database. */
export function databaseNameFor(path: string): string {
  return `dsec_${basename(path)
    .toLowerCase()
    .replace(/[^a-z0-9]/g, '_')}_${hash(path)}`.slice(0, 63);
}

function hash(s: string): string {
  let h = 0;
  for (const c of s) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return h.toString(36);
}

/**
 * Where a test's state store lives: `file` (SQLite), or with DSEC_TEST_STORE=postgres a database
 * of the test process's PostgreSQL named after it (opening it again gets the same state; each
 * `:memory:` gets a new one).
 */
export async function testStoreLocation(file: string): Promise<string> {
  if (!TEST_STORE_POSTGRES) return file;
  const name = file === ':memory:' ? `dsec_mem_${randomBytes(6).toString('hex')}` : databaseNameFor(file);
  return (await testPostgres()).database(name);
}
