/**
 * Crash points: `dsec up` runs as a child process and is killed with SIGKILL at a random moment
 * while a create, kill, snapshot or fork is in flight; then it is started again on the same data
 * dir. After every restart: each sandbox the API lists is running (or paused) or failed with a
 * reason, and nothing is half-made: the node's sandbox directories, crun containers, cgroups and
 * rootfs mounts are exactly those of the running sandboxes, and every image is whole (its
 * manifest reads and its layers exist).
 *
 * CI: 8 crash points; DSEC_SOAK=1: 40 (DSEC_CRASH_POINTS overrides). The seed is printed.
 */
import assert from 'node:assert/strict';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { readMounts } from '../../src/host/mounts.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';

const long = process.env['DSEC_SOAK'] === '1';
const points = Number(process.env['DSEC_CRASH_POINTS'] ?? (long ? 40 : 8));
const seed = Number(process.env['DSEC_CRASH_SEED'] ?? Date.now() % 1_000_000);
const MAIN = new URL('../../src/cli/main.js', import.meta.url).pathname;

/** A small deterministic PRNG, so a failing run can be repeated with DSEC_CRASH_SEED. */
function prng(s: number): () => number {
  let x = s || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return ((x >>> 0) % 1_000_000) / 1_000_000;
  };
}

