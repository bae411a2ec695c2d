/**
 * kill -9 of `dsec up` while 16 creates are in flight, as a new user would meet it: the creates
 * are sent at once, dsec is killed at one of several moments of the create path (while the
 * requests are queued, while layers mount and crun runs, while rows are written), then started
 * again on the same data dir and edge id.
 *
 * After each restart: every create the API accepted is listed, running or failed with a reason;
 * no row stays `creating`; and the census of everything on the host under this edge's id
 * (processes and cgroups named `sb-<edge>-*`, mounts under the data dir, crun's containers,
 * sandbox dirs) holds exactly the sandboxes the API lists as running. Then every listed sandbox
 * is killed and the census must be empty: nothing runs that nothing knows.
 *
 * CI: 10 rounds (5 moments, each with both ways of killing); DSEC_SOAK=1: 30 (DSEC_CREATE_CRASH_ROUNDS overrides).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, makeScratchDir, newEdgeId, startDsec } from '../helpers/server.js';
import { census } from './census.js';
import { halfMade } from './half-made.js';
import { DsecUpChild } from './dsec-up-child.js';
import { api } from './restart-load.js';

const long = process.env['DSEC_SOAK'] === '1';
const rounds = Number(process.env['DSEC_CREATE_CRASH_ROUNDS'] ?? (long ? 30 : 10));
/** Moments after the creates are sent, ms: from still queued to rows being settled. */
const MOMENTS = [30, 150, 400, 800, 1500];
const IN_FLIGHT = 16;

