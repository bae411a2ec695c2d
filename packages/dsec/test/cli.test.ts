/** The dsec CLI, run as a separate process against a real server. */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { Image, Sandbox } from '@dsec/sdk';
import {
  assertCleanAndRemove,
  integrationSkipReason,
  makeDataDir,
  makeScratchDir,
  newEdgeId,
  startTestServer,
  type TestServer,
} from './helpers/server.js';

const CLI = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
  /** stdout as the bytes the CLI wrote. */
  stdoutBytes: Buffer;
}

/**
 * Runs the CLI with only the given env (plus PATH), so no developer config leaks in. A CLI still
 * running after `guardMs` is killed (it would otherwise hang the suite), which fails its test.
 * `pipeIn` runs it as `printf %s PIPEIN | dsec …` under sh, so its stdin is a real shell pipe.
 */
function runCli(args: string[], env: Record<string, string>, guardMs = 60_000, pipeIn?: string): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const fullEnv = { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...env };
    const child =
      pipeIn === undefined
        ? spawn(process.execPath, [CLI, ...args], { env: fullEnv, stdio: ['ignore', 'pipe', 'pipe'] })
        : spawn('/bin/sh', ['-c', 'printf %s "$PIPEIN" | "$@"', 'sh', process.execPath, CLI, ...args], {
            env: { ...fullEnv, PIPEIN: pipeIn },
            stdio: ['ignore', 'pipe', 'pipe'],
          });
    const out: Buffer[] = [];
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const guard = setTimeout(() => child.kill('SIGKILL'), guardMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(guard);
      const stdoutBytes = Buffer.concat(out);
      resolve({ code, stdout: stdoutBytes.toString('utf8'), stderr, stdoutBytes });
    });
  });
}

/** A user's mistake is one line of explanation, never a stack trace. */
function assertNoStack(r: CliResult): void {
  assert.doesNotMatch(r.stderr, /^\s+at /m, `a stack trace was printed:\n${r.stderr}`);
}

