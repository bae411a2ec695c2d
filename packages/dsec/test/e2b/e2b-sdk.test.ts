/**
 * E2B's own SDK (the `e2b` npm package) drives dsec through what its users do: create, commands,
 * files, watch, PTY, pause/connect, list, kill during a run, not found. The SDK is configured
 * only as E2B documents for self-hosting: E2B_API_URL = E2B_SANDBOX_URL = the dsec URL and an
 * `e2b_` key minted by dsec. One server and one shared `base` image (see base-image.ts).
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { CommandExitError, FileNotFoundError, NotFoundError, Sandbox, SandboxNotFoundError, TimeoutError } from 'e2b';
import { which } from '../../src/host/doctor.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { ensureBaseImage } from './base-image.js';
import { wireProtocolTests } from './wire-protocol.js';
import { envdSemanticsTests } from './envd-semantics.js';
import { SYSTEM } from '../../src/control/service/callers.js';

/** Resolves when `check` holds, polling; fails with `what` after a generous bound (not a timing assertion). */
async function eventually(what: string, check: () => boolean | Promise<boolean>, boundMs = 20_000): Promise<void> {
  const until = Date.now() + boundMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`never happened: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

describe('E2B SDK against dsec', { skip: integrationSkipReason(), timeout: 900_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  /** Why the base template could not be built (no Debian mirror…): every test skips with it. */
  let noBase: string | undefined;
  const saved: Record<string, string | undefined> = {};

  before(async () => {
    server = await startTestServer();
    if (!which('debootstrap')) {
      noBase = 'debootstrap is not installed (the base template is a Debian image)';
      process.stderr.write(`# skipping E2B SDK tests: ${noBase}\n`);
      return;
    }
    try {
      await ensureBaseImage(server.dsec.images, (m) => process.stderr.write(`# ${m}\n`));
    } catch (err) {
      noBase = `debootstrap could not build the base template (is the Debian mirror reachable?): ${(err as Error).message.split('\n')[0]}`;
      process.stderr.write(`# skipping E2B SDK tests: ${noBase}\n`);
      return;
    }
    const res = await fetch(`${server.url}/v1/e2b/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'e2b-test' }),
    });
    assert.equal(res.status, 201);
    const { key } = (await res.json()) as { key: string };
    assert.match(key, /^e2b_[0-9a-f]{40}$/);
    for (const [k, v] of Object.entries({ E2B_API_URL: server.url, E2B_SANDBOX_URL: server.url, E2B_API_KEY: key })) {
      saved[k] = process.env[k];
      process.env[k] = v;
    }
    sb = await Sandbox.create({ timeoutMs: 600_000 });
  });

  after(async () => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await server?.close();
  });

  test('create gives a running sandbox of the base template with its info', async (t) => {
    if (noBase) return t.skip(noBase);
    assert.match(sb.sandboxId, /^sb-/);
    assert.equal(await sb.isRunning(), true);
    const info = await sb.getInfo();
    assert.equal(info.sandboxId, sb.sandboxId);
    assert.equal(info.templateId, 'base');
    assert.equal(info.state, 'running');
    assert.ok(info.endAt.getTime() > info.startedAt.getTime());
  });

  test('commands run as user in /home/user; user, cwd and envs apply; a failure is a CommandExitError', async (t) => {
    if (noBase) return t.skip(noBase);
    const who = await sb.commands.run('whoami; pwd; echo $HOME; echo err >&2');
    assert.equal(who.exitCode, 0);
    assert.equal(who.stdout, 'user\n/home/user\n/home/user\n');
    assert.equal(who.stderr, 'err\n');
    assert.equal((await sb.commands.run('whoami', { user: 'root' })).stdout, 'root\n');
    await sb.commands.run('useradd --create-home agent', { user: 'root' });
    assert.equal((await sb.commands.run('whoami; pwd', { user: 'agent' })).stdout, 'agent\n/home/agent\n');
    assert.equal((await sb.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n');
    assert.equal((await sb.commands.run('echo "$GREETING $N"', { envs: { GREETING: 'hello', N: '3' } })).stdout, 'hello 3\n');
    assert.equal((await sb.commands.run('python3 -c "print(6*7)"')).stdout, '42\n');
    await assert.rejects(sb.commands.run('echo out; echo bad >&2; exit 3'), (err: unknown) => {
      assert.ok(err instanceof CommandExitError);
      assert.equal(err.exitCode, 3);
      assert.equal(err.stdout, 'out\n');
      assert.equal(err.stderr, 'bad\n');
      return true;
    });
  });

  test('output streams to onStdout/onStderr as the command writes it', async (t) => {
    if (noBase) return t.skip(noBase);
    const out: string[] = [];
    const err: string[] = [];
    const r = await sb.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.05; done', {
      onStdout: (d) => void out.push(d),
      onStderr: (d) => void err.push(d),
    });
    assert.equal(out.join(''), 'o1\no2\no3\n');
    assert.equal(err.join(''), 'e1\ne2\ne3\n');
    assert.equal(r.stdout, 'o1\no2\no3\n');
  });

  test('background commands: list, connect by pid, kill', async (t) => {
    if (noBase) return t.skip(noBase);
    const h = await sb.commands.run('sleep 300', { background: true });
    assert.ok(h.pid > 0);
    const listed = await sb.commands.list();
    const mine = listed.find((p) => p.pid === h.pid);
    assert.ok(mine, `pid ${h.pid} not in ${JSON.stringify(listed)}`);
    assert.equal(mine.cmd, '/bin/bash');
    assert.deepEqual(mine.args, ['-l', '-c', 'sleep 300']);
    const again = await sb.commands.connect(h.pid);
    assert.equal(again.pid, h.pid);
    assert.equal(await sb.commands.kill(h.pid), true);
    // At once: the edge may list it as running a moment longer while its starter reaps it.
    assert.ok(!(await sb.commands.list()).some((p) => p.pid === h.pid), 'the killed process leaves the list at once');
    await assert.rejects(again.wait(), CommandExitError);
    assert.equal(await sb.commands.kill(999_999), false);
  });

  test('stdin: send input, close it, read what the command made of it', async (t) => {
    if (noBase) return t.skip(noBase);
    const h = await sb.commands.run('tr a-z A-Z', { background: true, stdin: true });
    await sb.commands.sendStdin(h.pid, 'hello ');
    await h.sendStdin('e2b\n');
    await h.closeStdin();
    const r = await h.wait();
    assert.equal(r.stdout, 'HELLO E2B\n');
  });

  test('a command outlives a disconnected client and can be connected to again', async (t) => {
    if (noBase) return t.skip(noBase);
    const h = await sb.commands.run('sleep 0.5; echo late; echo done > /tmp/outlived', { background: true });
    await h.disconnect();
    const again = await sb.commands.connect(h.pid);
    const r = await again.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(r.stdout, 'late\n');
    assert.equal(await sb.files.read('/tmp/outlived'), 'done\n');
  });

  test('a command past its timeoutMs fails with TimeoutError and is killed', async (t) => {
    if (noBase) return t.skip(noBase);
    await assert.rejects(sb.commands.run('sleep 60; echo never > /tmp/never', { timeoutMs: 1500 }), TimeoutError);
    // At once, not a second later (issue 30): the list right after the TimeoutError no longer has it.
    const listed = await sb.commands.list();
    assert.ok(!listed.some((p) => p.args.includes('sleep 60; echo never > /tmp/never')), JSON.stringify(listed));
    assert.equal(await sb.files.exists('/tmp/never'), false);
  });

  test('files: text, bytes and streams; relative paths are under the home and owned by the user', async (t) => {
    if (noBase) return t.skip(noBase);
    const w = await sb.files.write('notes/hello.txt', 'hello from e2b\n');
    assert.equal(w.path, '/home/user/notes/hello.txt');
    assert.equal(await sb.files.read('/home/user/notes/hello.txt'), 'hello from e2b\n');
    const bytes = new Uint8Array([0, 1, 2, 250, 255]);
    await sb.files.write('/tmp/bytes.bin', bytes.buffer);
    assert.deepEqual(await sb.files.read('/tmp/bytes.bin', { format: 'bytes' }), bytes);
    // the user may change what it was given
    assert.equal(
      (await sb.commands.run('echo more >> notes/hello.txt && stat -c %U:%G notes notes/hello.txt')).stdout,
      'user:user\nuser:user\n',
    );
    const stream = await sb.files.read('notes/hello.txt', { format: 'stream' });
    const chunks: Uint8Array[] = [];
    for await (const c of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(c);
    assert.equal(Buffer.concat(chunks).toString(), 'hello from e2b\nmore\n');
    const big = Buffer.alloc(3 << 20, 'x');
    await sb.files.write('/tmp/streamed.txt', new Blob([big]).stream());
    assert.equal((await sb.files.getInfo('/tmp/streamed.txt')).size, big.length);
    const zipped = 'zipped both ways\n'.repeat(200);
    await sb.files.write('/tmp/gz.txt', zipped, { gzip: true });
    assert.equal(await sb.files.read('/tmp/gz.txt', { gzip: true }), zipped);
    await sb.files.write([
      { path: '/tmp/multi/a.txt', data: 'A' },
      { path: '/tmp/multi/b.txt', data: 'B' },
    ]);
    assert.equal((await sb.commands.run('cat /tmp/multi/a.txt /tmp/multi/b.txt')).stdout, 'AB');
    await assert.rejects(sb.files.read('/tmp/no-such-file'), FileNotFoundError);
  });

  test('files: list with depth, exists, info, makeDir, rename, remove', async (t) => {
    if (noBase) return t.skip(noBase);
    assert.equal(await sb.files.makeDir('tree/a/b'), true);
    assert.equal(await sb.files.makeDir('tree/a/b'), false);
    await sb.files.write('tree/a/b/c.txt', 'c');
    await sb.files.write('tree/top.txt', 'top');
    const one = (await sb.files.list('tree')).map((e) => e.name).sort();
    assert.deepEqual(one, ['a', 'top.txt']);
    const deep = (await sb.files.list('/home/user/tree', { depth: 3 })).map((e) => e.path).sort();
    assert.deepEqual(deep, ['/home/user/tree/a', '/home/user/tree/a/b', '/home/user/tree/a/b/c.txt', '/home/user/tree/top.txt']);
    const info = await sb.files.getInfo('tree/top.txt');
    assert.equal(info.type, 'file');
    assert.equal(info.size, 3);
    assert.equal(info.owner, 'user');
    assert.equal(info.permissions, '-rw-r--r--');
    assert.equal((await sb.files.getInfo('tree/a')).type, 'dir');
    assert.equal(await sb.files.exists('tree/top.txt'), true);
    assert.equal(await sb.files.exists('tree/nope'), false);
    const moved = await sb.files.rename('tree/top.txt', 'tree/moved.txt');
    assert.equal(moved.path, '/home/user/tree/moved.txt');
    assert.equal(await sb.files.read('tree/moved.txt'), 'top');
    await sb.files.remove('tree/a');
    assert.equal(await sb.files.exists('tree/a/b/c.txt'), false);
    await assert.rejects(sb.files.list('tree/missing'), NotFoundError);
  });

  test('files: watchDir reports creates, writes and removes', async (t) => {
    if (noBase) return t.skip(noBase);
    await sb.files.makeDir('watched');
    const events: { name: string; type: string }[] = [];
    const handle = await sb.files.watchDir('watched', (e) => void events.push({ name: e.name, type: e.type }));
    try {
      await sb.files.write('watched/new.txt', 'one');
      await eventually('a create event', () => events.some((e) => e.name === 'new.txt' && e.type === 'create'));
      await sb.commands.run('echo two >> watched/new.txt');
      await eventually('a write event', () => events.some((e) => e.name === 'new.txt' && e.type === 'write'));
      await sb.files.remove('watched/new.txt');
      await eventually('a remove event', () => events.some((e) => e.name === 'new.txt' && e.type === 'remove'));
    } finally {
      await handle.stop();
    }
  });

  test('PTY: create, send input, resize, kill', async (t) => {
    if (noBase) return t.skip(noBase);
    let out = '';
    const dec = new TextDecoder();
    const term = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d, { stream: true })) });
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('echo $((6*7)); whoami\n'));
    await eventually('the terminal answers', () => /42\r?\nuser/.test(out));
    await sb.pty.resize(term.pid, { cols: 100, rows: 30 });
    await sb.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'));
    await eventually('stty sees the new size', () => out.includes('30 100'));
    assert.equal(await sb.pty.kill(term.pid), true);
    await assert.rejects(term.wait(), CommandExitError);
  });

  test('file paths stay inside the sandbox: .. and symlinks to host paths find nothing of the host', async (t) => {
    if (noBase) return t.skip(noBase);
    const dir = mkdtempSync('/var/tmp/dsec-e2b-host-');
    try {
      writeFileSync(join(dir, 'secret'), 'host only');
      await assert.rejects(sb.files.read(`/../../../..${dir}/secret`), FileNotFoundError);
      await sb.commands.run(`ln -s ${dir} /tmp/to-host`);
      await assert.rejects(sb.files.read('/tmp/to-host/secret'), FileNotFoundError);
      // the link resolves inside the sandbox, where that directory does not exist
      await assert.rejects(sb.files.write('/tmp/to-host/planted', 'x'), FileNotFoundError);
      assert.equal(existsSync(join(dir, 'planted')), false, 'a write through a symlink reached the host');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('E2B calls go through the control plane: the trajectory log has them', async (t) => {
    if (noBase) return t.skip(noBase);
    const res = await fetch(`${server.url}/v1/sandboxes/${sb.sandboxId}/trajectory`, {
      headers: { authorization: `Bearer ${server.apiKey}` },
    });
    assert.equal(res.status, 200);
    const kinds = new Set(((await res.json()) as { entries: { kind: string }[] }).entries.map((e) => e.kind));
    for (const k of ['process.start', 'files.write', 'files.mkdir', 'files.rename', 'files.remove'])
      assert.ok(kinds.has(k), `no ${k} in ${[...kinds].join(', ')}`);
  });

  test('list filters by metadata and pages; pause, connect (resume), setTimeout', async (t) => {
    if (noBase) return t.skip(noBase);
    const other = await Sandbox.create('base', {
      metadata: { suite: 'e2b-test', which: 'other' },
      envs: { TASK_ID: 't-42' },
      timeoutMs: 120_000,
    });
    try {
      assert.equal((await other.commands.run('echo $TASK_ID')).stdout, 't-42\n');
      const page = await Sandbox.list({ query: { metadata: { which: 'other' } } }).nextItems();
      assert.deepEqual(
        page.map((s) => s.sandboxId),
        [other.sandboxId],
      );
      assert.deepEqual(page[0]!.metadata, { suite: 'e2b-test', which: 'other' });
      const pager = Sandbox.list({ limit: 1 });
      const first = await pager.nextItems();
      assert.equal(first.length, 1);
      assert.equal(pager.hasNext, true);
      const second = await pager.nextItems();
      assert.equal(second.length, 1);
      assert.notEqual(second[0]!.sandboxId, first[0]!.sandboxId);

      await other.setTimeout(300_000);
      assert.ok((await other.getInfo()).endAt.getTime() > Date.now() + 200_000);
      await other.files.write('/tmp/kept', 'kept across pause');
      assert.equal(await other.pause(), true);
      assert.equal((await Sandbox.getInfo(other.sandboxId)).state, 'paused');
      assert.equal(await other.isRunning(), false);
      const resumed = await Sandbox.connect(other.sandboxId);
      assert.equal((await resumed.getInfo()).state, 'running');
      assert.equal(await resumed.files.read('/tmp/kept'), 'kept across pause');
    } finally {
      await other.kill();
    }
  });

  test('sandbox timeouts: past its timeout a sandbox is killed, or paused with onTimeout pause', async (t) => {
    if (noBase) return t.skip(noBase);
    const short = await Sandbox.create('base', { timeoutMs: 1000 });
    const napper = await Sandbox.create('base', { timeoutMs: 1000, lifecycle: { onTimeout: 'pause' } });
    try {
      await eventually('the short sandbox is gone', async () => !(await short.isRunning()));
      await assert.rejects(Sandbox.getInfo(short.sandboxId), SandboxNotFoundError);
      await eventually('the napper is paused', async () => (await Sandbox.getInfo(napper.sandboxId)).state === 'paused');
      const awake = await Sandbox.connect(napper.sandboxId, { timeoutMs: 60_000 });
      assert.equal((await awake.commands.run('echo awake')).stdout, 'awake\n');
    } finally {
      await Sandbox.kill(napper.sandboxId);
      await server.dsec.control.sandboxes.kill(SYSTEM, short.sandboxId).catch(() => undefined); // its stopped record
    }
  });

  test('kill during a run fails the run; the sandbox is then not found', async (t) => {
    if (noBase) return t.skip(noBase);
    const doomed = await Sandbox.create('base', { timeoutMs: 120_000 });
    const run = doomed.commands.run('sleep 120').then(
      () => undefined,
      (err: unknown) => err,
    );
    await eventually('the command runs', async () => (await doomed.commands.list()).length > 0);
    assert.equal(await Sandbox.kill(doomed.sandboxId), true);
    // As on E2B, where the sandbox's VM and the connection with it are gone: the SDK probes the
    // sandbox's health and reports the kill.
    const err = await run;
    assert.ok(err instanceof TimeoutError, `the run ended with ${String(err)}`);
    assert.match(err.message, /sandbox was killed or reached its end of life while the request was in flight/);
    await assert.rejects(Sandbox.connect(doomed.sandboxId), SandboxNotFoundError);
    await assert.rejects(Sandbox.getInfo(doomed.sandboxId), SandboxNotFoundError);
    assert.equal(await doomed.isRunning(), false);
    await assert.rejects(doomed.commands.run('true'), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(doomed.sandboxId), false);
  });

  test('a sandbox that never existed, a missing template and unsupported calls fail clearly', async (t) => {
    if (noBase) return t.skip(noBase);
    await assert.rejects(Sandbox.connect('sb-nope-0000000000000'), SandboxNotFoundError);
    await assert.rejects(Sandbox.create('no-such-template'), /template "no-such-template" not found/);
    await assert.rejects(sb.getMetrics(), /not supported by dsec/);
    await assert.rejects(Sandbox.create('base', { mcp: { exa: { apiKey: 'x' } } } as never), /mcp is not supported by dsec/);
    const res = await fetch(`${server.url}/sandboxes`, { headers: { 'x-api-key': 'e2b_0000' } });
    assert.equal(res.status, 401);
  });

  envdSemanticsTests(() => ({ sb, noBase }));
  wireProtocolTests(() => server);
});
