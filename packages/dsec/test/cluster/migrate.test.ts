/**
 * Sandboxes that move between nodes (issue 33), on a real cluster: `dsec control` and two `dsec
 * edge` daemons, each in its own network namespace on a link-local bridge, crun underneath. A
 * container moves with its files, labels, policy and trajectory, keeping its id; one running
 * processes is refused unless they may be ended; a trainer that keeps calling sandboxes while they
 * move sees no failed call; a kill -9 of the target mid-move leaves the sandbox on its source.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { AuthError, Connection, ConflictError, readNdjson, Sandbox, type MigrateResult } from '@dsec/sdk';
import type { DrainProgress } from '@dsec/sdk/schema';
import { assertCleanAndRemove, integrationSkipReason } from '../helpers/server.js';
import { ClusterHarness } from './support/cluster-harness.js';

function skipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (spawnSync('nsenter', ['--version']).status !== 0) return 'the cluster harness needs nsenter (util-linux)';
  return undefined;
}

describe('migration: sandboxes move between two edge daemons', { skip: skipReason(), timeout: 600_000 }, () => {
  const h = new ClusterHarness();
  let conn: { url: string; apiKey: string };

  before(async () => {
    await h.start(2, { lostAfterMs: 4000 });
    conn = h.conn;
  });

  after(async () => {
    // The daemons' logs, for a failure's post-mortem (DSEC_TEST_LOGS=DIR).
    const dir = process.env['DSEC_TEST_LOGS'];
    if (dir) {
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'control.log'), h.controlLog.join(''));
      for (const e of h.edges) writeFileSync(join(dir, `edge-${e.id}.log`), e.log.join(''));
    }
    await h.close();
    for (const e of h.edges) await assertCleanAndRemove(e.dataDir, e.id);
    await assertCleanAndRemove(h.controlDir, 'none');
  });

  const other = (edge: string): string => h.edges.find((e) => e.id !== edge)!.id;
  const onEdge = (edge: string): string[] => {
    const e = h.edges.find((x) => x.id === edge)!;
    const out = spawnSync(
      'ip',
      ['netns', 'exec', e.netns, 'curl', '-s', '-H', `authorization: Bearer ${h.joinToken}`, `${e.url}/edge/v1/sandboxes`],
      {
        encoding: 'utf8',
      },
    ).stdout;
    return (JSON.parse(out) as { sandboxes: { id: string }[] }).sandboxes.map((s) => s.id);
  };

  test('an idle container moves with its id, files, labels, network policy and trajectory; its source copy is gone', async () => {
    const sb = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 }, labels: { t: 'move' }, ttlSeconds: 3600 });
    await sb.files.write('/root/work.txt', 'written before the move\n');
    await sb.commands.run('mkdir -p /opt/a && dd if=/dev/urandom of=/opt/a/blob bs=1k count=512 2>/dev/null && rm /etc/hostname');
    const sum = (await sb.commands.run('md5sum /opt/a/blob')).stdout;
    await sb.setNetwork({ mode: 'none' });
    const session = await sb.sessions.create();
    await session.run('cd /opt/a && export CARRIED=yes && LOCAL=kept');
    const before = await sb.refresh();
    const from = before.edge;
    const r: MigrateResult = await sb.migrate();
    assert.equal(r.from, from);
    assert.equal(r.to, other(from));
    assert.equal(r.sandbox.id, sb.id);
    assert.equal(r.sandbox.edge, r.to);
    assert.equal(r.sandbox.status, 'running');
    assert.equal(r.sandbox.migration, undefined);
    assert.deepEqual(r.sandbox.labels, before.labels);
    assert.equal(r.sandbox.expiresAt, before.expiresAt, 'the TTL carries on');
    assert.ok(r.bytes >= 512 * 1024, `the written layer moved (${r.bytes} bytes)`);
    assert.deepEqual(r.endedProcesses, []);
    assert.ok(!onEdge(from).includes(sb.id), 'the source copy is removed');
    assert.ok(onEdge(r.to).includes(sb.id), 'the target runs it');
    // The same handle keeps working: files, a removal, commands, the policy as switched.
    assert.equal(Buffer.from(await sb.files.read('/root/work.txt')).toString(), 'written before the move\n');
    assert.equal((await sb.commands.run('md5sum /opt/a/blob')).stdout, sum);
    assert.equal((await sb.commands.run('test -e /etc/hostname; echo $?')).stdout, '1\n', 'a removed file stays removed');
    assert.equal((await sb.network()).mode, 'none');
    // An open session moves too: same id, its directory and variables.
    assert.equal((await session.run('echo "$PWD $CARRIED $LOCAL"')).stdout, '/opt/a yes kept\n');
    const t = await sb.trajectory();
    const moved = t.entries.find((e) => e.kind === 'sandbox.migrated');
    assert.ok(moved, 'the move is in the trajectory');
    assert.deepEqual([moved.request['from'], moved.request['to']], [from, r.to]);
    assert.ok(
      t.entries.some((e) => e.kind === 'files.write'),
      'the steps before the move are kept',
    );
    const metrics = await (await fetch(`${conn.url}/metrics`, { headers: { authorization: `Bearer ${conn.apiKey}` } })).text();
    assert.match(metrics, /dsec_sandbox_migrations_total\{cause="api",result="moved"\} [1-9]/);
    // And back, paused: it stays paused on the other side.
    await sb.pause();
    const back = await sb.migrate({ edge: from });
    assert.equal(back.to, from);
    assert.equal(back.sandbox.status, 'paused');
    await sb.resume();
    assert.equal((await sb.commands.run('cat /root/work.txt')).stdout, 'written before the move\n');
    await sb.kill();
    assert.ok(!onEdge(from).includes(sb.id) && !onEdge(other(from)).includes(sb.id));
  });

  test('a container running a process is refused with the process named, unless restartProcesses ends it', async () => {
    const sb = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 } });
    await sb.files.write('/root/kept.txt', 'kept\n');
    const p = await sb.commands.start(['sleep', '1000']);
    const from = sb.info.edge;
    await assert.rejects(
      () => sb.migrate(),
      (err: unknown) => {
        assert.ok(err instanceof ConflictError, String(err));
        assert.equal(err.code, 'SANDBOX_NOT_MIGRATABLE');
        assert.match(err.message, /sleep 1000|a command being started/);
        assert.match(err.message, /restartProcesses/);
        return true;
      },
    );
    // Refused: it runs on where it was, its process too.
    const info = await sb.refresh();
    assert.equal(info.edge, from);
    assert.equal(info.migration, undefined);
    assert.equal((await sb.commands.connect(p.id)).info.status, 'running');
    assert.equal((await sb.commands.run('echo still')).stdout, 'still\n');
    const r = await sb.migrate({ restartProcesses: true });
    assert.equal(r.to, other(from));
    assert.equal(r.endedProcesses.length, 1, JSON.stringify(r.endedProcesses));
    assert.match(r.endedProcesses[0]!.cmd, /sleep 1000/);
    assert.equal((await sb.commands.run('cat /root/kept.txt; pgrep sleep || echo none')).stdout, 'kept\nnone\n');
    await sb.kill();
  });

  test('20 sandboxes keep answering a trainer-like loop while every one of them moves: no failed call, the same files', async () => {
    const { sandboxes, failures } = await Sandbox.createMany(20, {
      ...conn,
      image: 'busybox',
      resources: { memoryMiB: 32, pids: 64 },
      concurrency: 5,
    });
    assert.deepEqual(failures, []);
    try {
      const errors: string[] = [];
      let calls = 0;
      let stop = false;
      const loops = sandboxes.map(async (sb, i) => {
        for (let step = 0; !stop; step++) {
          try {
            await sb.files.write(`/root/step-${step}.txt`, `${i}:${step}\n`);
            const ran = await sb.commands.run(`cat /root/step-${step}.txt`);
            const out = ran.stdout;
            if (out !== `${i}:${step}\n` || ran.exitCode !== 0) {
              const again = await sb.commands.run(`ls -la /root/step-${step}.txt; cat /root/step-${step}.txt`);
              errors.push(
                `${sb.id} step ${step}: read ${JSON.stringify(out)} (exit ${ran.exitCode}); again: ${JSON.stringify(again.stdout + again.stderr)} on ${(await sb.refresh()).edge}`,
              );
            }
            calls += 2;
          } catch (err) {
            errors.push(`${sb.id} step ${step}: ${(err as Error).message}`);
          }
        }
      });
      const moves: MigrateResult[] = [];
      // One at a time: the loop's commands run between the moves' quiesces, as a trainer's steps would.
      for (const sb of sandboxes) {
        for (let tries = 0; ; tries++) {
          try {
            moves.push(await Sandbox.connect(sb.id, conn).then((s) => s.migrate()));
            break;
          } catch (err) {
            // A command of the loop may be running at the quiesce: the move is refused, and tried again.
            if (!(err instanceof ConflictError && err.code === 'SANDBOX_NOT_MIGRATABLE') || tries > 50) throw err;
          }
        }
      }
      stop = true;
      await Promise.all(loops);
      assert.deepEqual(errors, [], `no call failed (${calls} calls)`);
      assert.equal(moves.length, 20);
      for (const sb of sandboxes) {
        const info = await sb.refresh();
        assert.equal(info.edge, moves.find((m) => m.sandbox.id === sb.id)!.to);
        const n = Number((await sb.commands.run('ls /root | grep -c step-')).stdout.trim());
        assert.ok(n > 0, `${sb.id} kept its files (${n})`);
      }
    } finally {
      await Promise.all(sandboxes.map((s) => s.kill()));
    }
  });

  test('kill -9 of the target edge mid-move: the sandbox runs on at its source, never on both, never gone', async () => {
    const sb = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 } });
    // Enough to write that the move is still packing or fetching when the target dies.
    await sb.commands.run('dd if=/dev/urandom of=/root/big bs=1M count=64 2>/dev/null');
    const from = sb.info.edge;
    const target = h.edges.find((e) => e.id !== from)!;
    const move = sb.migrate().then(
      (r) => ({ ok: true as const, r }),
      (err: unknown) => ({ ok: false as const, err: err as Error }),
    );
    await new Promise((r) => setTimeout(r, 150));
    await h.crash(target.proc);
    const outcome = await move;
    const info = await sb.refresh();
    if (outcome.ok) {
      // The move won the race: it runs on the target, which is lost now (its row says so) and back below.
      assert.equal(info.edge, target.id);
    } else {
      assert.equal(info.edge, from, `failed move: ${outcome.err.message}`);
      assert.equal(info.status, 'running');
      assert.equal(info.migration, undefined);
      assert.equal((await sb.commands.run('ls -l /root/big | wc -l')).stdout, '1\n');
    }
    await h.startEdge(target);
    await h.waitFor(async () => (await h.nodes()).every((n) => n.state === 'ready'), 'the target is back');
    await h.waitFor(async () => {
      const runs = [onEdge(from).includes(sb.id), onEdge(target.id).includes(sb.id)];
      return runs.filter(Boolean).length === 1;
    }, 'the sandbox runs on exactly one edge');
    assert.ok(onEdge(info.edge).includes(sb.id), `it runs where its row says (${info.edge})`);
    await sb.kill();
  });

  test('kill -9 of the source edge mid-move: once it is back the sandbox runs on exactly one edge with its files, or is failed with a reason', async () => {
    const sb = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 } });
    await sb.commands.run('dd if=/dev/urandom of=/root/big bs=1M count=64 2>/dev/null; md5sum /root/big > /root/sum');
    const from = sb.info.edge;
    const source = h.edges.find((e) => e.id === from)!;
    const target = h.edges.find((e) => e.id !== from)!;
    const move = sb.migrate().then(
      (r) => ({ ok: true as const, r }),
      (err: unknown) => ({ ok: false as const, err: err as Error }),
    );
    await new Promise((r) => setTimeout(r, 150));
    await h.crash(source.proc);
    const outcome = await move;
    await h.startEdge(source);
    await h.waitFor(async () => (await h.nodes()).every((n) => n.state === 'ready'), 'the source is back');
    // Its row settles: running where it runs (the move done, or kept on its source), or failed with why.
    await h.waitFor(
      async () => {
        const s = await sb.refresh();
        return s.status === 'failed' || (s.status === 'running' && onEdge(s.edge).includes(sb.id));
      },
      'the sandbox settled',
      () => JSON.stringify(outcome.ok ? outcome.r : outcome.err.message),
    );
    const s = await sb.refresh();
    const runs = [onEdge(from).includes(sb.id), onEdge(target.id).includes(sb.id)].filter(Boolean).length;
    if (s.status === 'failed') {
      assert.ok(s.reason, 'a failed sandbox says why');
      assert.equal(runs, 0, `a failed sandbox runs nowhere (${s.reason})`);
    } else {
      assert.equal(runs, 1, 'never on both');
      assert.equal(s.migration, undefined);
      assert.equal((await sb.commands.run('md5sum -c /root/sum >/dev/null && echo intact')).stdout, 'intact\n');
      if (outcome.ok) assert.equal(s.edge, target.id);
    }
    await sb.kill();
  });

  // Last but one: a drained edge leaves the cluster once nothing is left on it (here, once the one
  // sandbox that stayed is killed at the end), and its daemon exits.
  test('drain with migrate: 30 sandboxes leave the edge, the one running a process stays, listed with why', async () => {
    const victim = h.edges[0]!;
    const keeper = h.edges[1]!;
    const c = new Connection(conn);
    const b = await Sandbox.createMany(30, {
      ...conn,
      image: 'busybox',
      resources: { memoryMiB: 32, pids: 64 },
      labels: { t: 'drain' },
      concurrency: 6,
    });
    assert.deepEqual(b.failures, []);
    // Everything on the victim: those created elsewhere move there first (a move of its own kind).
    for (const sb of b.sandboxes) if (sb.info.edge !== victim.id) await sb.migrate({ edge: victim.id });
    for (const sb of b.sandboxes) await sb.files.write('/root/who', sb.id);
    const busy = b.sandboxes[0]!;
    await busy.commands.start(['sleep', '1000']);
    const res = await c.request('POST', `/v1/nodes/${victim.id}/drain`, {
      json: { migrate: true },
      accept: 'application/x-ndjson',
      timeoutMs: 600_000,
    });
    const lines: DrainProgress[] = [];
    for await (const line of readNdjson<DrainProgress>(res.body!)) lines.push(line);
    assert.deepEqual(lines[0], { type: 'start', total: 30 });
    const done = lines.at(-1)!;
    assert.equal(done.type, 'done');
    if (done.type !== 'done') return;
    assert.equal(lines.filter((l) => l.type === 'moved' || l.type === 'stayed').length, 30, 'each sandbox reported as it moved or stayed');
    assert.equal(done.moved.length, 29);
    assert.deepEqual(
      done.stayed.map((x) => [x.id, x.code]),
      [[busy.id, 'SANDBOX_NOT_MIGRATABLE']],
    );
    assert.match(done.stayed[0]!.reason, /sleep 1000|a command being started/);
    assert.equal(done.node.state, 'draining');
    assert.deepEqual(onEdge(victim.id), [busy.id]);
    for (const sb of b.sandboxes.slice(1)) {
      assert.equal((await sb.refresh()).edge, keeper.id);
      assert.equal((await sb.commands.run('cat /root/who')).stdout, sb.id);
    }
    const metrics = await (await fetch(`${conn.url}/metrics`, { headers: { authorization: `Bearer ${conn.apiKey}` } })).text();
    assert.match(metrics, /dsec_sandbox_migrations_total\{cause="drain",result="moved"\} 29/);
    assert.match(metrics, /dsec_sandbox_migrations_total\{cause="drain",result="refused"\} 1/);
    await Promise.all(b.sandboxes.map((s) => s.kill()));
    // Waited for, so that every run ends the same way: the harness's close() then leaves this
    // edge down rather than racing its exit.
    await h.waitFor(
      () => victim.proc?.exitCode === 0 && victim.log.join('').includes('drained and left the cluster'),
      `edge ${victim.id} leaving the cluster once empty`,
      () => victim.log.join(''),
    );
  });

  test('bad input: a named edge that does not exist, the edge it is on, a project key', async () => {
    const sb = await Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 32 } });
    const c = new Connection(conn);
    await assert.rejects(
      () => c.json('POST', `/v1/sandboxes/${sb.id}/migrate`, { json: { edge: 'nosuchedge' } }),
      /EDGE_NOT_FOUND|no edge nosuchedge/,
    );
    await assert.rejects(() => c.json('POST', `/v1/sandboxes/${sb.id}/migrate`, { json: { edge: sb.info.edge } }), /already/);
    await assert.rejects(() => c.json('POST', `/v1/sandboxes/${sb.id}/migrate`, { json: { bogus: 1 } }), /bogus|additional/i);
    // No body at all is a move wherever placement picks (validated as {}): here the other edge is draining.
    await assert.rejects(() => c.json('POST', `/v1/sandboxes/${sb.id}/migrate`), /CAPACITY_EXCEEDED|the cluster is full/);
    // Where sandboxes run is the operator's: a project key may not move one, even its own.
    await c.json('POST', '/v1/projects', { json: { name: 'movers' } });
    const { key } = await c.json<{ key: string }>('POST', '/v1/keys', { json: { project: 'movers', name: 'k' } });
    const own = await Sandbox.create({ url: conn.url, apiKey: key, image: 'busybox', resources: { memoryMiB: 32 } });
    await assert.rejects(
      () => own.migrate(),
      (err: unknown) => err instanceof AuthError && err.code === 'FORBIDDEN',
    );
    const asProject = new Connection({ url: conn.url, apiKey: key });
    await assert.rejects(
      () => asProject.json('POST', `/v1/nodes/${sb.info.edge}/drain`, { json: { migrate: true } }),
      (err: unknown) => err instanceof AuthError && err.code === 'FORBIDDEN',
    );
    assert.equal((await sb.refresh()).edge, sb.info.edge);
    await own.kill();
    await sb.kill();
  });
});