describe(`crash points: ${points} kill -9 of dsec up mid-operation (seed ${seed})`, { skip: integrationSkipReason(), timeout: long ? 3 * 3600_000 : 900_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let child: ChildProcess | undefined;
  let conn = { url: '', apiKey: '' };
  const rand = prng(seed);
  const report: string[] = [];

  async function api(method: string, path: string, json?: unknown, timeoutMs = 120_000): Promise<{ status: number; body: unknown }> {
    const res = await fetch(conn.url + path, {
      method,
      headers: { authorization: `Bearer ${conn.apiKey}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
      ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
      signal: AbortSignal.timeout(timeoutMs),
    });
    const text = await res.text();
    return { status: res.status, body: text ? (JSON.parse(text) as unknown) : undefined };
  }

  async function up(): Promise<void> {
    const clientFile = join(dataDir, 'client.json');
    rmSync(clientFile, { force: true });
    child = spawn(process.execPath, [MAIN, 'up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--edge-id', edgeId, '--log-level', 'error'], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<void>((resolve) => child!.once('exit', () => resolve()));
    for (;;) {
      if (child.exitCode !== null) throw new Error(`dsec up exited ${child.exitCode} at start: ${stderr}`);
      if (existsSync(clientFile)) {
        try {
          conn = JSON.parse(readFileSync(clientFile, 'utf8')) as typeof conn;
          break;
        } catch {
          // being written
        }
      }
      await Promise.race([exited, new Promise((r) => setTimeout(r, 50))]);
    }
  }

  async function crash(): Promise<void> {
    const c = child!;
    const gone = new Promise<void>((resolve) => (c.exitCode !== null || c.signalCode !== null ? resolve() : c.once('exit', () => resolve())));
    c.kill('SIGKILL');
    await gone;
    child = undefined;
  }

  const running = (s: SandboxInfo) => s.status === 'running' || s.status === 'paused';

  /** The node's view of half-made things, compared with the sandboxes the API says run. */
  function nodeState(live: Set<string>): Record<string, string[]> {
    const sandboxesDir = join(dataDir, 'node', 'sandboxes');
    const dirs = existsSync(sandboxesDir) ? readdirSync(sandboxesDir) : [];
    const crun = spawnSync('crun', ['--root', join(dataDir, 'node', 'crun'), 'list', '--format', 'json'], { encoding: 'utf8' });
    const containers = ((JSON.parse(crun.stdout || '[]') as { id: string }[] | null) ?? []).map((c) => c.id);
    const cgroups = existsSync('/sys/fs/cgroup/memory/dsec') ? readdirSync('/sys/fs/cgroup/memory/dsec').filter((n) => n.startsWith(`sb-${edgeId}-`)) : [];
    const rootfs = readMounts()
      .map((m) => m.mountPoint)
      .filter((mp) => mp.startsWith(`${sandboxesDir}/`))
      .map((mp) => mp.slice(sandboxesDir.length + 1).split('/')[0]!);
    const out: Record<string, string[]> = {};
    for (const [k, ids] of Object.entries({ dirs, containers, cgroups, rootfs })) {
      const extra = [...new Set(ids)].filter((id) => !live.has(id));
      const missing = [...live].filter((id) => !ids.includes(id));
      if (extra.length) out[`${k} of no running sandbox`] = extra;
      if (missing.length) out[`${k} missing for a running sandbox`] = missing;
    }
    return out;
  }

  before(async () => {
    dataDir = makeDataDir();
    // Builds the busybox image once, in process; the crashes then hit a `dsec up` child.
    const first = await startDsec(dataDir, { edgeId });
    await first.close();
    await up();
  });
  after(async () => {
    try {
      if (!child) await up();
      const list = (await api('GET', '/v1/sandboxes')).body as { sandboxes: SandboxInfo[] };
      for (const s of list.sandboxes) await api('DELETE', `/v1/sandboxes/${s.id}`);
    } finally {
      // Never leave the child running (its sandboxes stay for an operator if the kills failed).
      const c = child;
      if (c && c.exitCode === null && c.signalCode === null) {
        const gone = new Promise<void>((resolve) => c.once('exit', () => resolve()));
        c.kill('SIGTERM');
        await gone;
      }
    }
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
    console.log(`crash points (seed ${seed}):\n  ${report.join('\n  ')}`);
  });

  test('after every crash and restart nothing is half-made and nothing is lost without a reason', async () => {
    for (let i = 0; i < points; i++) {
      // Something to act on: a sandbox with a change in its writable layer.
      const base = await api('POST', '/v1/sandboxes', { image: 'busybox', labels: { crash: String(i) } });
      assert.equal(base.status, 201, JSON.stringify(base.body));
      const id = (base.body as SandboxInfo).id;
      assert.equal((await api('POST', `/v1/sandboxes/${id}/exec`, { cmd: 'echo changed > /data.txt' })).status, 200);
      const ops = ['create', 'kill', 'snapshot', 'fork'] as const;
      const op = ops[Math.floor(rand() * ops.length)]!;
      const delayMs = Math.floor(rand() * 250);
      const inflight = (
        op === 'create'
          ? api('POST', '/v1/sandboxes', { image: 'busybox' })
          : op === 'kill'
            ? api('DELETE', `/v1/sandboxes/${id}`)
            : op === 'snapshot'
              ? api('POST', `/v1/sandboxes/${id}/snapshot`, { name: `crash-${i}` })
              : api('POST', `/v1/sandboxes/${id}/fork`, { count: 2 })
      ).catch((err: unknown) => ({ status: 0, body: (err as Error).message }));
      await new Promise((r) => setTimeout(r, delayMs));
      await crash();
      const answer = await inflight;
      await up();

      const list = ((await api('GET', '/v1/sandboxes')).body as { sandboxes: SandboxInfo[] }).sandboxes;
      const bad = list.filter((s) => !running(s) && !(s.status === 'failed' && s.reason) && s.status !== 'stopped');
      assert.deepEqual(
        bad.map((s) => [s.id, s.status, s.reason]),
        [],
        `point ${i} (${op} after ${delayMs} ms): sandboxes neither running nor failed with a reason`,
      );
      const live = new Set(list.filter(running).map((s) => s.id));
      assert.deepEqual(nodeState(live), {}, `point ${i} (${op} after ${delayMs} ms): half-made sandboxes on the node`);
      const images = await api('GET', '/v1/images');
      assert.equal(images.status, 200, `point ${i}: the image list fails: ${JSON.stringify(images.body)}`);
      for (const img of (images.body as { images: { id: string; layers: string[] }[] }).images) {
        for (const l of img.layers) assert.ok(existsSync(join(dataDir, 'layers', `${l.slice('sha256:'.length)}.erofs`)), `point ${i}: image ${img.id} lacks layer ${l}`);
      }
      // Whatever is running still works.
      for (const s of list.filter((x) => x.status === 'running')) {
        const r = await api('POST', `/v1/sandboxes/${s.id}/exec`, { cmd: ['true'] });
        assert.equal(r.status, 200, `point ${i}: adopted sandbox ${s.id} does not run commands: ${JSON.stringify(r.body)}`);
      }
      report.push(`${i}: ${op} killed after ${delayMs} ms (answer before the crash: ${answer.status || 'none'}); after restart ${live.size} running, ${list.length - live.size} failed/other`);
      // Keep the node small: the next point starts from few sandboxes.
      for (const s of list) if (!running(s) || rand() < 0.5) await api('DELETE', `/v1/sandboxes/${s.id}`);
    }
  });
});
