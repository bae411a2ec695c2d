 
/** The dsec CLI, run as a separate process against a real server. */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';

const CLI = fileURLToPath(new URL('../src/cli/main.js', import.meta.url));

interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs the CLI with only the given env (plus PATH), so no developer config leaks in. A CLI still
 * running after `guardMs` is killed (it would otherwise hang the suite), which fails its test.
 */
function runCli(args: string[], env: Record<string, string>, guardMs = 60_000): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { PATH: process.env['PATH'] ?? '/usr/sbin:/usr/bin:/sbin:/bin', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const guard = setTimeout(() => child.kill('SIGKILL'), guardMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(guard);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('cli', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
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
    assert.ok(list.some((s) => s.id === sb.id && s.status === 'running'), r.stdout);
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
      assert.match(bad.stderr, /none, allow or open/);
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
    assert.ok(checks.every((c) => c.ok || !c.required), r.stdout);
    assert.ok(checks.some((c) => c.name === 'running as root' && c.ok));
  });

  test('image ls --json lists the busybox image of the data dir', async () => {
    const r = await runCli(['image', 'ls', '--json', '--data-dir', server.dataDir], env);
    assert.equal(r.code, 0, r.stderr);
    const images = JSON.parse(r.stdout) as { names: string[] }[];
    assert.ok(images.some((i) => i.names.includes('busybox:latest')), r.stdout);
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
});
