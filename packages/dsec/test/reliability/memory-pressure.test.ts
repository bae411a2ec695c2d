/**
 * Memory pressure: a node with little memory, made for real without touching the shared host. The
 * test makes a v1 memory cgroup of its own and runs `dsec up` in it, in a mount namespace where
 * that cgroup is bound over /sys/fs/cgroup/memory — as an edge in a container sees its container's
 * cgroup as the root — so dsec and every sandbox it makes are charged to it. With the cgroup's
 * limit set a little above what dsec uses, sandboxes fill it (tmpfs pages in /dev/shm):
 * - below the edge's floor (--min-available-memory-mib) a create answers 503 NODE_MEMORY_PRESSURE,
 *   naming the cgroup, and leaves no sandbox row or directory;
 * - a command that allocates past what the node has left is OOM-killed, not dsec: the kernel
 *   picks the sandbox's process (oom_score_adj +500, node-memory.ts) and the exec result says
 *   `oomKilled`, exit 137; dsec answers on, every sandbox still runs commands. A command past its
 *   own sandbox's limit is reported the same way;
 * - once sandboxes end, creates work again; nothing is corrupted (SQLite integrity_check, image
 *   manifests and layers, the layer cache) and nothing is left on the node.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import Database from 'better-sqlite3';
import { DsecError, Sandbox } from '@dsec/sdk';
import { ImageStore } from '../../src/image/image-store.js';
import { LayerStore, sha256File } from '../../src/image/layer-store.js';
import { cgroupHeadroomBytes } from '../../src/host/node-memory.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { TEST_STORE_POSTGRES } from '../helpers/postgres.js';
import { MAIN } from './dsec-up-child.js';

const MEMORY_ROOT = '/sys/fs/cgroup/memory';
const MIB = 1024 * 1024;
const FLOOR_MIB = 128;
const FILL_MIB = 48;

function skipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (TEST_STORE_POSTGRES) return 'checks the SQLite store after the run';
  if (!existsSync(join(MEMORY_ROOT, 'memory.limit_in_bytes')))
    return `needs a cgroup v1 memory hierarchy at ${MEMORY_ROOT} (this host's layout)`;
  return undefined;
}

const num = (file: string): number => Number(readFileSync(file, 'utf8').trim());

/** What the cgroup holds that cannot simply be dropped: usage less inactive page cache. */
function workingSet(cg: string): number {
  const inactive = Number(/^total_inactive_file (\d+)$/m.exec(readFileSync(join(cg, 'memory.stat'), 'utf8'))?.[1] ?? 0);
  return num(join(cg, 'memory.usage_in_bytes')) - inactive;
}

async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    if (err instanceof DsecError) return `${err.status} ${err.code}: ${err.message}`;
    throw err;
  }
}

