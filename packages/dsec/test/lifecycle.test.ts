/** Sandbox lifecycle against a real server: create, inspect, limits on the host, init, list, kill. */
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { InvalidRequestError, NotFoundError, Sandbox, type SandboxInfo } from '@dsec/sdk';
import { MOUNT_STUBS_DIR } from '../src/edge/backends/container/mount-stubs.js';
import { MASKED_PATHS } from '../src/edge/backends/container/oci-config.js';
import { v1Hierarchies } from '../src/host/cgroups.js';
import { findLeaks } from '../src/host/leak-check.js';
import { integrationSkipReason, sandboxCgroupDir, useServerAndSandbox, type TestServer } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';

const MiB = 1024 * 1024;

describe('sandbox lifecycle', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  /** One busybox sandbox with small, distinctive limits, shared by the read-only checks. */
  let sb: Sandbox;

  useServerAndSandbox({ image: 'busybox', resources: { memoryMiB: 64, pids: 100, cpu: 0.5 }, labels: { suite: 'lifecycle' } }, (s, b) => {
    server = s;
    sb = b;
  });

  test('create returns a running busybox sandbox with the requested resources', () => {
    assert.equal(sb.info.status, 'running');
    assert.match(sb.id, new RegExp(`^sb-${server.edgeId}-[a-z0-9]{6,32}$`));
    assert.equal(sb.info.edge, server.edgeId);
    assert.equal(sb.info.backend, 'container');
    assert.equal(sb.info.image, 'busybox');
    assert.match(sb.info.imageId, /^sha256:[0-9a-f]{64}$/);
    assert.deepEqual(sb.info.resources, { cpu: 0.5, memoryMiB: 64, pids: 100 });
    assert.deepEqual(sb.info.labels, { suite: 'lifecycle' });
    assert.ok(!Number.isNaN(Date.parse(sb.info.createdAt)), 'createdAt is a date');
  });

  test('resources not given get the defaults (1 cpu, 512 MiB, 512 pids)', async () => {
    const other = await Sandbox.create({ ...server.conn });
    try {
      assert.deepEqual(other.info.resources, { cpu: 1, memoryMiB: 512, pids: 512 });
    } finally {
      await other.kill();
    }
  });

  test('inspect (GET /v1/sandboxes/:id) returns the sandbox as created', async () => {
    // The fields fixed at create; inspect may add live ones (usage, activity times).
    const fixed = (s: SandboxInfo): Partial<SandboxInfo> => {
      const { id, edge, backend, status, image, imageId, resources, labels, createdAt } = s;
      return { id, edge, backend, status, image, imageId, resources, labels, createdAt };
    };
    const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}`);
    assert.equal(res.status, 200);
    assert.deepEqual(fixed(res.json as SandboxInfo), fixed(sb.info));
    const again = await Sandbox.connect(sb.id, server.conn);
    assert.deepEqual(fixed(again.info), fixed(sb.info));
  });

  test('the memory limit is set on the sandbox cgroup (memory.limit_in_bytes = 64 MiB)', () => {
    const limit = readFileSync(`${sandboxCgroupDir('memory', sb.id)}/memory.limit_in_bytes`, 'utf8').trim();
    assert.equal(Number(limit), 64 * MiB);
  });

  test('the pids limit is set on the sandbox cgroup (pids.max = 100)', () => {
    assert.equal(readFileSync(`${sandboxCgroupDir('pids', sb.id)}/pids.max`, 'utf8').trim(), '100');
  });

  test('the cpu limit is a CFS quota of half a period for cpu 0.5', () => {
    const dir = sandboxCgroupDir('cpu', sb.id);
    const quota = Number(readFileSync(`${dir}/cpu.cfs_quota_us`, 'utf8'));
    const period = Number(readFileSync(`${dir}/cpu.cfs_period_us`, 'utf8'));
    assert.equal(quota * 2, period);
    assert.equal(Number(readFileSync(`${dir}/cpu.shares`, 'utf8')), 512);
  });

  test('the sandbox sees its own memory limit through its cgroup namespace', async () => {
    const r = await sb.commands.run('cat /sys/fs/cgroup/memory/memory.limit_in_bytes');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(Number(r.stdout.trim()), 64 * MiB);
  });

  test("each v1 cgroup hierarchy inside is the sandbox's own cgroup (its init and the command are in it), read-only", async (t) => {
    const names = v1Hierarchies();
    if (!names.length) return t.skip('this host has no v1 cgroup hierarchy (cgroup2 only): crun mounts cgroup2 itself');
    // The edge binds each from the sandbox's dir (edge/oci-config.ts) instead of crun mounting a
    // cgroupfs per hierarchy: a wrong source (the hierarchy's root, another sandbox's dir) lists
    // neither the init (pid 1 in the sandbox's pid namespace) nor this shell.
    const script = names.map(
      (h) => `if grep -qx 1 /sys/fs/cgroup/${h}/cgroup.procs && grep -qx $$ /sys/fs/cgroup/${h}/cgroup.procs; then echo ${h}; fi`,
    );
    const r = await sb.commands.run([...script, 'mkdir /sys/fs/cgroup/pids/x 2>&1 || true', 'cat /sys/fs/cgroup/pids/pids.max'].join('\n'));
    assert.equal(r.exitCode, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.deepEqual(lines.slice(0, names.length), names, `hierarchies that are the sandbox's own:\n${r.stdout}`);
    assert.match(lines[names.length] ?? '', /Read-only file system/);
    assert.equal(lines[names.length + 1], '100');
  });

  test("masked directories and /sys/fs/cgroup's root are the node's shared stub dirs: empty, read-only, and no tmpfs of the sandbox's own (edge/mount-stubs.ts)", async () => {
    const masked = MASKED_PATHS.filter((p) => existsSync(p) && statSync(p).isDirectory());
    const r = await sb.commands.run(
      [
        ...masked.map((d) => `echo "${d}: $(ls -A ${d} | wc -l) entries; $(touch ${d}/x 2>&1 | grep -o 'Read-only file system')"`),
        'mkdir /sys/fs/cgroup/x 2>&1 | grep -o "Read-only file system"',
        // Every mount: where, its superblock's device, its filesystem type.
        `awk '{for(i=1;i<=NF;i++) if($i=="-") print $5, $3, $(i+1)}' /proc/self/mountinfo`,
      ].join('\n'),
    );
    assert.equal(r.exitCode, 0, r.stderr);
    const lines = r.stdout.trim().split('\n');
    assert.deepEqual(
      lines.slice(0, masked.length),
      masked.map((d) => `${d}: 0 entries; Read-only file system`),
    );
    assert.equal(lines[masked.length], 'Read-only file system');
    const mounts = lines.slice(masked.length + 1).map((l) => l.split(' ') as [string, string, string]);
    // The stubs are binds of the data dir's filesystem (a tmpfs itself on an overlay root): the
    // same superblock as the host's stub dir, not one of the sandbox's own.
    const stubs = MOUNT_STUBS_DIR;
    const dev = statSync(stubs).dev;
    const stubDev = `${(dev >> 8) & 0xfff}:${(dev & 0xff) | ((dev >> 12) & 0xfff00)}`;
    for (const d of [...masked, '/sys/fs/cgroup'])
      assert.equal(mounts.find((m) => m[0] === d)?.[1], stubDev, `${d} is not the stub's bind: ${r.stdout}`);
    const ownTmpfs = mounts.filter((m) => m[2] === 'tmpfs' && m[1] !== stubDev).map((m) => m[0]);
    assert.deepEqual(ownTmpfs.sort(), ['/dev', '/dev/shm'], 'the only tmpfs superblocks of the sandbox its own');
    assert.deepEqual(readdirSync(join(stubs, 'empty')), [], 'the shared empty dir on the host stays empty');
  });

  test('a command that allocates past the memory limit is OOM-killed; the sandbox survives', async () => {
    // dd fills a 200 MiB buffer: it cannot fit under the 64 MiB limit (no swap).
    const r = await sb.commands.run('dd if=/dev/zero of=/dev/null bs=200M count=1 2>/dev/null; echo "exit=$?"');
    assert.equal(r.stdout, 'exit=137\n', `dd was not OOM-killed: ${r.stdout} ${r.stderr}`);
    const oom = Number(/oom_kill (\d+)/.exec(readFileSync(`${sandboxCgroupDir('memory', sb.id)}/memory.oom_control`, 'utf8'))?.[1] ?? 0);
    assert.ok(oom >= 1, 'the memory cgroup recorded no OOM kill');
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
  });

  test('the pids limit stops forks past it (pids: 16)', async () => {
    const small = await Sandbox.create({ ...server.conn, resources: { pids: 16 } });
    try {
      const r = await small.commands.run('for i in $(seq 40); do sleep 1008 & done');
      assert.match(r.stderr, /can't fork|Resource temporarily unavailable/, `every fork succeeded: ${r.stderr}`);
      const dir = sandboxCgroupDir('pids', small.id);
      assert.ok(Number(readFileSync(`${dir}/pids.current`, 'utf8')) <= 16);
      assert.ok(Number(/max (\d+)/.exec(readFileSync(`${dir}/pids.events`, 'utf8'))?.[1] ?? 0) >= 1, 'pids.events counted no refused fork');
    } finally {
      await small.kill();
    }
  });

  test('PID 1 inside the sandbox is the dsec init', async () => {
    const r = await sb.commands.run(['cat', '/proc/1/cmdline']);
    assert.equal(r.exitCode, 0, r.stderr);
    assert.ok(r.stdout.includes('dsec-init'), `PID 1 is ${JSON.stringify(r.stdout)}`);
  });

  test('an orphaned process that exits is reaped by the init (no zombie remains)', async () => {
    // The subshell exits at once, so `sleep 1001` is orphaned and reparented to PID 1.
    const start = await sb.commands.run('(sleep 1001 &) ; exit 0');
    assert.equal(start.exitCode, 0, start.stderr);
    const ppid = await sb.commands.run(`ps -o pid,ppid,args | awk '$3 == "sleep" && $4 == "1001" { print $2 }'`);
    assert.equal(ppid.stdout.trim(), '1', 'the orphan is a child of the init');
    // Kill it, then wait (bounded by the exec timeout) until no such process and no zombie is left.
    const r = await sb.commands.run(
      [
        `kill $(ps -o pid,args | awk '$2 == "sleep" && $3 == "1001" { print $1 }')`,
        `while ps -o stat,args | awk '$1 ~ /^Z/ || ($2 == "sleep" && $3 == "1001") { found = 1 } END { exit !found }'; do sleep 0.05; done`,
        'echo reaped',
      ].join('\n'),
      { timeoutMs: 20_000 },
    );
    assert.equal(r.timedOut, false, 'the orphan was never reaped: it stayed a zombie');
    assert.equal(r.stdout.trim(), 'reaped', r.stderr);
  });

  test('list with ?label=k=v returns only sandboxes with that label', async () => {
    const a = await Sandbox.create({ ...server.conn, labels: { team: 'a', run: 'list-test' } });
    const b = await Sandbox.create({ ...server.conn, labels: { team: 'b', run: 'list-test' } });
    try {
      const onlyA = await call(server, 'GET', '/v1/sandboxes?label=team=a');
      assert.equal(onlyA.status, 200);
      assert.deepEqual(
        (onlyA.json as { sandboxes: { id: string }[] }).sandboxes.map((s) => s.id),
        [a.id],
      );
      const both = await Sandbox.list({ ...server.conn, labels: { run: 'list-test' } });
      assert.deepEqual(both.map((s) => s.id).sort(), [a.id, b.id].sort());
      const bAndRun = await Sandbox.list({ ...server.conn, labels: { run: 'list-test', team: 'b' } });
      assert.deepEqual(
        bAndRun.map((s) => s.id),
        [b.id],
      );
      const none = await Sandbox.list({ ...server.conn, labels: { team: 'c' } });
      assert.deepEqual(none, []);
    } finally {
      await a.kill();
      await b.kill();
    }
  });

  test('list without a filter includes running sandboxes; ?status=running filters by status', async () => {
    const all = await Sandbox.list(server.conn);
    assert.ok(all.some((s) => s.id === sb.id));
    const res = await call(server, 'GET', '/v1/sandboxes?status=running');
    assert.equal(res.status, 200);
    const list = (res.json as { sandboxes: { id: string; status: string }[] }).sandboxes;
    assert.ok(list.some((s) => s.id === sb.id));
    assert.ok(list.every((s) => s.status === 'running'));
  });

  test('kill removes the sandbox and everything it had on the host', async () => {
    const victim = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 32 } });
    const id = victim.id;
    const w = await victim.files.write('/tmp/data', 'x');
    assert.equal(w.bytes, 1);
    assert.ok(
      (await findLeaks(server.dataDir, { onlyIds: [id] })).length > 0,
      'a running sandbox has a mount, cgroup, crun container and directory',
    );
    await victim.kill();
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [id] }), []);
  });

  test('ten sandboxes created and killed concurrently leave nothing behind', async () => {
    const sandboxes = await Promise.all(
      Array.from({ length: 10 }, (_, i) => Sandbox.create({ ...server.conn, resources: { memoryMiB: 32 }, labels: { batch: `b${i}` } })),
    );
    const outs = await Promise.all(sandboxes.map((s, i) => s.commands.run(`echo ${i}`)));
    outs.forEach((r, i) => assert.equal(r.stdout, `${i}\n`));
    await Promise.all(sandboxes.map((s) => s.kill()));
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: sandboxes.map((s) => s.id) }), []);
    assert.ok(server.dsec.edge.layerMounts.mounted().length > 0, 'the layer stays mounted for the shared sandbox');
  });

  test('killing a sandbox while a command runs in it ends the command and leaves nothing behind', async () => {
    const victim = await Sandbox.create({ ...server.conn });
    const pending = call(server, 'POST', `/v1/sandboxes/${victim.id}/exec`, { json: { cmd: ['sleep', '1009'], timeoutMs: 120_000 } }).catch(
      (err: Error) => err,
    );
    const started = await victim.commands.run(`until ps -o args | grep -q '^sleep 1009'; do sleep 0.05; done; echo started`);
    assert.equal(started.stdout, 'started\n');
    await victim.kill();
    const answer = await pending; // returns (whatever it says) instead of waiting for sleep 1009
    assert.ok(answer instanceof Error || answer.status > 0);
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [victim.id] }), []);
  });

  test('a killed sandbox is gone from inspect (404) and from the list', async () => {
    const victim = await Sandbox.create({ ...server.conn });
    await victim.kill();
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${victim.id}`), 404, 'SANDBOX_NOT_FOUND');
    await assert.rejects(Sandbox.connect(victim.id, server.conn), NotFoundError);
    assert.ok(!(await Sandbox.list(server.conn)).some((s) => s.id === victim.id));
  });

  test('kill is idempotent: a second DELETE is 204 too, and sb.kill() twice does not throw', async () => {
    const victim = await Sandbox.create({ ...server.conn });
    const first = await call(server, 'DELETE', `/v1/sandboxes/${victim.id}`);
    assert.equal(first.status, 204);
    assert.equal((await call(server, 'DELETE', `/v1/sandboxes/${victim.id}`)).status, 204);
    const other = await Sandbox.create({ ...server.conn });
    await other.kill();
    await other.kill(); // a `finally { await sb.kill() }` after an explicit kill
    await Sandbox.kill(other.id, server.conn);
    await Promise.all([(await Sandbox.create({ ...server.conn })).kill(), Sandbox.kill(victim.id, server.conn)]);
  });

  test('sandboxes are isolated: a file written in one is not visible in another', async () => {
    const other = await Sandbox.create({ ...server.conn });
    try {
      await sb.files.write('/tmp/only-in-first', 'first');
      const r = await other.commands.run('test -e /tmp/only-in-first');
      assert.equal(r.exitCode, 1);
    } finally {
      await other.kill();
    }
  });

  test('the sandbox has no network but loopback', async () => {
    const r = await sb.commands.run('ls /sys/class/net');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split(/\s+/), ['lo']);
  });

  test('bulk by label: pauseAll, resumeAll and killAll touch exactly the matching sandboxes', async () => {
    const labels = { bulk: 'b1' };
    const mine = await Promise.all([1, 2, 3].map(() => Sandbox.create({ ...server.conn, labels: { ...labels, n: 'x' } })));
    const other = await Sandbox.create({ ...server.conn, labels: { bulk: 'b2' } });
    try {
      const ids = mine.map((m) => m.id).sort();
      const paused = await Sandbox.pauseAll({ ...server.conn, labels });
      assert.deepEqual(paused, { ids, failures: [] });
      assert.deepEqual(
        (await Sandbox.list({ ...server.conn, labels })).map((s) => s.status),
        ['paused', 'paused', 'paused'],
      );
      assert.equal((await other.refresh()).status, 'running');
      assert.deepEqual((await Sandbox.resumeAll({ ...server.conn, labels: { bulk: 'b1', n: 'x' } })).ids, ids);
      assert.equal((await mine[0]!.commands.run('echo back')).stdout, 'back\n');
      const killed = await Sandbox.killAll({ ...server.conn, labels });
      assert.deepEqual(killed, { ids, failures: [] });
      assert.deepEqual(await Sandbox.list({ ...server.conn, labels }), []);
      assert.equal((await other.refresh()).status, 'running', 'a sandbox without the label was touched');
      assert.deepEqual(await Sandbox.killAll({ ...server.conn, labels }), { ids: [], failures: [] });
    } finally {
      await other.kill();
      for (const m of mine) await m.kill();
    }
  });

  test('a listing a page at a time (listPage, iterate), the counts, and killAll with its progress', async () => {
    const labels = { pages: 'p1' };
    const mine = await Promise.all([1, 2, 3, 4, 5].map(() => Sandbox.create({ ...server.conn, labels })));
    try {
      const ids = mine.map((m) => m.id).sort();
      const first = await Sandbox.listPage({ ...server.conn, labels, limit: 2 });
      assert.equal(first.sandboxes.length, 2);
      assert.ok(first.next, 'a cursor while there are more');
      const second = await Sandbox.listPage({ ...server.conn, labels, limit: 2, after: first.next! });
      const third = await Sandbox.listPage({ ...server.conn, labels, limit: 2, after: second.next! });
      assert.equal(third.sandboxes.length, 1);
      assert.equal(third.next, undefined, 'no cursor on the last page');
      const paged = [first, second, third].flatMap((p) => p.sandboxes.map((s) => s.id));
      assert.deepEqual([...paged].sort(), ids);
      const iterated: string[] = [];
      for await (const s of Sandbox.iterate({ ...server.conn, labels, pageSize: 2 })) iterated.push(s.id);
      assert.deepEqual(iterated, paged, 'iterate pages in list order');
      const newest = await Sandbox.listPage({ ...server.conn, labels, limit: 3, order: 'newest' });
      const older = await Sandbox.listPage({ ...server.conn, labels, limit: 3, order: 'newest', after: newest.next! });
      assert.deepEqual(
        [...newest.sandboxes, ...older.sandboxes].map((s) => s.id),
        [...paged].reverse(),
        'newest first, page by page',
      );
      const counts = await Sandbox.counts(server.conn);
      assert.ok((counts.counts['running'] ?? 0) >= 5);
      assert.equal(
        counts.total,
        Object.values(counts.counts).reduce((a, b) => a + b, 0),
      );
      await assert.rejects(Sandbox.listPage({ ...server.conn, labels, limit: 0 }), InvalidRequestError);
      const lines: { type: string; total: number; done: number }[] = [];
      const killed = await Sandbox.killAll({ ...server.conn, labels, onProgress: (p) => lines.push(p) });
      assert.deepEqual({ ids: [...killed.ids].sort(), failures: killed.failures }, { ids, failures: [] });
      assert.equal(lines.at(-1)?.type, 'done');
      assert.ok(
        lines.every((l) => l.total === 5),
        JSON.stringify(lines),
      );
      assert.deepEqual(await Sandbox.list({ ...server.conn, labels }), []);
    } finally {
      for (const m of mine) await m.kill();
    }
  });

  test('bulk with no label is refused (never "all"): by the SDK before sending, and by the API with 400', async () => {
    await assert.rejects(Sandbox.killAll({ ...server.conn, labels: {} }), InvalidRequestError);
    expectWireError(await call(server, 'POST', '/v1/sandboxes/kill', { json: { labels: {} } }), 400, 'INVALID_REQUEST');
    expectWireError(await call(server, 'POST', '/v1/sandboxes/pause', { json: {} }), 400, 'INVALID_REQUEST');
    assert.equal((await sb.refresh()).status, 'running');
  });

  test("forks start with the parent's network policy as it is at the fork, not as it was created", async () => {
    const parent = await Sandbox.create({ ...server.conn, network: { mode: 'allow', allow: ['169.254.250.1:80'] } });
    try {
      const before = await parent.fork(1);
      assert.deepEqual(await before.sandboxes[0]!.network().then((n) => [n.mode, n.allow]), [
        'allow',
        [{ cidr: '169.254.250.1/32', port: 80 }],
      ]);
      await parent.setNetwork({ mode: 'none' });
      const after = await parent.fork(1);
      assert.equal((await after.sandboxes[0]!.network()).mode, 'none', 'the fork got the create-time policy');
      for (const f of [...before.sandboxes, ...after.sandboxes]) await f.kill();
    } finally {
      await parent.kill();
    }
  });

  test('a paused sandbox answers its network policy and address (the restart check read it only once resumed)', async () => {
    const p = await Sandbox.create({ ...server.conn, network: { mode: 'open' } });
    try {
      const running = await p.network();
      await p.pause();
      const paused = await p.network();
      assert.equal(paused.mode, 'open');
      assert.ok(paused.address, 'an open policy has a link-local address');
      assert.equal(paused.address, running.address);
      assert.equal((await Sandbox.connect(p.id, server.conn)).info.status, 'paused', 'reading the policy does not resume it');
    } finally {
      await p.kill();
    }
  });
});
