/**
 * A full node's mounts stay out of crun's start (issue 12). The edge's mount namespace holds
 * every sandbox's root (an overlay, its user namespace file, volumes), and `crun run -d` clones
 * the namespace it runs in: run there, each create copies every mount the node holds. dsec-spawn
 * starts crun instead in a copy of its small template namespace with the sandbox's dirs carried
 * in (native/spawn-helper.c, `carry`).
 *
 * Real, without touching the host's namespace: `dsec up` runs in a private mount namespace of its
 * own, with a `crun` first on its PATH that writes how many mounts the namespace it runs in holds
 * and then execs the real crun. The test fills that namespace with tmpfs mounts: some below the
 * node's sandboxes dir before the helper starts (an edge restarted beside live sandboxes: left
 * out of the template), more elsewhere after it (sandboxes made since: never in the template).
 * Each create's crun then sees a few dozen mounts, not thousands, and the sandboxes work.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { Sandbox, Volume } from '@dsec/sdk';
import { TEST_USERNS, assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { TEST_STORE_POSTGRES } from '../helpers/postgres.js';
import { MAIN } from '../reliability/dsec-up-child.js';

const EXTRA = 1500;

function skipReason(): string | undefined {
  return integrationSkipReason() ?? (TEST_STORE_POSTGRES ? 'runs dsec up on its own SQLite store' : undefined);
}

const mountCount = (pid: number): number => readFileSync(`/proc/${pid}/mountinfo`, 'utf8').trim().split('\n').length;

/** `count` tmpfs mounts below `dir`, made in the mount namespace of `pid`. */
function mountTmpfsMany(pid: number, dir: string, count: number): void {
  execFileSync('nsenter', [
    '-t',
    String(pid),
    '-m',
    'sh',
    '-c',
    `i=0; while [ $i -lt ${count} ]; do mkdir -p "$0/$i" && mount -t tmpfs -o size=64k extra "$0/$i" || exit 1; i=$((i+1)); done`,
    dir,
  ]);
}

describe('crun starts sandboxes from a small mount namespace', { skip: skipReason(), timeout: 300_000 }, () => {
  test(`with ${2 * EXTRA} extra mounts in the edge's namespace, crun's namespace holds few; the sandboxes work and nothing is left`, async () => {
    const dataDir = makeDataDir();
    const edgeId = newEdgeId();
    await (await startDsec(dataDir, { edgeId })).close(); // builds the busybox image
    const shimDir = join(dataDir, 'shim');
    const countsFile = join(dataDir, 'crun-run-mounts');
    const realCrun = execFileSync('sh', ['-c', 'command -v crun'], { encoding: 'utf8' }).trim();
    mkdirSync(shimDir);
    writeFileSync(
      join(shimDir, 'crun'),
      `#!/bin/sh\nfor a; do if [ "$a" = run ]; then wc -l < /proc/self/mountinfo >> ${countsFile}; break; fi; done\nexec ${realCrun} "$@"\n`,
    );
    chmodSync(join(shimDir, 'crun'), 0o755);
    const clientFile = join(dataDir, 'client.json');
    rmSync(clientFile, { force: true });
    const args = [
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
      ...(TEST_USERNS ? [] : ['--no-userns']),
    ];
    const child: ChildProcess = spawn('unshare', ['-m', '--propagation', 'private', process.execPath, ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
      env: { ...process.env, PATH: `${shimDir}:${process.env['PATH']}` },
    });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const extraBelow = join(dataDir, 'node', 'sandboxes', 'extra-mounts');
    const extraAfter = join(dataDir, 'extra-mounts');
    let conn = { url: '', apiKey: '' };
    try {
      while (!conn.url) {
        if (child.exitCode !== null) throw new Error(`dsec up exited ${child.exitCode}: ${stderr}`);
        try {
          const { url, apiKey } = JSON.parse(readFileSync(clientFile, 'utf8')) as typeof conn;
          conn = { url, apiKey };
        } catch {
          await new Promise((r) => setTimeout(r, 50)); // not written yet, or being written
        }
      }
      const pid = child.pid!;
      const counts = (): number[] => (existsSync(countsFile) ? readFileSync(countsFile, 'utf8').trim().split('\n').map(Number) : []);

      // Below the sandboxes dir before the first create (the helper, and its template, start then).
      mountTmpfsMany(pid, extraBelow, EXTRA);
      const first = await Sandbox.create({ ...conn, image: 'busybox' });
      // Elsewhere, after the template was made, as a filling node's sandboxes are.
      mountTmpfsMany(pid, extraAfter, EXTRA);
      const held = mountCount(pid);
      assert.ok(held > 2 * EXTRA, `the edge's namespace holds the extra mounts (${held})`);
      const volume = await Volume.create('shared', conn);
      const second = await Sandbox.create({ ...conn, image: 'busybox', volumes: [{ name: 'shared', path: '/data' }] });

      const seen = counts();
      assert.equal(seen.length, 2, `one crun run per create: ${seen.join(', ')}`);
      for (const n of seen) assert.ok(n < EXTRA / 2, `crun ran in a namespace of ${n} mounts, not a copy of the edge's ${held}`);
      for (const sb of [first, second]) assert.equal((await sb.commands.run(['echo', 'alive'])).stdout, 'alive\n');
      const w = await second.commands.run('echo kept > /data/f && cat /data/f');
      assert.equal(w.stdout, 'kept\n', w.stderr);
      await first.files.write('/tmp/x', "written through the edge's mount");
      assert.equal((await first.commands.run(['cat', '/tmp/x'])).stdout, "written through the edge's mount");

      for (const sb of [first, second]) await sb.kill();
      await volume.delete();
      const left = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
        .split('\n')
        .filter((l) => l.includes(`${join(dataDir, 'node', 'sandboxes')}/sb-`));
      assert.deepEqual(left, [], "no sandbox mount left in the edge's namespace");
    } finally {
      if (child.exitCode === null) {
        for (const s of await Sandbox.list(conn).catch(() => [])) await (await Sandbox.connect(s.id, conn)).kill().catch(() => undefined);
        const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
        child.kill('SIGTERM');
        await gone;
      }
      // The extra mounts went with dsec up's namespace; their dirs must go before the leak check.
      rmSync(extraBelow, { recursive: true, force: true });
      rmSync(extraAfter, { recursive: true, force: true });
    }
    await assertCleanAndRemove(dataDir, edgeId);
  });
});