/** `dsec up` charged to `cg`: in a mount namespace of its own where `cg` is /sys/fs/cgroup/memory. */
async function startUpInCgroup(
  cg: string,
  dataDir: string,
  edgeId: string,
): Promise<{ child: ChildProcess; conn: { url: string; apiKey: string }; stderr: () => string }> {
  const clientFile = join(dataDir, 'client.json');
  rmSync(clientFile, { force: true });
  const script = `mount --bind "$0" ${MEMORY_ROOT} && echo $$ > ${MEMORY_ROOT}/cgroup.procs && exec "$@"`;
  const child = spawn(
    'unshare',
    [
      '-m',
      'sh',
      '-c',
      script,
      cg,
      process.execPath,
      MAIN,
      'up',
      '--data-dir',
      dataDir,
      '--listen',
      '127.0.0.1:0',
      '--edge-id',
      edgeId,
      '--log-level',
      'warn',
      '--min-available-memory-mib',
      String(FLOOR_MIB),
      '--max-memory-pressure',
      '0',
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  for (;;) {
    if (child.exitCode !== null) throw new Error(`dsec up exited ${child.exitCode} at start: ${stderr}`);
    if (existsSync(clientFile)) {
      try {
        const { url, apiKey } = JSON.parse(readFileSync(clientFile, 'utf8')) as { url: string; apiKey: string };
        return { child, conn: { url, apiKey }, stderr: () => stderr };
      } catch {
        // being written
      }
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe('memory pressure: dsec and its sandboxes in a small memory cgroup', { skip: skipReason(), timeout: 300_000 }, () => {
  test("creates are refused with 503 NODE_MEMORY_PRESSURE, an OOM kills the sandbox's command and not dsec, nothing is corrupted", async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    const cg = join(MEMORY_ROOT, `dsec-test-mem-${edgeId}`);
    // Builds the busybox image in process first; the pressure then hits a `dsec up` child.
    await (await startDsec(dataDir, { edgeId })).close();
    mkdirSync(cg);
    let up: Awaited<ReturnType<typeof startUpInCgroup>> | undefined;
    try {
      up = await startUpInCgroup(cg, dataDir, edgeId);
      const { conn } = up;
      const dsecPid = up.child.pid!;
      const sandboxDirs = (): string[] =>
        readdirSync(join(dataDir, 'node', 'sandboxes'))
          .filter((d) => d.startsWith('sb-'))
          .sort();

      const hog = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 2048 } });
      const small = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 } });
      assert.ok(existsSync(join(cg, 'dsec', hog.id)), "the sandbox's memory cgroup is inside the test's");
      // Sandboxes' processes are the OOM killer's first choice; dsec's are not raised (lowered where it may).
      assert.equal(
        (await hog.commands.run(['cat', '/proc/self/oom_score_adj', '/proc/1/oom_score_adj'])).stdout,
        '500\n500\n',
        'a command and the init run at +500',
      );
      assert.ok(Number(readFileSync(`/proc/${dsecPid}/oom_score_adj`, 'utf8')) <= 0, 'dsec runs at an OOM score at or below 0');

      // The node: what dsec and the two sandboxes hold now, the floor, and room for about two fills.
      const limit = workingSet(cg) + (FLOOR_MIB + 2 * FILL_MIB + FILL_MIB / 2) * MIB;
      writeFileSync(join(cg, 'memory.limit_in_bytes'), String(limit));
      console.log(
        `memory pressure: node cgroup limit ${Math.round(limit / MIB)} MiB, headroom ${Math.round((cgroupHeadroomBytes(cg) ?? 0) / MIB)} MiB`,
      );

      // 1. Sandboxes fill the node until the edge refuses the next create.
      const fillers: Sandbox[] = [];
      let refused = '';
      for (let i = 0; i < 8 && !refused; i++) {
        const dirsBefore = sandboxDirs();
        const r = await outcome(Sandbox.create({ ...conn, image: 'busybox' }).then((sb) => fillers.push(sb)));
        if (r === 'ok') {
          const fill = await fillers.at(-1)!.commands.run(['dd', 'if=/dev/zero', 'of=/dev/shm/fill', 'bs=1M', `count=${FILL_MIB}`]);
          assert.equal(fill.exitCode, 0, fill.stderr);
        } else {
          refused = r;
          assert.deepEqual(sandboxDirs(), dirsBefore, 'the refused create left no sandbox directory');
        }
      }
      assert.ok(fillers.length >= 1, 'the node took sandboxes before it was full');
      assert.match(
        refused,
        new RegExp(
          `^503 NODE_MEMORY_PRESSURE: edge ${edgeId}: \\d+ MiB of memory available \\(the memory cgroup ${MEMORY_ROOT}\\), below the ${FLOOR_MIB} MiB a create needs \\(--min-available-memory-mib\\); end or pause sandboxes`,
        ),
      );
      const listed = (await Sandbox.list(conn)).map((s) => s.id).sort();
      assert.deepEqual(listed, [hog, small, ...fillers].map((s) => s.id).sort(), 'the refused create left no sandbox row');

      // 2. A command that takes more than the node has left: the kernel kills it, not dsec.
      const oom = await hog.commands.run(['sh', '-c', `awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'`], { timeoutMs: 120_000 });
      assert.equal(oom.oomKilled, true, JSON.stringify(oom));
      assert.equal(oom.exitCode, 137, JSON.stringify(oom));
      assert.equal(up.child.exitCode, null, `dsec up died: ${up.stderr()}`);
      assert.ok(existsSync(`/proc/${dsecPid}`), 'dsec is alive');
      // Past its own limit (32 MiB), a command is reported the same way.
      const own = await small.commands.run(['sh', '-c', `awk 'BEGIN { s = "xxxxxxxxxxxxxxxx"; while (1) s = s s }'`], {
        timeoutMs: 120_000,
      });
      assert.equal(own.oomKilled, true, JSON.stringify(own));
      assert.equal(own.exitCode, 137, JSON.stringify(own));
      for (const sb of [hog, small, ...fillers])
        assert.equal((await sb.commands.run(['echo', 'alive'])).stdout, 'alive\n', `sandbox ${sb.id} after the OOM`);
      assert.ok(num(join(cg, 'memory.failcnt')) > 0, 'the node cgroup did reach its limit');

      // 3. Memory freed: creates work again.
      for (const sb of fillers) await sb.kill();
      const after = await Sandbox.create({ ...conn, image: 'busybox' });
      assert.equal((await after.commands.run(['echo', 'again'])).stdout, 'again\n');
      for (const sb of [hog, small, after]) await sb.kill();
      assert.deepEqual(sandboxDirs(), [], 'no sandbox directory left');
      const mountinfo = readFileSync(`/proc/${dsecPid}/mountinfo`, 'utf8');
      assert.ok(!mountinfo.includes(join(dataDir, 'node', 'sandboxes') + '/sb-'), "no sandbox mount left in dsec's mount namespace");
    } finally {
      if (up && up.child.exitCode === null) {
        // On a failure, the sandboxes still there are killed before dsec stops (they would run on).
        for (const s of await Sandbox.list(up.conn).catch(() => []))
          await (await Sandbox.connect(s.id, up.conn)).kill().catch(() => undefined);
        const c = up.child;
        const gone = new Promise<void>((resolve) => c.once('exit', () => resolve()));
        c.kill('SIGTERM');
        await gone;
      }
      // crun's cgroups of killed sandboxes are gone; only the parent it made is left to remove.
      const left = existsSync(join(cg, 'dsec'))
        ? readdirSync(join(cg, 'dsec'), { withFileTypes: true })
            .filter((d) => d.isDirectory())
            .map((d) => d.name)
        : [];
      if (existsSync(join(cg, 'dsec')) && left.length === 0) rmdirSync(join(cg, 'dsec'));
      if (left.length === 0) rmdirSync(cg);
      assert.deepEqual(left, [], 'sandbox memory cgroups left in the test cgroup');
    }

    // 4. Nothing is corrupted.
    const db = new Database(join(dataDir, 'state.db'), { readonly: true });
    try {
      assert.equal(db.pragma('integrity_check', { simple: true }), 'ok');
    } finally {
      db.close();
    }
    const layers = new LayerStore(dataDir);
    for (const img of new ImageStore(dataDir, layers).list()) {
      for (const digest of img.layers)
        assert.equal(await sha256File(layers.path(digest as `sha256:${string}`)), digest, `image ${img.id}'s layer ${digest}`);
    }
    const cache = join(dataDir, 'node', 'layer-cache');
    for (const f of existsSync(cache) ? readdirSync(cache) : []) {
      const p = join(cache, f);
      if (statSync(p).isFile()) assert.equal(await sha256File(p), `sha256:${f.replace(/\.erofs$/, '')}`, `layer cache file ${f}`);
    }
    await assertCleanAndRemove(dataDir, edgeId);
  });
});