describe('cli', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let env: Record<string, string>;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, labels: { via: 'cli-test' } });
    env = { DSEC_URL: server.url, DSEC_API_KEY: server.apiKey, DSEC_DATA_DIR: server.dataDir };
  });
  after(async () => {
    await server?.close();
  });

  test('ps --json prints valid JSON listing the sandbox', async () => {
    const r = await runCli(['ps', '--json'], env);
    assert.equal(r.code, 0, r.stderr);
    const list = JSON.parse(r.stdout) as { id: string; status: string }[];
    assert.ok(Array.isArray(list));
    assert.ok(
      list.some((s) => s.id === sb.id && s.status === 'running'),
      r.stdout,
    );
  });

  test('run --count N creates a batch: progress lines when not a terminal, then the ids', async () => {
    const r = await runCli(['run', 'busybox', '--count', '4', '-m', '32', '-l', 'via=cli-batch'], env);
    assert.equal(r.code, 0, r.stderr);
    const ids = r.stdout.trim().split('\n');
    assert.equal(ids.length, 4);
    assert.ok(
      ids.every((id) => id.startsWith(`sb-${server.edgeId}-`)),
      r.stdout,
    );
    assert.match(r.stderr, /creating 4 sandboxes: 4\/4 \(100%\)/);
    assert.match(r.stderr, /batch batch-[0-9a-f]+: 4 running, 0 failed/);
    const listed = await Sandbox.list({ ...server.conn, labels: { via: 'cli-batch' } });
    assert.deepEqual(listed.map((s) => s.id).sort(), [...ids].sort());
    for (const id of ids) await Sandbox.kill(id, server.conn);
  });

  test('dsec edge with a control plane that does not answer: one line naming --join, nothing left running or mounted', async () => {
    const dir = makeDataDir();
    const closed = await new Promise<number>((resolve) => {
      const srv = createServer();
      srv.listen(0, '127.0.0.1', () => {
        const port = (srv.address() as AddressInfo).port;
        srv.close(() => resolve(port));
      });
    });
    const r = await runCli(
      [
        'edge',
        '--join',
        `http://127.0.0.1:${closed}`,
        '--token',
        'dsecjoin_x',
        '--data-dir',
        dir,
        '--listen',
        '127.0.0.1:0',
        '--log-level',
        'warn',
      ],
      env,
    );
    assert.equal(r.code, 1);
    assert.match(r.stderr, /could not join the control plane: cannot reach .* \(ECONNREFUSED\); check --join/);
    assertNoStack(r);
    await assertCleanAndRemove(dir, readFileSync(join(dir, 'edge-id'), 'utf8').trim());
  });

  test('ps --json -l k=v filters by label', async () => {
    const r = await runCli(['ps', '--json', '-l', 'via=nobody'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(JSON.parse(r.stdout), []);
  });

  test('ps without --json prints a table with the sandbox id', async () => {
    const r = await runCli(['ps'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^\s*ID\s+STATUS/m);
    assert.ok(r.stdout.includes(sb.id));
  });

  test('exec ID -- echo hi prints hi and exits 0', async () => {
    const r = await runCli(['exec', sb.id, '--', 'echo', 'hi'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'hi\n');
  });

  test("exec exits with the command's exit code and passes its stderr through", async () => {
    const r = await runCli(['exec', sb.id, '--', 'sh', '-c', 'echo oops >&2; exit 3'], env);
    assert.equal(r.code, 3);
    assert.equal(r.stderr, 'oops\n');
  });

  test('exec on an unknown sandbox exits 1 naming SANDBOX_NOT_FOUND', async () => {
    const r = await runCli(['exec', 'sb-local-0000000000000', '--', 'true'], env);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /SANDBOX_NOT_FOUND/);
  });

  test('a wrong API key: the CLI exits 1 naming UNAUTHORIZED', async () => {
    const r = await runCli(['ps', '--json'], { ...env, DSEC_API_KEY: 'wrong' });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /UNAUTHORIZED/);
  });

  test('run busybox --rm -- echo from-run creates, runs and removes a sandbox', async () => {
    const r = await runCli(['run', 'busybox', '--rm', '-l', 'via=cli-run', '--', 'echo', 'from-run'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'from-run\n');
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { via: 'cli-run' } }), []);
  });

  test('run IMAGE with no command prints the id on stdout (ID=$(dsec run busybox))', async () => {
    const r = await runCli(['run', 'busybox', '-m', '32', '-l', 'via=cli-id'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^sb-[a-z0-9-]+\n$/);
    const [made] = await Sandbox.list({ ...server.conn, labels: { via: 'cli-id' } });
    assert.equal(r.stdout, `${made!.id}\n`);
    await Sandbox.kill(made!.id, server.conn);
  });

  test('run --network allow --allow, then network ID none switches the policy; a bad mode exits 1 saying what to use', async () => {
    const r = await runCli(['run', 'busybox', '--network', 'allow', '--allow', '169.254.250.1:80', '--json'], env);
    assert.equal(r.code, 0, r.stderr);
    const info = JSON.parse(r.stdout) as { id: string };
    try {
      const made = await Sandbox.connect(info.id, server.conn);
      assert.equal((await made.network()).mode, 'allow');
      const sw = await runCli(['network', info.id, 'none'], env);
      assert.equal(sw.code, 0, sw.stderr);
      assert.match(sw.stdout, /^none \(applied in [\d.]+ ms\)\n$/);
      const now = await made.network();
      assert.equal(now.mode, 'none');
      assert.ok(now.address, 'the link is kept under none (so that switching back is fast)');
      const bad = await runCli(['network', info.id, 'sideways'], env);
      assert.equal(bad.code, 1);
      assert.match(bad.stderr, /MODE must be none, allow or open/);
      assert.doesNotMatch(bad.stderr, /--network/, 'the message names an option of run, not of network');
      assertNoStack(bad);
      const noDest = await runCli(['network', info.id, 'allow'], env);
      assert.equal(noDest.code, 1, 'allow without --allow was accepted');
      assert.match(noDest.stderr, /allow needs at least one --allow DEST/);
      assertNoStack(noDest);
      assert.equal((await made.network()).mode, 'none', 'the refused switch changed the policy');
    } finally {
      await (await Sandbox.connect(info.id, server.conn)).kill();
    }
  });

  test('kill ID removes the sandbox', async () => {
    const victim = await Sandbox.create(server.conn);
    const r = await runCli(['kill', victim.id], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout.trim(), victim.id);
    assert.ok(!(await Sandbox.list(server.conn)).some((s) => s.id === victim.id));
  });

  test('doctor --no-fix --json exits 0 and prints the checks as JSON', async () => {
    const r = await runCli(['doctor', '--no-fix', '--json'], env);
    assert.equal(r.code, 0, r.stderr + r.stdout);
    const checks = JSON.parse(r.stdout) as { name: string; ok: boolean; required: boolean }[];
    assert.ok(checks.length > 0);
    assert.ok(
      checks.every((c) => c.ok || !c.required),
      r.stdout,
    );
    assert.ok(checks.some((c) => c.name === 'running as root' && c.ok));
  });

  test('image ls --json lists the busybox image of the data dir', async () => {
    const r = await runCli(['image', 'ls', '--json', '--data-dir', server.dataDir], env);
    assert.equal(r.code, 0, r.stderr);
    const images = JSON.parse(r.stdout) as { names: string[] }[];
    assert.ok(
      images.some((i) => i.names.includes('busybox:latest')),
      r.stdout,
    );
  });

  test('up on a data dir another process serves refuses to start', async () => {
    const r = await runCli(['up', '--data-dir', server.dataDir, '--listen', '127.0.0.1:0', '--log-level', 'silent'], env, 20_000);
    assert.equal(r.code, 1, `second server started: ${r.stdout}`);
    assert.match(r.stderr, /already runs/);
  });

  test('without DSEC_URL and DSEC_API_KEY the CLI reads client.json from the data dir', async () => {
    const r = await runCli(['exec', sb.id, '--', 'echo', 'via-client-json'], { DSEC_DATA_DIR: server.dataDir });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'via-client-json\n');
  });

  test('with no server configured the CLI exits 1 with a clear message', async () => {
    const r = await runCli(['ps'], { DSEC_DATA_DIR: `${server.dataDir}/does-not-exist` });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /no dsec server configured/);
  });

  test('piped stdin reaches the command: printf hello | dsec exec ID -- cat (with and without -i)', async () => {
    const r = await runCli(['exec', sb.id, '--', 'cat'], env, 60_000, 'hello');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'hello');
    const ri = await runCli(['exec', '-i', sb.id, '--', 'wc', '-c'], env, 60_000, 'four');
    assert.equal(ri.code, 0, ri.stderr);
    assert.equal(ri.stdout.trim(), '4');
  });

  test('run IMAGE -- CMD takes piped stdin too', async () => {
    const r = await runCli(['run', 'busybox', '--rm', '--', 'cat'], env, 60_000, 'via-run');
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, 'via-run');
  });

  test('exec output is binary-safe: the exact bytes, no U+FFFD', async () => {
    const r = await runCli(['exec', sb.id, '--', 'sh', '-c', 'printf "\\377\\376\\000ok"'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual([...r.stdoutBytes], [0xff, 0xfe, 0x00, 0x6f, 0x6b]);
  });

  test('options after the sandbox id belong to the command: exec ID echo -w /tmp', async () => {
    const r = await runCli(['exec', sb.id, 'echo', '-w', '/tmp'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, '-w /tmp\n');
    const before = await runCli(['exec', '-w', '/tmp', sb.id, 'pwd'], env);
    assert.equal(before.stdout, '/tmp\n', "options before the id are still dsec's");
    const misplaced = await runCli(['exec', sb.id, '--timeout', '500', 'sleep', '5'], env);
    assert.equal(misplaced.code, 1);
    assert.match(misplaced.stderr, /--timeout comes after the sandbox id.*put dsec's options before the id/);
    assertNoStack(misplaced);
  });

  test('exec streams more than 1 MiB of output uncapped', async () => {
    const r = await runCli(['exec', sb.id, '--', 'sh', '-c', 'head -c 3000000 /dev/zero'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdoutBytes.length, 3_000_000);
  });

  test('kill is idempotent: killing a killed sandbox exits 0', async () => {
    const victim = await Sandbox.create(server.conn);
    assert.equal((await runCli(['kill', victim.id], env)).code, 0);
    const again = await runCli(['kill', victim.id], env);
    assert.equal(again.code, 0, again.stderr);
  });

  test('image build with an invalid --name fails before building, without a stack trace', async () => {
    const r = await runCli(['image', 'build', 'busybox', '--name', 'BadName', '--data-dir', server.dataDir], env);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /invalid image name "BadName": use lower-case/);
    assert.doesNotMatch(r.stderr, /laying out|packing/, 'the build ran before the name was checked');
    assertNoStack(r);
  });

  test('a bad option value is refused by name, without a stack trace', async () => {
    for (const args of [
      ['run', 'busybox', '-m', 'lots'],
      ['run', 'busybox', '-e', 'NOVALUE'],
      ['exec', '--timeout', 'soon', sb.id, 'true'],
    ]) {
      const r = await runCli(args, env);
      assert.equal(r.code, 1, args.join(' '));
      assert.match(r.stderr, /invalid/, args.join(' '));
      assertNoStack(r);
    }
  });

  test('up on a port in use exits 1 saying so, without a stack trace, and leaves nothing behind', async () => {
    const blocker = createServer();
    await new Promise<void>((r) => blocker.listen(0, '127.0.0.1', r));
    const port = (blocker.address() as AddressInfo).port;
    const dataDir = makeDataDir();
    try {
      const r = await runCli(
        ['up', '--data-dir', dataDir, '--listen', `127.0.0.1:${port}`, '--log-level', 'silent', '--edge-id', newEdgeId()],
        {},
        30_000,
      );
      assert.equal(r.code, 1, r.stdout);
      assert.match(r.stderr, /cannot listen on 127\.0\.0\.1:\d+: the address is in use/);
      assertNoStack(r);
      assert.ok(!existsSync(join(dataDir, 'dsec.pid')), 'the pid lock was left behind');
    } finally {
      await new Promise((r) => blocker.close(r));
      await assertCleanAndRemove(dataDir, 'none');
    }
  });

  test('up with an edge id another dsec on the host holds exits 1 naming it and DSEC_EDGE_ID, without a stack trace', async () => {
    const dataDir = makeDataDir();
    try {
      const r = await runCli(
        ['up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--log-level', 'silent', '--edge-id', server.edgeId],
        {},
        30_000,
      );
      assert.equal(r.code, 1, r.stdout);
      assert.match(r.stderr, /edge id \w+ is already in use on this host .*DSEC_EDGE_ID/);
      assertNoStack(r);
    } finally {
      await assertCleanAndRemove(dataDir, 'none');
    }
  });

  test('up whose crun state cannot be listed exits 1 with the one-line reason, without a stack trace', async () => {
    const dataDir = makeDataDir();
    // A container in crun's root whose status file is not JSON: `crun list` fails on it.
    const broken = join(dataDir, 'node', 'crun', 'sb-broken');
    mkdirSync(broken, { recursive: true });
    writeFileSync(join(broken, 'status'), 'not json');
    try {
      const r = await runCli(
        ['up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--log-level', 'silent', '--edge-id', newEdgeId()],
        {},
        60_000,
      );
      assert.equal(r.code, 1, r.stdout);
      assert.match(r.stderr, /^dsec: edge \w+ cannot start: crun cannot list its containers under .*Fix crun's state and start again/m);
      assertNoStack(r);
    } finally {
      rmSync(broken, { recursive: true, force: true });
      await assertCleanAndRemove(dataDir, 'none');
    }
  });

  test('demo with DSEC_URL runs on the server it names: its image, its sandboxes; nothing in a local data dir', async () => {
    const local = makeDataDir();
    const remote = { DSEC_URL: server.url, DSEC_API_KEY: server.apiKey, DSEC_DATA_DIR: local };
    try {
      const r = await runCli(['demo', '-n', '2', '--json'], remote, 180_000);
      assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
      const report = JSON.parse(r.stdout) as { ok: boolean; url: string; startedServer: boolean; sandboxes: number };
      assert.equal(report.ok, true, r.stdout);
      assert.equal(report.url, server.url);
      assert.equal(report.startedServer, false, 'no server of its own on the local data dir');
      assert.match(r.stderr, /\(DSEC_URL; its host is not checked for leaks from here\)/);
      assert.ok(!existsSync(join(local, 'images')) || readdirSync(join(local, 'images')).length === 0, 'a local image store was written');
      assert.ok(!existsSync(join(local, 'client.json')), 'a local server was started');
    } finally {
      await assertCleanAndRemove(local, 'none');
    }
  });

  test('image build and ls with DSEC_URL act on the server it names, not on a local data dir', async () => {
    // A data dir of this host that is not the server's: nothing may land in it.
    const local = makeDataDir();
    const remote = { DSEC_URL: server.url, DSEC_API_KEY: server.apiKey, DSEC_DATA_DIR: local };
    try {
      const built = await runCli(['image', 'build', 'busybox', '--name', 'via-url'], remote, 120_000);
      assert.equal(built.code, 0, built.stderr);
      assert.match(built.stderr, /on the dsec server at http/);
      const onServer = await Image.get('via-url', server.conn);
      assert.equal(built.stdout.trim(), `via-url:latest ${onServer.id}`);
      assert.ok(
        !existsSync(join(local, 'images')) || readdirSync(join(local, 'images')).length === 0,
        'the build wrote a local image store',
      );
      const ls = await runCli(['image', 'ls', '--json'], remote);
      assert.equal(ls.code, 0, ls.stderr);
      assert.ok(
        (JSON.parse(ls.stdout) as { names: string[] }[]).some((i) => i.names.includes('via-url:latest')),
        ls.stdout,
      );

      // What only a local store can do is refused, saying how, not done elsewhere.
      const ctx = makeScratchDir('cli-dockerfile');
      writeFileSync(join(ctx, 'Dockerfile'), 'FROM busybox\nRUN echo hi > /hi\n');
      try {
        const refused = await runCli(['image', 'build', ctx, '--name', 'df-via-url'], remote);
        assert.equal(refused.code, 1, refused.stdout);
        assert.match(
          refused.stderr,
          /^dsec: a Dockerfile build writes into an image store on this host, but DSEC_URL names the dsec server at .*--data-dir/m,
        );
        assertNoStack(refused);
        await assert.rejects(Image.get('df-via-url', server.conn), { name: 'NotFoundError' });
      } finally {
        rmSync(ctx, { recursive: true, force: true });
      }
    } finally {
      await Image.delete('via-url', server.conn).catch(() => undefined);
      await assertCleanAndRemove(local, 'none');
    }
  });

  test('a snapshot tagged with a built name does not fool the build cache', async () => {
    const dd = ['--data-dir', server.dataDir];
    const built = await runCli(['image', 'build', 'busybox', '--name', 'bbx', ...dd], env);
    assert.equal(built.code, 0, built.stderr);
    const base = await Sandbox.create({ ...server.conn, image: 'bbx' });
    try {
      await base.commands.run('echo tampered > /etc/motd', { throwOnError: true });
      const snap = await runCli(['snapshot', base.id, '--name', 'bbx'], env);
      assert.equal(snap.code, 0, snap.stderr);
    } finally {
      await base.kill();
    }
    const rebuilt = await runCli(['image', 'build', 'busybox', '--name', 'bbx', ...dd], env);
    assert.equal(rebuilt.code, 0, rebuilt.stderr);
    assert.doesNotMatch(rebuilt.stderr, /up to date/, 'the build trusted the snapshot');
    const fresh = await Sandbox.create({ ...server.conn, image: 'bbx' });
    try {
      const motd = await fresh.commands.run('cat /etc/motd 2>/dev/null; true');
      assert.doesNotMatch(motd.stdout, /tampered/);
    } finally {
      await fresh.kill();
    }
  });

  test('kill --label k=v kills every sandbox with the label and prints their ids', async () => {
    const a = await Sandbox.create({ ...server.conn, labels: { via: 'cli-bulk' } });
    const b = await Sandbox.create({ ...server.conn, labels: { via: 'cli-bulk' } });
    const r = await runCli(['kill', '--label', 'via=cli-bulk'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(r.stdout.trim().split('\n').sort(), [a.id, b.id].sort());
    assert.deepEqual(await Sandbox.list({ ...server.conn, labels: { via: 'cli-bulk' } }), []);
    assert.equal((await sb.refresh()).status, 'running');
    const none = await runCli(['kill'], env);
    assert.equal(none.code, 1);
    assert.match(none.stderr, /give sandbox ids or --label/);
  });

  test('image gc says why it kept what it kept', async () => {
    const r = await runCli(['image', 'gc'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^removed \d+ layers \(.+\); kept \d+: \d+ in use by an image or a live sandbox/);
  });

  test('log ID after kill still prints the trajectory', async () => {
    const victim = await Sandbox.create(server.conn);
    await victim.commands.run('echo logged');
    await victim.kill();
    const r = await runCli(['log', victim.id, '--json'], env);
    assert.equal(r.code, 0, r.stderr);
    const entries = JSON.parse(r.stdout) as { kind: string; request: { cmd?: string } }[];
    assert.deepEqual(
      entries.map((e) => e.request.cmd),
      ['echo logged'],
    );
  });

  test("log --label k=v writes every matching sandbox's steps as NDJSON to stdout, killed ones included; log --batch ID too", async () => {
    const a = await Sandbox.create({ ...server.conn, labels: { via: 'cli-log' } });
    const b = await Sandbox.create({ ...server.conn, labels: { via: 'cli-log' } });
    await a.commands.run('echo a1');
    await a.commands.run('echo a2');
    await b.commands.run('echo b1');
    await b.kill();
    const r = await runCli(['log', '--label', 'via=cli-log'], env);
    assert.equal(r.code, 0, r.stderr);
    assert.ok(r.stdout.endsWith('\n'), 'whole lines');
    const lines = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { sandboxId: string; seq: number; kind: string; request: { cmd?: string } });
    const want = [
      { sandboxId: a.id, seq: 1, cmd: 'echo a1' },
      { sandboxId: a.id, seq: 2, cmd: 'echo a2' },
      { sandboxId: b.id, seq: 1, cmd: 'echo b1' },
    ].sort((x, y) => (x.sandboxId < y.sandboxId ? -1 : x.sandboxId > y.sandboxId ? 1 : x.seq - y.seq));
    assert.deepEqual(
      lines.map((l) => ({ sandboxId: l.sandboxId, seq: l.seq, cmd: l.request.cmd })),
      want,
    );
    const none = await runCli(['log', '--label', 'via=cli-log', '--label', 'other=x'], env);
    assert.equal(none.code, 0, none.stderr);
    assert.equal(none.stdout, '', 'no sandbox matches: no line');
    await a.kill();

    const batch = await runCli(['run', 'busybox', '--count', '2', '-m', '32', '-l', 'via=cli-log-batch'], env);
    assert.equal(batch.code, 0, batch.stderr);
    const ids = batch.stdout.trim().split('\n');
    const batchId = /batch (batch-[0-9a-f]+)/.exec(batch.stderr)?.[1];
    assert.ok(batchId, batch.stderr);
    for (const id of ids) await (await Sandbox.connect(id, server.conn)).commands.run('true');
    const byBatch = await runCli(['log', '--batch', batchId], env);
    assert.equal(byBatch.code, 0, byBatch.stderr);
    assert.deepEqual(
      byBatch.stdout
        .trim()
        .split('\n')
        .map((l) => (JSON.parse(l) as { sandboxId: string }).sandboxId),
      [...ids].sort(),
    );
    for (const id of ids) await Sandbox.kill(id, server.conn);

    const neither = await runCli(['log'], env);
    assert.equal(neither.code, 1);
    assert.match(neither.stderr, /give a sandbox id, or --label/);
    assertNoStack(neither);
    const both = await runCli(['log', a.id, '--label', 'via=cli-log'], env);
    assert.equal(both.code, 1);
    assert.match(both.stderr, /not both/);
    const unknown = await runCli(['log', '--batch', 'batch-nosuch0'], env);
    assert.equal(unknown.code, 1);
    assert.match(unknown.stderr, /BATCH_NOT_FOUND/);
    assertNoStack(unknown);
  });

  test("log --lineage ID prints a fork's steps after its parent's, with the sandbox of each", async () => {
    const parent = await Sandbox.create(server.conn);
    try {
      await parent.commands.run('echo before-the-fork');
      const { sandboxes } = await parent.fork(1);
      const child = sandboxes[0]!;
      try {
        await child.commands.run('echo in-the-fork');
        const r = await runCli(['log', child.id, '--lineage', '--json'], env);
        assert.equal(r.code, 0, r.stderr);
        const entries = JSON.parse(r.stdout) as { sandboxId: string; request: { cmd?: string } }[];
        assert.deepEqual(
          entries.map((e) => [e.sandboxId, e.request.cmd]),
          [
            [parent.id, 'echo before-the-fork'],
            [child.id, 'echo in-the-fork'],
          ],
        );
        const table = await runCli(['log', child.id, '--lineage'], env);
        assert.equal(table.code, 0, table.stderr);
        assert.match(table.stdout, /^\s*SANDBOX\s+SEQ/);
      } finally {
        await child.kill();
      }
    } finally {
      await parent.kill();
    }
  });
});