describe(
  `kill -9 of dsec up during ${IN_FLIGHT} concurrent creates (${rounds} rounds)`,
  { skip: integrationSkipReason(), timeout: 900_000 },
  () => {
    const edgeId = newEdgeId();
    let dataDir = '';
    let up: DsecUpChild | undefined;
    const report: string[] = [];
    const made = new Set<string>();

    before(async () => {
      dataDir = makeDataDir();
      await (await startDsec(dataDir, { edgeId })).close(); // builds busybox, in this process
      up = new DsecUpChild(dataDir, edgeId);
      await up.start();
    });

    after(async () => {
      try {
        if (up && !up.running) await up.start();
        if (up) {
          const list = (await api(up.conn, 'GET', '/v1/sandboxes')).body as unknown as { sandboxes: SandboxInfo[] };
          for (const s of list.sandboxes) await api(up.conn, 'DELETE', `/v1/sandboxes/${s.id}`);
          await up.stop();
        }
      } finally {
        if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
        console.log(`create crashes:\n  ${report.join('\n  ')}`);
      }
    });

    test('every accepted create is running or failed with a reason, and nothing runs under the edge that nothing lists', async () => {
      for (let round = 0; round < rounds; round++) {
        const moment = MOMENTS[round % MOMENTS.length]!;
        const conn = { ...up!.conn };
        const answers = Array.from({ length: IN_FLIGHT }, (_, i) =>
          api(conn, 'POST', '/v1/sandboxes', { image: 'busybox', labels: { round: String(round), i: String(i) } }).catch(
            (err: unknown) => ({ status: 0, body: { error: { message: (err as Error).message } } }),
          ),
        );
        await new Promise((r) => setTimeout(r, moment));
        await up!.crash();
        const answered = await Promise.all(answers);
        const accepted = answered.filter((a) => a.status === 201).map((a) => (a.body as unknown as SandboxInfo).id);
        await up!.start();

        const at = `round ${round} (kill -9 ${moment} ms after ${IN_FLIGHT} creates, ${accepted.length} accepted)`;
        const list = async (): Promise<SandboxInfo[]> =>
          ((await api(up!.conn, 'GET', '/v1/sandboxes')).body as unknown as { sandboxes: SandboxInfo[] }).sandboxes;
        const killAll = async (sandboxes: SandboxInfo[]): Promise<void> => {
          for (const s of sandboxes) {
            made.add(s.id);
            const r = await api(up!.conn, 'DELETE', `/v1/sandboxes/${s.id}`);
            assert.ok(r.status === 200 || r.status === 204, `${at}: kill ${s.id}: ${r.status} ${JSON.stringify(r.body)}`);
          }
        };
        // A create cut by the crash is `creating` until its lease runs out, then settled.
        const settled = async (): Promise<SandboxInfo[]> => {
          for (let t = 0; ; t++) {
            const l = await list();
            if (!l.some((s) => s.status === 'creating') || t >= 600) return l;
            await new Promise((r) => setTimeout(r, 100));
          }
        };
        let outcome: string;
        if (round % 2 === 0) {
          // As a trainer that waits: every accepted create is accounted for, running or failed with a reason.
          const after = await settled();
          const listed = new Map(after.map((s) => [s.id, s]));
          assert.deepEqual(
            accepted.filter((id) => !listed.has(id)),
            [],
            `${at}: accepted creates that the API no longer lists`,
          );
          assert.deepEqual(
            after.filter((s) => s.status !== 'running' && !(s.status === 'failed' && s.reason)).map((s) => [s.id, s.status, s.reason]),
            [],
            `${at}: sandboxes neither running nor failed with a reason`,
          );
          const running = new Set(after.filter((s) => s.status === 'running').map((s) => s.id));
          assert.deepEqual(halfMade(dataDir, edgeId, running), {}, `${at}: the node holds sandboxes the API does not list as running`);
          await killAll(after);
          outcome = `${running.size} running, ${after.length - running.size} failed after the restart`;
        } else {
          // As a new user does: everything listed is killed at once, creates still settling included.
          const first = await list();
          await killAll(first);
          const after = await settled();
          assert.deepEqual(
            after.filter((s) => s.status === 'running').map((s) => s.id),
            [],
            `${at}: sandboxes running after every listed one was killed`,
          );
          await killAll(after);
          outcome = `${first.length} listed at once and killed, ${first.filter((s) => s.status === 'creating').length} of them creating`;
        }
        // dsec stopped, as a user leaves it: nothing may run or stay mounted under the edge.
        await up!.stop();
        const c = census(dataDir, edgeId, made, process.pid);
        const left = { mounts: c.mounts, cgroups: c.cgroups, processes: c.processes, sandboxDirs: c.sandboxDirs };
        assert.deepEqual(
          left,
          { mounts: [], cgroups: [], processes: [], sandboxDirs: [] },
          `${at}: left under the edge after every sandbox was killed and dsec stopped`,
        );
        await up!.start();
        report.push(`${at}: ${outcome}`);
      }
    });
    test('creates whose crun run is held mid-way at the crash (the container made, crun not returned) are settled and leave nothing', async () => {
      // crun first on PATH for one run of dsec: every `crun run` stops for 5 s after the container
      // exists (an OCI createRuntime hook that sleeps), so the crash finds each create inside crun.
      const bin = makeScratchDir('slow-crun');
      const realCrun = execFileSync('sh', ['-c', 'command -v crun'], { encoding: 'utf8' }).trim();
      writeFileSync(
        join(bin, 'crun'),
        `#!/bin/sh
bundle=; prev=
for a in "$@"; do [ "$prev" = --bundle ] && bundle=$a; prev=$a; done
case " $* " in *" run "*) [ -n "$bundle" ] && python3 -c 'import json,sys; p=sys.argv[1]; c=json.load(open(p)); c.setdefault("hooks",{}).setdefault("createRuntime",[]).append({"path":"/bin/sleep","args":["sleep","5"]}); json.dump(c,open(p,"w"))' "$bundle/config.json";; esac
exec ${realCrun} "$@"
`,
        { mode: 0o755 },
      );
      try {
        await up!.stop();
        const slow = new DsecUpChild(dataDir, edgeId, { env: { PATH: `${bin}:${process.env['PATH'] ?? '/usr/bin:/bin'}` } });
        await slow.start();
        const answers = Array.from({ length: 4 }, () =>
          api(slow.conn, 'POST', '/v1/sandboxes', { image: 'busybox' }).catch(() => ({ status: 0, body: {} })),
        );
        const held = (): number => crunRunsIn(join(dataDir, 'node', 'crun'));
        for (let t = 0; held() < 4 && t < 600; t++) await new Promise((r) => setTimeout(r, 50));
        assert.ok(held() >= 4, 'the four creates never reached crun run');
        await slow.crash();
        await Promise.all(answers);
        await up!.start();
        const listed = ((await api(up!.conn, 'GET', '/v1/sandboxes')).body as unknown as { sandboxes: SandboxInfo[] }).sandboxes;
        for (const s of listed) {
          made.add(s.id);
          await api(up!.conn, 'DELETE', `/v1/sandboxes/${s.id}`);
        }
        await up!.stop();
        // The held crun runs are the previous run's: none may go on to start a container.
        await new Promise((r) => setTimeout(r, 6000));
        const c = census(dataDir, edgeId, made, process.pid);
        assert.deepEqual(
          { mounts: c.mounts, cgroups: c.cgroups, processes: c.processes, sandboxDirs: c.sandboxDirs, crun: held() },
          { mounts: [], cgroups: [], processes: [], sandboxDirs: [], crun: 0 },
          'left under the edge after the held creates',
        );
        report.push(`held in crun run at the crash: ${listed.length} listed after the restart (${listed.map((s) => s.status).join(', ')})`);
      } finally {
        if (!up!.running) await up!.start();
        rmSync(bin, { recursive: true, force: true });
      }
    });
  },
);

/** `crun run` calls on a crun state root now (the previous run's, when dsec has been killed). */
function crunRunsIn(root: string): number {
  let n = 0;
  for (const e of readdirSync('/proc')) {
    try {
      const argv = readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0');
      if (argv.includes(root) && argv.includes('run') && argv.some((a) => a.endsWith('crun'))) n++;
    } catch {
      // not a pid, or gone
    }
  }
  return n;
}
