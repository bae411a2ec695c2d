/**
 * The trajectory log (every command, session command and file change, in order, with exit codes;
 * output capped) and replay (a new sandbox whose files match the original's).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { NotFoundError, Sandbox, type TrajectoryEntry } from '@dsec/sdk';
import { startTestServer, type TestServer } from '../helpers/server.js';
import { engineBackends, type EngineBackend } from '../helpers/vm.js';
import { callJson, execJson, execNdjson, ndjsonLines } from './support/http.js';
import { treeManifest } from './support/manifest.js';
import { pollUntil } from './support/sandbox-procs.js';
import { encodeTar } from './support/tar.js';

const LOG_CAP = 64 << 10;

/**
 * The log is the control plane's, the same for every backend; what differs is what the guest
 * answers. On a microVM (a TCG boot per fresh sandbox) only the tests whose steps reach the
 * guest in a way of their own run: order and exit codes of every kind of step, a timeout, the
 * output cap, replay of a tree, and network switches and pauses.
 */
function vmToo(backend: EngineBackend, runsOnVm: boolean): { skip?: string } {
  return backend === 'container' || runsOnVm
    ? {}
    : { skip: `${backend}: control-plane bookkeeping the container run covers (each test boots fresh VMs)` };
}

for (const { backend, skip, memoryMiB } of engineBackends())
  describe(`engine: trajectory and replay (${backend})`, { skip, timeout: 600_000 }, () => {
    let server: TestServer;

    const fresh = (): Promise<Sandbox> => Sandbox.create({ ...server.conn, backend, resources: { memoryMiB } });
    const entries = async (sb: Sandbox): Promise<TrajectoryEntry[]> => (await sb.trajectory()).entries;

    before(async () => {
      server = await startTestServer();
    });
    after(async () => {
      await server?.close();
    });

    test('a new sandbox has an empty trajectory', vmToo(backend, false), async () => {
      const sb = await fresh();
      const t = await sb.trajectory();
      assert.equal(t.sandboxId, sb.id);
      assert.deepEqual(t.entries, []);
      assert.equal(t.dropped, 0);
      await sb.kill();
    });

    test(
      'every exec, streamed exec, session step and file change is logged in order with seq 1..n and exit codes',
      vmToo(backend, true),
      async () => {
        const sb = await fresh();
        await sb.commands.run('echo a');
        await sb.commands.run('exit 3');
        for await (const _ of sb.commands.stream('echo streamed; exit 2')) void _;
        const s = await sb.sessions.create();
        await s.run('cd /tmp');
        await s.run('false');
        await s.close();
        await sb.files.write('/tmp/t.txt', 'x', { mode: 0o600 });
        await sb.files.mkdir('/tmp/d');
        await sb.files.rename('/tmp/t.txt', '/tmp/d/t.txt');
        await sb.files.remove('/tmp/d/t.txt');
        await sb.files.uploadTar('/tmp/up', encodeTar([{ name: 'f', type: 'file', mode: 0o644, data: 'f' }]));
        // Reads change nothing and are not logged.
        await sb.files.read('/tmp/up/f');
        await sb.files.stat('/tmp/up/f');
        await sb.files.list('/tmp');
        await sb.files.downloadTar('/tmp/up');

        const log = await entries(sb);
        assert.deepEqual(
          log.map((e) => [e.seq, e.kind, e.exitCode]),
          [
            [1, 'exec', 0],
            [2, 'exec', 3],
            [3, 'exec', 2],
            [4, 'session.open', undefined],
            [5, 'session.exec', 0],
            [6, 'session.exec', 1],
            [7, 'session.close', undefined],
            [8, 'files.write', undefined],
            [9, 'files.mkdir', undefined],
            [10, 'files.rename', undefined],
            [11, 'files.remove', undefined],
            [12, 'files.upload', undefined],
          ],
        );
        for (let i = 1; i < log.length; i++) assert.ok(Date.parse(log[i]!.at) >= Date.parse(log[i - 1]!.at), 'timestamps never go back');
        assert.equal(log[0]!.request['cmd'], 'echo a');
        assert.equal(log[0]!.result?.['stdout'], 'a\n');
        assert.equal(typeof log[0]!.durationMs, 'number');
        assert.equal(log[2]!.result?.['stdout'], 'streamed\n', 'a streamed exec logs the output that passed through');
        assert.equal(log[4]!.request['cmd'], 'cd /tmp');
        assert.equal(log[4]!.request['sessionId'], s.id);
        assert.equal(log[3]!.result?.['sessionId'], s.id);
        assert.deepEqual(log[7]!.request, { path: '/tmp/t.txt', mode: '600', bytes: 1 });
        assert.deepEqual(log[9]!.request, { from: '/tmp/t.txt', to: '/tmp/d/t.txt' });
        assert.ok(log.every((e) => e.replayable));
        await sb.kill();
      },
    );

    test('exec stdin is not stored in the logged request (only its size)', vmToo(backend, false), async () => {
      const sb = await fresh();
      await sb.commands.run('cat > /tmp/in.txt', { stdin: 'secret-stdin' });
      const [e] = await entries(sb);
      assert.equal(e!.request['stdin'], undefined);
      assert.equal(e!.request['stdinBytes'], 12);
      await sb.kill();
    });

    test('a timed-out exec is logged with timedOut and exit code 137', vmToo(backend, true), async () => {
      const sb = await fresh();
      await execJson(server, sb.id, { cmd: 'sleep 6001', timeoutMs: 300 });
      const [e] = await entries(sb);
      assert.equal(e!.exitCode, 137);
      assert.equal(e!.result?.['timedOut'], true);
      await sb.kill();
    });

    test(
      'logged command output is capped at 64 KiB per stream (JSON exec), the caller still gets all of it',
      vmToo(backend, true),
      async () => {
        const sb = await fresh();
        const r = await sb.commands.run('head -c 200000 /dev/zero | tr "\\0" o; head -c 100000 /dev/zero | tr "\\0" e >&2');
        assert.equal(r.stdout.length, 200000);
        const [e] = await entries(sb);
        const out = e!.result?.['stdout'] as string;
        const err = e!.result?.['stderr'] as string;
        assert.ok(out.length <= LOG_CAP, `logged stdout is ${out.length} chars`);
        assert.ok(err.length <= LOG_CAP, `logged stderr is ${err.length} chars`);
        assert.ok(out.length > 0 && /^o+$/.test(out));
        assert.equal(e!.result?.['logTruncated'], true);
        assert.equal(e!.result?.['stdoutBytes'], 200000);
        await sb.kill();
      },
    );

    test('logged output is capped for streamed execs and session commands too', vmToo(backend, false), async () => {
      const sb = await fresh();
      const res = await execNdjson(server, sb.id, { cmd: 'head -c 300000 /dev/zero | tr "\\0" s' });
      for await (const _ of ndjsonLines(res.body!)) void _;
      const s = await sb.sessions.create();
      await s.run('head -c 300000 /dev/zero | tr "\\0" t');
      const log = await entries(sb);
      const streamed = log.find((e) => e.kind === 'exec')!;
      const session = log.find((e) => e.kind === 'session.exec')!;
      assert.ok((streamed.result?.['stdout'] as string).length <= LOG_CAP);
      assert.ok((session.result?.['stdout'] as string).length <= LOG_CAP);
      assert.equal(session.result?.['stdoutBytes'], 300000);
      await sb.kill();
    });

    test('a file change the API refused is not logged', vmToo(backend, false), async () => {
      const sb = await fresh();
      await sb.files.mkdir('/tmp/isdir');
      await assert.rejects(sb.files.write('/tmp/isdir', 'x'));
      await assert.rejects(sb.files.remove('/tmp/missing'));
      assert.deepEqual(
        (await entries(sb)).map((e) => e.kind),
        ['files.mkdir'],
      );
      await sb.kill();
    });

    test('afterSeq and limit page through the log', vmToo(backend, false), async () => {
      const sb = await fresh();
      for (let i = 1; i <= 5; i++) await sb.commands.run(`echo ${i}`);
      const page = await sb.trajectory({ afterSeq: 2, limit: 2 });
      assert.deepEqual(
        page.entries.map((e) => [e.seq, e.result?.['stdout']]),
        [
          [3, '3\n'],
          [4, '4\n'],
        ],
      );
      assert.deepEqual((await sb.trajectory({ afterSeq: 5 })).entries, []);
      await sb.kill();
    });

    test('a JSON exec whose client hung up is still logged (its side effects happened)', vmToo(backend, false), async () => {
      const sb = await fresh();
      const ctrl = new AbortController();
      const pending = sb.commands.run('echo did-run > /tmp/hangup-json; sleep 6011', { signal: ctrl.signal });
      pending.catch(() => undefined);
      assert.ok(await pollUntil(() => sb.files.exists('/tmp/hangup-json')));
      ctrl.abort();
      assert.ok(await pollUntil(async () => (await entries(sb)).length > 0), 'the killed command was not logged');
      assert.equal((await entries(sb))[0]!.request['cmd'], 'echo did-run > /tmp/hangup-json; sleep 6011');
      await sb.kill();
    });

    test(
      'a streamed exec whose client disconnected mid-stream is still logged (its side effects happened)',
      vmToo(backend, false),
      async () => {
        const sb = await fresh();
        const ctrl = new AbortController();
        const res = await execNdjson(server, sb.id, { cmd: 'echo did-run > /tmp/hangup-stream; echo ready; sleep 6012' }, ctrl.signal);
        const it = ndjsonLines(res.body!);
        assert.equal((await it.next()).value?.type, 'stdout');
        assert.equal(await sb.files.readText('/tmp/hangup-stream'), 'did-run\n');
        ctrl.abort();
        await it.return(undefined).catch(() => undefined);
        const logged = await pollUntil(async () => (await entries(sb)).length > 0, { tries: 50 });
        assert.ok(logged, 'the streamed command changed the sandbox but is missing from the trajectory (a replay would not redo it)');
        await sb.kill();
      },
    );

    test('a background process is logged as a step (so a replay re-runs what it did)', vmToo(backend, false), async () => {
      const sb = await fresh();
      const p = await sb.commands.start('echo from-bg > /tmp/bg.txt');
      await p.wait();
      const log = await entries(sb);
      assert.ok(
        log.length > 0 && JSON.stringify(log).includes('from-bg'),
        `the background command is missing from the trajectory: ${JSON.stringify(log.map((e) => e.kind))}`,
      );
      await sb.kill();
    });

    test('trajectory and replay of an unknown sandbox: 404 SANDBOX_NOT_FOUND', vmToo(backend, false), async () => {
      const id = `sb-${server.edgeId}-unknown000001`;
      for (const [method, path] of [
        ['GET', `/v1/sandboxes/${id}/trajectory`],
        ['POST', `/v1/sandboxes/${id}/replay`],
      ] as const) {
        const r = await callJson(server, method, path);
        assert.equal(r.status, 404, JSON.stringify(r.body));
        assert.equal(r.body.error.code, 'SANDBOX_NOT_FOUND');
      }
    });

    test(
      'replay builds a new sandbox whose /work tree matches the original (files, modes, symlinks, contents)',
      vmToo(backend, true),
      async () => {
        const orig = await fresh();
        const bin = randomBytes(50_000);
        await orig.files.write('/work/a.txt', 'alpha', { mode: 0o600 });
        await orig.files.write('/work/bin.dat', bin);
        await orig.commands.run('mkdir -p /work/d && echo hi > /work/d/b && chmod 751 /work/d && ln -s d/b /work/link');
        await orig.commands.run('cat > /work/stdin.bin', { stdin: bin.toString('base64'), stdinEncoding: 'base64' });
        for await (const _ of orig.commands.stream('seq 1 1000 > /work/seq.txt')) void _;
        const s = await orig.sessions.create();
        await s.run('cd /work && export V=session-var');
        await s.run('echo "$V" > from-session.txt; mkdir -p nested/x');
        await s.close();
        await orig.files.mkdir('/work/empty/dir');
        await orig.files.uploadTar(
          '/work/t',
          encodeTar([
            { name: 'pkg/', type: 'dir', mode: 0o700 },
            { name: 'pkg/run', type: 'file', mode: 0o755, data: '#!/bin/sh\n' },
          ]),
        );
        await orig.files.write('/work/gone.txt', 'temporary');
        await orig.files.rename('/work/a.txt', '/work/renamed.txt');
        await orig.files.remove('/work/gone.txt');
        await orig.files.remove('/work/nested', { recursive: true });

        const before = await treeManifest(orig, '/work');
        assert.ok(
          before.includes('./renamed.txt F 600') && before.includes('./link L d/b') && before.includes('./t/pkg/run F 755'),
          before,
        );
        assert.ok(!before.includes('gone.txt') && !before.includes('nested'), before);

        const { sandbox: copy, result } = await orig.replay();
        try {
          assert.notEqual(copy.id, orig.id);
          assert.equal(copy.info.status, 'running');
          assert.equal(copy.info.labels['dsec.replay-of'], orig.id);
          assert.equal(copy.info.imageId, orig.info.imageId);
          const logged = await entries(orig);
          assert.equal(result.replayed, logged.length);
          assert.equal(result.diverged, 0, JSON.stringify(result.steps.filter((x) => x.diverged)));
          assert.deepEqual(
            result.steps.map((x) => x.seq),
            logged.map((e) => e.seq),
          );
          assert.equal(await treeManifest(copy, '/work'), before);
          // The brief's form of the check: md5s of every regular file under /work, via find -exec.
          const sums = async (sb: Sandbox): Promise<string> =>
            (await sb.commands.run("find / -xdev -type f -path '/work*' -exec md5sum {} + | sort")).stdout;
          assert.equal(await sums(copy), await sums(orig));
        } finally {
          await copy.kill();
          await orig.kill();
        }
      },
    );

    test('the replayed sandbox starts with the original log and appends its own steps after it', vmToo(backend, false), async () => {
      const orig = await fresh();
      await orig.commands.run('echo one > /tmp/one');
      await orig.files.write('/tmp/two', '2');
      const { sandbox: copy } = await orig.replay();
      try {
        await copy.commands.run('echo three');
        const log = await entries(copy);
        assert.deepEqual(
          log.map((e) => [e.seq, e.kind]),
          [
            [1, 'exec'],
            [2, 'files.write'],
            [3, 'exec'],
          ],
        );
        assert.equal(log[2]!.request['cmd'], 'echo three');
        assert.equal((await entries(orig)).length, 2, 'the original log is unchanged');
      } finally {
        await copy.kill();
        await orig.kill();
      }
    });

    test(
      'replay reports a non-replayable pty step as skipped (not diverged), and a later command whose exit code differs as diverged',
      vmToo(backend, false),
      async () => {
        const orig = await fresh();
        const t = await orig.terminal({ cmd: ['/bin/sh', '-c', 'echo made-by-pty > /tmp/from-pty'], onData: () => {} });
        assert.equal(await t.exited, 0);
        await pollUntil(async () => (await entries(orig)).some((e) => e.kind === 'pty'));
        assert.equal((await orig.commands.run('cat /tmp/from-pty')).exitCode, 0);
        const { sandbox: copy, result } = await orig.replay();
        try {
          const pty = result.steps.find((x) => x.kind === 'pty')!;
          assert.equal(pty.skipped, true);
          assert.equal(pty.diverged, false);
          assert.match(pty.skipReason ?? '', /not replayable/);
          const cat = result.steps.find((x) => x.kind === 'exec')!;
          assert.equal(cat.loggedExitCode, 0);
          assert.notEqual(cat.replayedExitCode, 0);
          assert.equal(cat.diverged, true);
          assert.deepEqual([result.replayed, result.diverged, result.skipped], [1, 1, 1]);
        } finally {
          await copy.kill();
          await orig.kill();
        }
      },
    );

    test(
      'an upload larger than the log keeps is marked unreplayable and reported as skipped on replay',
      vmToo(backend, false),
      async () => {
        const orig = await fresh();
        const big = encodeTar([{ name: 'big.bin', type: 'file', mode: 0o644, data: randomBytes((8 << 20) + 4096) }]);
        await orig.files.uploadTar('/tmp/big', big);
        const [e] = await entries(orig);
        assert.equal(e!.kind, 'files.upload');
        assert.equal(e!.replayable, false);
        const { sandbox: copy, result } = await orig.replay();
        try {
          assert.equal(result.steps[0]!.skipped, true);
          assert.equal(result.diverged, 0);
          assert.match(result.steps[0]!.skipReason ?? '', /not kept/);
          await assert.rejects(copy.files.stat('/tmp/big/big.bin'), (err: unknown) => err instanceof NotFoundError);
        } finally {
          await copy.kill();
          await orig.kill();
        }
      },
    );

    test(
      'network switches, pauses and resumes are logged; a replay applies the switches and skips the pauses',
      vmToo(backend, true),
      async () => {
        const orig = await fresh();
        await orig.setNetwork({ mode: 'open' });
        await orig.pause();
        await orig.resume();
        await orig.commands.run('true');
        const log = await entries(orig);
        assert.deepEqual(
          log.map((e) => e.kind),
          ['network.set', 'pause', 'resume', 'exec'],
        );
        assert.equal(log[0]!.request['mode'], 'open');
        const { sandbox: copy, result } = await orig.replay();
        try {
          assert.deepEqual([result.replayed, result.diverged, result.skipped], [2, 0, 2], JSON.stringify(result.steps));
          assert.equal((await copy.network()).mode, 'open', 'the replay did not apply the logged network switch');
        } finally {
          await copy.kill();
          await orig.kill();
        }
      },
    );

    test('after kill the trajectory stays readable by id; inspect says until when', vmToo(backend, false), async () => {
      const sb = await fresh();
      await sb.commands.run('echo before-kill');
      await sb.kill();
      const log = await sb.trajectory();
      assert.deepEqual(
        log.entries.map((e) => [e.kind, e.request['cmd']]),
        [['exec', 'echo before-kill']],
      );
      assert.equal((await Sandbox.trajectory(sb.id, server.conn)).entries.length, 1);
      const r = await callJson(server, 'GET', `/v1/sandboxes/${sb.id}`);
      assert.equal(r.status, 404);
      assert.match(r.body.error.message, /was killed at .*; its trajectory stays readable until/);
      await sb.kill(); // still idempotent
    });

    test(
      'a killed sandbox is replayed from its kept trajectory: same files, same labels, its log first',
      vmToo(backend, false),
      async () => {
        const sb = await Sandbox.create({ ...server.conn, backend, resources: { memoryMiB }, labels: { rollout: 'r-killed' } });
        await sb.commands.run('echo one > /tmp/one');
        await sb.files.write('/tmp/two', '2');
        await sb.kill();
        const { sandbox: copy, result } = await sb.replay();
        try {
          assert.equal(result.replayed, 2);
          assert.equal(result.diverged, 0);
          assert.equal((await copy.commands.run('cat /tmp/one /tmp/two')).stdout, 'one\n2');
          assert.equal(copy.info.labels['rollout'], 'r-killed');
          assert.equal(copy.info.labels['dsec.replay-of'], sb.id);
          assert.deepEqual(
            (await entries(copy)).slice(0, 2).map((e) => e.kind),
            ['exec', 'files.write'],
          );
        } finally {
          await copy.kill();
        }
        // One that never existed is still a 404 naming no tombstone.
        const r = await callJson(server, 'POST', `/v1/sandboxes/sb-local-${randomBytes(6).toString('hex')}/replay`);
        assert.equal(r.status, 404);
        assert.doesNotMatch(r.body.error.message, /was killed/);
      },
    );

    test(
      'Sandbox.trajectories: every step of the sandboxes a label or a batch names, killed ones included, by id then seq',
      vmToo(backend, false),
      async () => {
        const tag = randomBytes(4).toString('hex');
        const spec = { ...server.conn, backend, resources: { memoryMiB }, labels: { bulk: tag } };
        const a = await Sandbox.create(spec);
        const b = await Sandbox.create(spec);
        await a.commands.run('echo a1');
        await a.files.write('/tmp/a', 'a');
        await b.commands.run('echo b1');
        await b.kill();
        const lines = [];
        for await (const l of Sandbox.trajectories({ ...server.conn, labels: { bulk: tag } })) lines.push(l);
        const want = [
          [a.id, 1, 'exec'],
          [a.id, 2, 'files.write'],
          [b.id, 1, 'exec'],
        ].sort((x, y) => (x[0]! < y[0]! ? -1 : x[0]! > y[0]! ? 1 : Number(x[1]) - Number(y[1])));
        assert.deepEqual(
          lines.map((l) => [l.sandboxId, l.seq, l.kind]),
          want,
        );
        await a.kill();
        await assert.rejects(
          async () => {
            for await (const _ of Sandbox.trajectories({ ...server.conn })) break;
          },
          (err: Error & { code?: string }) => err.code === 'INVALID_REQUEST',
        );

        const { batchId, sandboxes } = await Sandbox.createMany(2, { ...spec, labels: { bulk: `${tag}-batch` } });
        try {
          for (const sb of sandboxes) await sb.commands.run('true');
          const ids = [];
          for await (const l of Sandbox.trajectories({ ...server.conn, batch: batchId })) ids.push(l.sandboxId);
          assert.deepEqual(ids, sandboxes.map((sb) => sb.id).sort());
        } finally {
          for (const sb of sandboxes) await sb.kill();
        }
      },
    );

    test(
      "a fork's trajectory with lineage: the parent's steps up to the fork, then its own; the parent's later steps are not its past",
      vmToo(backend, true),
      async () => {
        const parent = await fresh();
        try {
          await parent.commands.run('echo p1');
          await parent.files.write('/tmp/p', 'p');
          const { sandboxes, result } = await parent.fork(1);
          assert.deepEqual(result.failures, []);
          const child = sandboxes[0]!;
          try {
            assert.equal(child.info.labels['dsec.fork-of'], parent.id);
            assert.equal(child.info.labels['dsec.fork-at-seq'], '2');
            await parent.commands.run('echo p-after');
            await child.commands.run('echo c1');
            const t = await child.trajectory({ lineage: true });
            assert.deepEqual(
              t.entries.map((e) => [e.sandboxId, e.seq, e.kind]),
              [
                [parent.id, 1, 'exec'],
                [parent.id, 2, 'files.write'],
                [child.id, 1, 'exec'],
              ],
            );
            assert.deepEqual(t.lineageMissing, []);
            assert.deepEqual(
              (await child.trajectory()).entries.map((e) => [e.sandboxId, e.seq]),
              [[undefined, 1]],
            );
            await parent.kill();
            const kept = await Sandbox.trajectory(child.id, { ...server.conn, lineage: true });
            assert.equal(kept.entries.length, 3, "a killed parent's log is still its fork's past while it is kept");
          } finally {
            await child.kill();
          }
        } finally {
          await parent.kill();
        }
      },
    );
  });
