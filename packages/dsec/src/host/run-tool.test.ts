import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ToolError, runTool, runToolOrThrow, signalNumber } from './run-tool.js';

describe('runTool', () => {
  test('returns exit code, stdout and stderr', async () => {
    const r = await runTool('sh', ['-c', 'echo out; echo err >&2; exit 4']);
    assert.deepEqual(r, { code: 4, stdout: 'out\n', stderr: 'err\n' });
  });

  test('does not reject on a non-zero exit', async () => {
    assert.equal((await runTool('false', [])).code, 1);
  });

  test('a tool that does not exist gives code 127 with the reason in stderr', async () => {
    const r = await runTool('dsec-no-such-tool', []);
    assert.equal(r.code, 127);
    assert.match(r.stderr, /ENOENT/);
  });

  test('input is written to stdin', async () => {
    assert.equal((await runTool('cat', [], { input: 'piped' })).stdout, 'piped');
  });

  test('output past maxOutput is dropped', async () => {
    const r = await runTool('sh', ['-c', 'head -c 10000 /dev/zero | tr "\\0" x'], { maxOutput: 100 });
    assert.equal(r.stdout.length, 100);
  });

  test('a tool killed by a signal reports 128 + the signal number', async () => {
    assert.equal((await runTool('sh', ['-c', 'kill -TERM $$'])).code, 143);
  });

  test('env and cwd are passed', async () => {
    const r = await runTool('sh', ['-c', 'echo "$X"; pwd'], { env: { X: 'y', PATH: process.env['PATH'] }, cwd: '/' });
    assert.equal(r.stdout, 'y\n/\n');
  });
});

describe('runToolOrThrow', () => {
  test('resolves on exit 0', async () => {
    assert.equal((await runToolOrThrow('echo', ['ok'])).stdout, 'ok\n');
  });

  test('throws ToolError carrying the result and stderr in the message', async () => {
    await assert.rejects(runToolOrThrow('sh', ['-c', 'echo bad thing >&2; exit 2']), (err: unknown) => {
      assert.ok(err instanceof ToolError);
      assert.equal(err.tool, 'sh');
      assert.equal(err.result.code, 2);
      assert.match(err.message, /exited 2: bad thing/);
      return true;
    });
  });
});

describe('signalNumber', () => {
  test('maps every signal Node knows; null gives 0', () => {
    assert.equal(signalNumber('SIGKILL'), 9);
    assert.equal(signalNumber('SIGTERM'), 15);
    assert.equal(signalNumber('SIGUSR1'), 10);
    assert.equal(signalNumber('SIGALRM'), 14);
    assert.equal(signalNumber(null), 0);
  });

  test('a tool killed by a signal outside the common few exits 128 + its number, not 128', async () => {
    const r = await runTool('sh', ['-c', 'kill -USR1 $$']);
    assert.equal(r.code, 138);
  });
});
