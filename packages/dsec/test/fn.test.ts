/**
 * Function calls against a real dsec: the fn-runtime image (this host's python3, bash, node), warm
 * workers with their fork servers in real crun sandboxes, POST /v1/fn/run and the NDJSON batch
 * through the SDK's fn.run / fn.map, limits and bad input.
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { fn } from '@dsec/sdk';
import { buildFnRuntimeImage } from '../src/image/builders/fn-runtime.js';
import { integrationSkipReason, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';

const skip =
  integrationSkipReason() ??
  (existsSync('/usr/bin/python3') ? undefined : 'fn calls need /usr/bin/python3 on the host (the fn-runtime image copies it)');
if (skip) console.log(`# fn tests skipped: ${skip}`);

describe('function calls', { skip, timeout: 300_000 }, () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
    await buildFnRuntimeImage(server.dsec.images);
  });
  after(async () => server?.close());

  test('python: code, args, stdin, files and env in; stdout, stderr and the exit code out', async () => {
    const r = await fn.run(
      {
        runtime: 'python',
        code: [
          'import sys, os, json',
          'data = json.load(open("cases/in.json"))',
          'print(sum(data), sys.argv[1:], sys.stdin.read().strip(), os.environ["MODE"], os.getcwd())',
          'print("warn", file=sys.stderr)',
          'sys.exit(3)',
        ].join('\n'),
        args: ['a', 'b'],
        stdin: 'from stdin\n',
        files: { 'cases/in.json': '[1, 2, 39]' },
        env: { MODE: 'grading' },
      },
      server.conn,
    );
    assert.equal(r.exitCode, 3, r.stderr);
    assert.equal(r.stdout, "42 ['a', 'b'] from stdin grading /tmp/call\n");
    assert.equal(r.stderr, 'warn\n');
    assert.equal(r.timedOut, false);
    assert.equal(r.workerReplaced, false, r.replacedBecause);
  });

  test('a warm worker serves the next call of its kind (no cold start); an exception is exit 1 with the traceback', async () => {
    const a = await fn.run({ runtime: 'python', code: 'print("one")' }, server.conn);
    const b = await fn.run({ runtime: 'python', code: 'raise ValueError("bad candidate")' }, server.conn);
    assert.equal(a.stdout, 'one\n');
    assert.equal(b.worker, a.worker, 'the same warm worker');
    assert.equal(b.coldStart, false);
    assert.equal(b.exitCode, 1);
    // As `python3 main.py` prints it: from the user's own frame, no runner frame (<string>, run_user).
    assert.match(b.stderr, /^Traceback \(most recent call last\):\n {2}File "[^"]*main\.py", line 1, in <module>\n/);
    assert.match(b.stderr, /ValueError: bad candidate\n$/);
    assert.doesNotMatch(b.stderr, /<string>|run_user|zygote/);
    const nested = await fn.run({ runtime: 'python', code: 'def f():\n    1/0\nf()' }, server.conn);
    assert.equal((nested.stderr.match(/ {2}File /g) ?? []).length, 2, nested.stderr);
    const syntax = await fn.run({ runtime: 'python', code: 'def (' }, server.conn);
    assert.match(syntax.stderr, /SyntaxError/);
    assert.doesNotMatch(syntax.stderr, /<string>|run_user/);
  });

  test('bash and node run as fresh interpreter processes', async () => {
    const sh = await fn.run(
      { runtime: 'bash', code: 'echo "$BASH_VERSION" | cut -d. -f1; echo "$1-$2"; cat', args: ['x', 'y'], stdin: 'in' },
      server.conn,
    );
    assert.equal(sh.exitCode, 0, sh.stderr);
    assert.match(sh.stdout, /^\d+\nx-y\nin$/);
    if (!existsSync('/usr/bin/node')) return;
    const js = await fn.run(
      {
        runtime: 'node',
        code: 'console.log(process.argv.slice(2).join(","), require("fs").readFileSync(0, "utf8"))',
        args: ['p', 'q'],
        stdin: 'z',
      },
      server.conn,
    );
    assert.equal(js.exitCode, 0, js.stderr);
    assert.equal(js.stdout, 'p,q z\n');
  });

  test('timeouts kill the call (137, timedOut) and output past the cap is counted, not kept', async () => {
    const slow = await fn.run(
      { runtime: 'python', code: 'import time\nprint("started", flush=True)\ntime.sleep(60)', timeoutMs: 300 },
      server.conn,
    );
    assert.equal(slow.exitCode, 137);
    assert.equal(slow.timedOut, true);
    assert.equal(slow.stdout, 'started\n');
    const big = await fn.run({ runtime: 'python', code: 'import sys\nsys.stdout.write("x" * 100000)', maxOutputBytes: 1000 }, server.conn);
    assert.equal(big.stdout.length, 1000);
    assert.equal(big.stdoutBytes, 100000);
    assert.equal(big.truncated, true);
    const bin = await fn.run(
      { runtime: 'python', code: 'import sys\nsys.stdout.buffer.write(bytes([0, 255, 1]))', encoding: 'base64' },
      server.conn,
    );
    assert.deepEqual([...Buffer.from(bin.stdout, 'base64')], [0, 255, 1]);
  });

  test('fn.map runs a batch over the NDJSON stream and returns results in call order', async () => {
    const calls = Array.from({ length: 12 }, (_, i) => ({
      runtime: 'python' as const,
      code: `import time, random\ntime.sleep(random.random() / 50)\nprint(${i} * ${i})`,
    }));
    const results = await fn.map(calls, { ...server.conn, concurrency: 4 });
    assert.deepEqual(
      results.map((r) => r.stdout),
      calls.map((_, i) => `${i * i}\n`),
    );
    const seen: number[] = [];
    for await (const o of fn.mapIter(calls.slice(0, 5), { ...server.conn, concurrency: 2 })) seen.push(o.index);
    assert.deepEqual(
      [...seen].sort((x, y) => x - y),
      [0, 1, 2, 3, 4],
    );
  });

  test("two projects' calls never share a worker", async () => {
    assert.equal((await call(server, 'POST', '/v1/projects', { json: { name: 'fn-other' } })).status, 201);
    const minted = await call(server, 'POST', '/v1/keys', { json: { project: 'fn-other', name: 'fn test' } });
    assert.equal(minted.status, 201, minted.text);
    const other = { url: server.url, apiKey: (minted.json as { key: string }).key };
    const code = 'print("hi")';
    const mine = await fn.run({ runtime: 'python', code, memoryMiB: 136 }, server.conn);
    const theirs = await fn.run({ runtime: 'python', code, memoryMiB: 136 }, other);
    const mineAgain = await fn.run({ runtime: 'python', code, memoryMiB: 136 }, server.conn);
    assert.equal(theirs.stdout, 'hi\n');
    assert.notEqual(theirs.worker, mine.worker, 'another project gets a worker of its own');
    assert.equal(mineAgain.worker, mine.worker, 'a project keeps reusing its own');
  });

  test('bad calls are 4xx with the registry code, before anything runs', async () => {
    expectWireError(await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'ruby', code: 'puts 1' } }), 400, 'INVALID_REQUEST');
    expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'python', code: '', files: { '../x': 'y' } } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'python', code: '', files: { '/etc/x': 'y' } } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'python', code: '', timeoutMs: 0 } }),
      400,
      'INVALID_REQUEST',
    );
    expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'python', code: '', args: ['a\u0000b'] } }),
      400,
      'INVALID_REQUEST',
    );
    const missing = expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'python', code: '', image: 'no-such' } }),
      404,
      'IMAGE_NOT_FOUND',
    );
    assert.match(missing.message, /no-such/);
    const batch = expectWireError(
      await call(server, 'POST', '/v1/fn/batch', {
        json: {
          calls: [
            { runtime: 'python', code: '' },
            { runtime: 'python', code: '', image: 'no-such' },
          ],
        },
      }),
      404,
      'IMAGE_NOT_FOUND',
    );
    assert.equal(batch.details['index'], 1);
    expectWireError(await call(server, 'POST', '/v1/fn/batch', { json: { calls: [] } }), 400, 'INVALID_REQUEST');
    // An image without python3 cannot host the fork server: a readable failure, no worker left behind.
    const nopy = expectWireError(
      await call(server, 'POST', '/v1/fn/run', { json: { runtime: 'bash', code: 'true', image: 'busybox' } }),
      500,
      'SANDBOX_CREATE_FAILED',
    );
    assert.match(nopy.message, /python3/);
  });
});
