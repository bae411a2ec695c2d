/**
 * Crash points: `dsec up` runs as a child process and is killed with SIGKILL at a random moment
 * while a create, kill, snapshot or fork is in flight; then it is started again on the same data
 * dir. After every restart: each sandbox the API lists is running (or paused) or failed with a
 * reason, and nothing is half-made: the node's sandbox directories, crun containers, cgroups and
 * rootfs mounts are exactly those of the running sandboxes, and every image is whole (its
 * manifest reads and its layers exist).
 *
 * CI: 8 crash points; DSEC_SOAK=1: 40 (DSEC_CRASH_POINTS overrides). The seed is printed.
 * Its three suites (sandbox operations, image import and build, an edge daemon) are one concept,
 * kill -9 mid-operation, and share the seed and its PRNG; what a crash may leave half-made on the
 * node is half-made.ts's, which the kill -9 soak shares.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { freeze } from '../../src/host/freezer.js';
import { OWNED_STAGING, stagingOwnerGone } from '../../src/image/staging.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { dockerSaveTar, writeOciLayout, type FixtureEntry, type FixtureImage } from '../state/fixtures/oci.js';
import { ClusterHarness } from '../cluster/support/cluster-harness.js';
import { DsecUpChild } from './dsec-up-child.js';
import { halfMade } from './half-made.js';
import { api } from './restart-load.js';

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

describe(
  `crash points: ${points} kill -9 of dsec up mid-operation (seed ${seed})`,
  { skip: integrationSkipReason(), timeout: long ? 3 * 3600_000 : 900_000 },
  () => {
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
      child = spawn(
        process.execPath,
        [MAIN, 'up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--edge-id', edgeId, '--log-level', 'error'],
        { stdio: ['ignore', 'ignore', 'pipe'] },
      );
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
      const gone = new Promise<void>((resolve) =>
        c.exitCode !== null || c.signalCode !== null ? resolve() : c.once('exit', () => resolve()),
      );
      c.kill('SIGKILL');
      await gone;
      child = undefined;
    }

    const running = (s: SandboxInfo) => s.status === 'running' || s.status === 'paused';

    const nodeState = (live: Set<string>): Record<string, string[]> => halfMade(dataDir, edgeId, live);

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

    /** A command in sandbox `id` runs and exits 0 well within its timeout. */
    async function assertRunsCommands(id: string, where: string): Promise<void> {
      const r = await api('POST', `/v1/sandboxes/${id}/exec`, { cmd: ['true'], timeoutMs: 20_000 });
      const result = r.body as { exitCode?: number; timedOut?: boolean };
      assert.equal(r.status, 200, `${where}: adopted sandbox ${id} does not run commands: ${JSON.stringify(r.body)}`);
      assert.ok(
        result.exitCode === 0 && !result.timedOut,
        `${where}: a command in adopted sandbox ${id} did not run: ${JSON.stringify(r.body)}`,
      );
    }

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
        const restarted = performance.now();
        await up();
        const upMs = performance.now() - restarted;

        // A create in flight at the crash stays `creating` until its lease runs out (10 s, see
        // control/create-leases.ts); then it is taken over: running, or failed with the reason.
        let list: SandboxInfo[] = [];
        for (let t = 0; ; t++) {
          list = ((await api('GET', '/v1/sandboxes')).body as { sandboxes: SandboxInfo[] }).sandboxes;
          if (!list.some((s) => s.status === 'creating') || t >= 600) break;
          await new Promise((r) => setTimeout(r, 100));
        }
        const settledMs = performance.now() - restarted;
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
          for (const l of img.layers)
            assert.ok(
              existsSync(join(dataDir, 'layers', `${l.slice('sha256:'.length)}.erofs`)),
              `point ${i}: image ${img.id} lacks layer ${l}`,
            );
        }
        // Whatever is running still works: the command runs and ends (a sandbox the edge left
        // frozen answered 200 too, with timedOut, after the whole timeout).
        for (const s of list.filter((x) => x.status === 'running'))
          await assertRunsCommands(s.id, `point ${i} (${op} after ${delayMs} ms)`);
        report.push(
          `${i}: ${op} killed after ${delayMs} ms (answer before the crash: ${answer.status || 'none'}); after restart ${live.size} running, ${list.length - live.size} failed/other; up again in ${(upMs / 1000).toFixed(1)} s, nothing creating after ${(settledMs / 1000).toFixed(1)} s, point done after ${((performance.now() - restarted) / 1000).toFixed(1)} s`,
        );
        // Keep the node small: the next point starts from few sandboxes.
        for (const s of list) if (!running(s) || rand() < 0.5) await api('DELETE', `/v1/sandboxes/${s.id}`);
      }
    });

    test("a sandbox frozen for a snapshot's copy when dsec up dies runs on after the restart (not adopted paused)", async () => {
      const made = await api('POST', '/v1/sandboxes', { image: 'busybox', labels: { crash: 'held' } });
      assert.equal(made.status, 201, JSON.stringify(made.body));
      const id = (made.body as SandboxInfo).id;
      // The state a snapshot's copy holds it in (container-snapshot.ts): marked, then frozen. A
      // kill -9 lands inside that window only by chance; here it is made to.
      writeFileSync(join(dataDir, 'node', 'sandboxes', id, 'quiesced'), '');
      await freeze(id);
      await crash();
      await up();
      const info = (await api('GET', `/v1/sandboxes/${id}`)).body as SandboxInfo;
      assert.equal(info.status, 'running');
      await assertRunsCommands(id, 'after the restart');
      assert.ok(!existsSync(join(dataDir, 'node', 'sandboxes', id, 'quiesced')), 'the marker goes with the thaw');
      await api('DELETE', `/v1/sandboxes/${id}`);
    });
  },
);

