/**
 * Two control-plane replicas on one real PostgreSQL (a database of their own), as the cluster
 * tests use them: replica A in a child process (replica-process.ts), so a test can SIGKILL it,
 * and replica B in the test's process, so a test can reach its insides. Each has its own data dir;
 * they share a layer dir or a registry only when asked. `close()` stops both and checks that no
 * mount is left below either data dir.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { compileOptions } from '../../../src/config/options.js';
import { startControlPlane, type RunningControl } from '../../../src/runtime/all-in-one.js';
import { startEdgeDaemon, type RunningEdgeDaemon } from '../../../src/runtime/edge-daemon.js';
import { testPostgres } from '../../helpers/postgres.js';
import { makeDataDir, mountsBelow } from '../../helpers/server.js';

const replicaScript = join(fileURLToPath(new URL('.', import.meta.url)), 'replica-process.js');

export interface Endpoint {
  url: string;
  apiKey: string;
}

export interface ReplicaPair {
  /** The PostgreSQL URL both replicas use. */
  store: string;
  /** A's data dir, then B's. */
  dataDirs: [string, string];
  a: Endpoint & { joinToken: string };
  /** A's process. */
  child: ChildProcess;
  b: RunningControl;
  /** `A,B`: what an edge joins. */
  join: string;
  /** SIGKILLs A (a crash: nothing of it is cleaned up). */
  killA(): Promise<void>;
  close(): Promise<void>;
}

export interface ReplicaPairOptions {
  /** Prefix of the database's name. */
  name: string;
  /** A layer dir both replicas share (--layer-dir). */
  layerDir?: string;
  /** The cluster's registry (--registry HOST/REPOSITORY), for both. */
  registry?: string;
  /** A's data dir, when the test prepared it. */
  aDataDir?: string;
}

/** A (busybox built in its data dir), then B; both serving on loopback. */
export async function startReplicaPair(opts: ReplicaPairOptions): Promise<ReplicaPair> {
  const store = await (await testPostgres()).database(`${opts.name}_${randomBytes(4).toString('hex')}`);
  const dataDirs: [string, string] = [opts.aDataDir ?? makeDataDir(), makeDataDir()];
  const shared = { ...(opts.layerDir ? { layerDir: opts.layerDir } : {}), ...(opts.registry ? { registry: opts.registry } : {}) };
  const child = spawn(process.execPath, [replicaScript, JSON.stringify({ dataDir: dataDirs[0], store, ...shared })], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const first = await new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).once('line', resolve);
    child.once('exit', (code) => reject(new Error(`replica A exited (${code}) before it served`)));
  });
  const a = JSON.parse(first) as Endpoint & { joinToken: string };
  const b = await startControlPlane(
    compileOptions({ dataDir: dataDirs[1], store, ...shared, listen: '127.0.0.1:0', logLevel: 'silent' }, {}),
  );
  const killA = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const gone = new Promise((r) => child.once('exit', r));
    child.kill('SIGKILL');
    await gone;
  };
  return {
    store,
    dataDirs,
    a,
    child,
    b,
    join: `${a.url},${b.url}`,
    killA,
    async close() {
      await b.close();
      if (child.exitCode === null && child.signalCode === null) {
        const gone = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        await gone;
      }
      for (const d of dataDirs) {
        assert.deepEqual(mountsBelow(d), []);
        rmSync(d, { recursive: true, force: true });
      }
    },
  };
}

/** A JSON call; the body parsed when it is JSON. */
export async function api(at: Endpoint, method: string, path: string, body?: unknown): Promise<{ status: number; body: unknown }> {
  const res = await fetch(`${at.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${at.apiKey}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
  });
  const text = await res.text();
  return { status: res.status, body: text && res.headers.get('content-type')?.includes('json') ? (JSON.parse(text) as unknown) : text };
}

/** Polls `check` every 100 ms until it gives a value (the test's own timeout bounds it). */
export async function until<T>(check: () => Promise<T | undefined>): Promise<T> {
  for (;;) {
    const v = await check();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/**
 * A real crun edge joined to both replicas (through A's join token), answered once both list it
 * ready, so a create sent to either may be placed on it.
 */
export async function startJoinedEdge(
  pair: ReplicaPair,
  edge: { dataDir: string; id: string; maxSandboxes: number },
): Promise<RunningEdgeDaemon> {
  const running = await startEdgeDaemon({
    join: pair.join,
    token: pair.a.joinToken,
    listen: '127.0.0.1:0',
    dataDir: edge.dataDir,
    id: edge.id,
    pool: 'default',
    labels: {},
    cpuOvercommit: 0,
    maxSandboxes: edge.maxSandboxes,
    layerCacheMiB: 512,
    logLevel: 'silent',
  });
  for (const at of [pair.a, pair.b]) {
    await until(async () =>
      ((await api(at, 'GET', '/v1/nodes')).body as { nodes: { id: string; state: string }[] }).nodes.some(
        (n) => n.id === edge.id && n.state === 'ready',
      )
        ? true
        : undefined,
    );
  }
  return running;
}