const imagePoints = Number(process.env['DSEC_CRASH_IMAGE_POINTS'] ?? (long ? 24 : 6));

/**
 * kill -9 inside `dsec image import` (an OCI layout, a `docker save` tar) and inside a Dockerfile
 * build (`dsec image build -f`, RUN steps in real sandboxes of a running `dsec up`; at some points
 * `dsec up` is killed with it and started again). After each: every image is whole or absent, no
 * staging of the killed process is left in the store's tmp dir, no build sandbox is left (the
 * control plane kills those of a builder that is gone), nothing is half-made on the node, and the
 * same import or build run again succeeds and its image runs.
 */
describe(
  `crash points: ${imagePoints} kill -9 inside image import and Dockerfile build (seed ${seed})`,
  { skip: integrationSkipReason(), timeout: long ? 3 * 3600_000 : 900_000 },
  () => {
    const edgeId = newEdgeId();
    let dataDir = '';
    let fixtures = '';
    let up: DsecUpChild | undefined;
    const rand = prng(seed + 1);
    const report: string[] = [];

    before(async () => {
      dataDir = makeDataDir();
      await (await startDsec(dataDir, { edgeId })).close();
      fixtures = mkdtempSync(join(tmpdir(), 'dsec-crash-fixtures-'));
      writeImportFixtures(fixtures);
      up = new DsecUpChild(dataDir, edgeId);
      await up.start();
    });
    after(async () => {
      try {
        if (up && !up.running) await up.start();
        const list = (await api(up!.conn, 'GET', '/v1/sandboxes')).body as { sandboxes?: SandboxInfo[] };
        for (const s of list.sandboxes ?? []) await api(up!.conn, 'DELETE', `/v1/sandboxes/${s.id}`);
      } finally {
        if (up?.running) await up.stop();
      }
      if (fixtures) rmSync(fixtures, { recursive: true, force: true });
      if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
      console.log(`image crash points (seed ${seed}):\n  ${report.join('\n  ')}`);
    });

    /** Starts the dsec CLI on the data dir: its pid, and its exit (code or signal) with its stderr. */
    function cli(args: string[]): {
      pid: number;
      done: Promise<{ code: number | null; signal: string | null; pid: number; stderr: string }>;
    } {
      const child = spawn(process.execPath, [MAIN, ...args, '--data-dir', dataDir], { stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
      const done = once(child, 'exit').then(([code, signal]) => ({
        code: code as number | null,
        signal: signal as string | null,
        pid: child.pid!,
        stderr,
      }));
      return { pid: child.pid!, done };
    }

    /** kill -9 of a CLI run (it may have finished already). */
    function kill9(pid: number): void {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // exited by itself
      }
    }

    /** Every image the API lists is whole: its manifest reads and each layer it names is in the store. */
    async function imagesWhole(at: string): Promise<{ id: string; names?: string[] }[]> {
      const images = await api(up!.conn, 'GET', '/v1/images');
      assert.equal(images.status, 200, `${at}: the image list fails: ${JSON.stringify(images.body)}`);
      const list = (images.body as { images: { id: string; names?: string[]; layers: string[] }[] }).images;
      for (const img of list) {
        for (const l of img.layers)
          assert.ok(existsSync(join(dataDir, 'layers', `${l.slice('sha256:'.length)}.erofs`)), `${at}: image ${img.id} lacks layer ${l}`);
      }
      return list;
    }

    /** Runs `cmd` in a fresh sandbox of `image` and returns its stdout. */
    async function runIn(image: string, cmd: string[]): Promise<string> {
      const sb = await api(up!.conn, 'POST', '/v1/sandboxes', { image });
      assert.equal(sb.status, 201, `create from ${image}: ${JSON.stringify(sb.body)}`);
      const id = (sb.body as SandboxInfo).id;
      try {
        const r = await api(up!.conn, 'POST', `/v1/sandboxes/${id}/exec`, { cmd });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        return (r.body as { stdout: string }).stdout;
      } finally {
        await api(up!.conn, 'DELETE', `/v1/sandboxes/${id}`);
      }
    }

    test('after each kill -9 every image is whole or absent, nothing of the killed job is left, and a retry succeeds', async () => {
      const kinds = ['oci-import', 'docker-save-import', 'build', 'build and dsec up'] as const;
      for (let i = 0; i < imagePoints; i++) {
        const kind = kinds[i % kinds.length]!;
        const name = `crash-${kind.split(' ')[0]}-${i}`;
        const isBuild = kind.startsWith('build');
        const args = isBuild
          ? ['image', 'build', '-f', join(fixtures, 'ctx', 'Dockerfile'), join(fixtures, 'ctx'), '--name', name, '--no-cache']
          : ['image', 'import', join(fixtures, kind === 'oci-import' ? 'layout' : 'saved.tar'), '--name', name];
        // The kill lands inside the work, not in the CLI's start-up: an import's once its staging
        // dir exists, after up to 1 s more (imports take about a second here); a build's once its
        // first RUN sandbox exists, after up to 3 s more.
        const delayMs = Math.floor(rand() * (isBuild ? 3000 : 1000));
        const at = `point ${i} (${kind}, killed ${delayMs} ms into ${isBuild ? 'its RUN steps' : 'the import'})`;
        const run = cli(args);
        let exited = false;
        void run.done.then(() => (exited = true));
        if (isBuild) {
          const buildSandboxes = async (): Promise<SandboxInfo[]> =>
            ((await api(up!.conn, 'GET', '/v1/sandboxes?label=dsec.build=dockerfile')).body as { sandboxes: SandboxInfo[] }).sandboxes;
          while (!exited && (await buildSandboxes()).length === 0) await new Promise((r) => setTimeout(r, 20));
        } else {
          const staging = (): boolean => readdirSync(join(dataDir, 'tmp')).some((n) => n.startsWith('import-'));
          while (!exited && !staging()) await new Promise((r) => setTimeout(r, 5));
        }
        await new Promise((r) => setTimeout(r, delayMs));
        kill9(run.pid);
        if (kind === 'build and dsec up') await up!.crash();
        const first = await run.done;
        if (!up!.running) await up!.start();

        // Build sandboxes of a builder that is gone are killed by the control plane (at its start,
        // then every 10 s): wait for that, then nothing may be half-made.
        for (let t = 0; ; t++) {
          const left = ((await api(up!.conn, 'GET', '/v1/sandboxes?label=dsec.build=dockerfile')).body as { sandboxes: SandboxInfo[] })
            .sandboxes;
          if (left.length === 0) break;
          assert.ok(t < 600, `${at}: build sandboxes still there after 60 s: ${left.map((s) => `${s.id} ${s.status}`).join(', ')}`);
          await new Promise((r) => setTimeout(r, 100));
        }
        const list = ((await api(up!.conn, 'GET', '/v1/sandboxes')).body as { sandboxes: SandboxInfo[] }).sandboxes;
        const live = new Set(list.filter((s) => s.status === 'running' || s.status === 'paused').map((s) => s.id));
        assert.deepEqual(halfMade(dataDir, edgeId, live), {}, `${at}: half-made sandboxes on the node`);
        const named = (await imagesWhole(at)).some((img) => img.names?.some((n) => n.startsWith(name)));

        // The retry opens the store, which removes the scratch of owners that are gone.
        const retry = await cli(args).done;
        assert.equal(retry.code, 0, `${at}: the retry failed: ${retry.stderr}`);
        const staging = readdirSync(join(dataDir, 'tmp'));
        // Whatever is left must belong to a process that still runs (no import or build does now).
        const orphaned = staging.filter((n) => !OWNED_STAGING.test(n) || stagingOwnerGone(n));
        assert.deepEqual(orphaned, [], `${at}: staging of the killed job (pid ${first.pid}) is left in ${join(dataDir, 'tmp')}`);
        await imagesWhole(`${at}, after the retry`);
        const out = isBuild ? await runIn(name, ['cat', '/all']) : await runIn(name, ['sh', '-c', 'cat /marker; wc -c < /big/0']);
        assert.equal(out, isBuild ? 'one\ntwo\npayload\n' : `marker\n${4 << 20}\n`, `${at}: the image made by the retry is not whole`);
        report.push(
          `${i}: ${kind} killed ${delayMs} ms into its work (${first.signal ?? `exit ${first.code}`}); image ${named ? 'whole' : 'absent'} after the crash; retry ok`,
        );
      }
    });
  },
);

/** An OCI layout and a `docker save` tar of busybox with a marker and 3 × 4 MiB of random data, and a Dockerfile build context. */
function writeImportFixtures(dir: string): void {
  const busybox = readFileSync('/bin/busybox');
  const base: FixtureEntry[] = [
    { name: 'bin/', type: 'dir' },
    { name: 'bin/busybox', data: busybox, mode: 0o755 },
    ...['sh', 'cat', 'wc'].map((a): FixtureEntry => ({ name: `bin/${a}`, type: 'symlink', linkname: 'busybox' })),
    { name: 'marker', data: 'marker\n' },
  ];
  const big = (n: number): FixtureEntry[] => [
    { name: 'big/', type: 'dir' },
    { name: `big/${n}`, data: randomBytes(4 << 20) },
  ];
  const img: FixtureImage = {
    layers: [base, big(0), big(1), big(2)],
    config: { Env: ['PATH=/bin'], Cmd: ['/bin/sh'] },
    refName: 'crash:1',
  };
  writeOciLayout(join(dir, 'layout'), img);
  writeFileSync(join(dir, 'saved.tar'), dockerSaveTar(img));
  mkdirSync(join(dir, 'ctx'));
  writeFileSync(join(dir, 'ctx', 'data.txt'), 'payload\n');
  writeFileSync(
    join(dir, 'ctx', 'Dockerfile'),
    'FROM busybox\nRUN echo one > /one && sleep 0.3\nRUN echo two > /two\nCOPY data.txt /data.txt\nRUN cat /one /two /data.txt > /all\n',
  );
}

const edgePoints = Number(process.env['DSEC_CRASH_EDGE_POINTS'] ?? (long ? 20 : 3));

/**
 * kill -9 of a `dsec edge` daemon alone (cluster mode) while creates are in flight on it; the
 * edge is started again. Then every sandbox the control plane lists is running (re-adopted) or
 * failed with a reason, none is left creating, the edge's node holds exactly the running ones,
 * and each running one runs a command.
 */
describe(
  `crash points: ${edgePoints} kill -9 of a dsec edge daemon mid-create (seed ${seed})`,
  { skip: integrationSkipReason(), timeout: long ? 3 * 3600_000 : 900_000 },
  () => {
    const h = new ClusterHarness();
    const rand = prng(seed + 2);
    const report: string[] = [];

    before(async () => {
      await h.start(1, { lostAfterMs: 120_000 });
    });
    after(async () => {
      await h.close();
      for (const e of h.edges) await assertCleanAndRemove(e.dataDir, e.id);
      await assertCleanAndRemove(h.controlDir, 'none');
      console.log(`edge crash points (seed ${seed}):\n  ${report.join('\n  ')}`);
    });

    test('creates in flight come back running or failed with a reason; nothing half-made', async () => {
      const e = h.edges[0]!;
      for (let i = 0; i < edgePoints; i++) {
        const delayMs = Math.floor(rand() * 1500);
        const at = `point ${i} (edge killed after ${delayMs} ms)`;
        const creates = Array.from({ length: 4 }, () =>
          api(h.conn, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { point: String(i) } }).catch((err: unknown) => ({
            status: 0,
            body: { error: { message: (err as Error).message } },
          })),
        );
        await new Promise((r) => setTimeout(r, delayMs));
        await h.crash(e.proc);
        const answers = await Promise.all(creates);
        await h.startEdge(e);
        await h.waitFor(async () => (await h.nodes()).some((n) => n.id === e.id && n.state === 'ready'), 'the restarted edge reports');
        // Creates the edge never finished settle once it reports again (reconcile, the create's own error).
        let list: SandboxInfo[] = [];
        await h.waitFor(async () => {
          list = ((await api(h.conn, 'GET', '/v1/sandboxes')).body as { sandboxes: SandboxInfo[] }).sandboxes;
          return !list.some((s) => s.status === 'creating');
        }, `${at}: no create left creating`);
        const bad = list.filter((s) => !(s.status === 'running' || s.status === 'paused') && !(s.status === 'failed' && s.reason));
        assert.deepEqual(
          bad.map((s) => [s.id, s.status, s.reason]),
          [],
          `${at}: sandboxes neither running nor failed with a reason`,
        );
        for (const a of answers) {
          if (a.status !== 201) continue;
          const id = (a.body as unknown as SandboxInfo).id;
          const s = list.find((x) => x.id === id);
          assert.ok(
            s && (s.status === 'running' || (s.status === 'failed' && s.reason)),
            `${at}: ${id} was created (201) and is now ${s ? `${s.status} ${s.reason ?? ''}` : 'gone'}`,
          );
        }
        const live = new Set(list.filter((s) => s.status === 'running' || s.status === 'paused').map((s) => s.id));
        // A create the killed edge finished but never answered is failed here and runs there until
        // the control plane reconciles the edge that registered again (in the background): wait
        // for that (bounded), then nothing may be left.
        for (let t = 0; t < 300 && Object.keys(halfMade(e.dataDir, e.id, live)).length; t++) await new Promise((r) => setTimeout(r, 100));
        assert.deepEqual(halfMade(e.dataDir, e.id, live), {}, `${at}: half-made sandboxes on the edge's node`);
        for (const id of live) {
          const r = await api(h.conn, 'POST', `/v1/sandboxes/${id}/exec`, { cmd: ['true'] });
          assert.equal(r.status, 200, `${at}: ${id} does not run commands: ${JSON.stringify(r.body)}`);
        }
        const failed = list.filter((s) => s.status === 'failed');
        report.push(
          `${i}: edge killed after ${delayMs} ms; answers ${answers.map((a) => a.status).join(',')}; after restart ${live.size} running, ${failed.length} failed (${[...new Set(failed.map((s) => s.reason))].join(' | ')})`,
        );
        for (const s of list) await api(h.conn, 'DELETE', `/v1/sandboxes/${s.id}`);
      }
    });
  },
);
