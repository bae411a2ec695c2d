import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ApiError } from '../../../api-error.js';
import { sandboxPath } from '../shared/sandbox-path.js';

const invalid = (err: unknown): boolean => err instanceof ApiError && err.code === 'INVALID_REQUEST';

describe('sandboxPath', () => {
  test('an absolute path is kept as is', () => {
    assert.equal(sandboxPath('/etc/passwd', '/work'), '/etc/passwd');
  });

  test('a relative path is taken from the cwd', () => {
    assert.equal(sandboxPath('out.txt', '/work'), '/work/out.txt');
    assert.equal(sandboxPath('a/b', '/work/'), '/work/a/b');
  });

  test('a relative path with cwd / gives a single leading slash', () => {
    assert.equal(sandboxPath('tmp/x', '/'), '/tmp/x');
  });

  test('dot-dot components are left for the kernel to resolve inside the root', () => {
    assert.equal(sandboxPath('../../etc/passwd', '/work'), '/work/../../etc/passwd');
  });

  test('a NUL byte is rejected with INVALID_REQUEST', () => {
    assert.throws(() => sandboxPath('/etc/passwd\0x', '/'), invalid);
  });

  test('/proc, /sys and /dev paths are rejected with INVALID_REQUEST', () => {
    for (const p of ['/proc', '/proc/1/environ', '/sys/kernel', '/dev/zero', '/dev']) {
      assert.throws(() => sandboxPath(p, '/'), invalid, p);
    }
  });

  test('repeated slashes do not get around the /proc check', () => {
    assert.throws(() => sandboxPath('//proc//1/environ', '/'), invalid);
  });

  test('a relative path that lands in /proc is rejected', () => {
    assert.throws(() => sandboxPath('proc/self/environ', '/'), invalid);
    assert.throws(() => sandboxPath('self/environ', '/proc'), invalid);
  });

  test('names that only start like /proc (e.g. /process, /devices) are allowed', () => {
    assert.equal(sandboxPath('/process/x', '/'), '/process/x');
    assert.equal(sandboxPath('/devices', '/'), '/devices');
    assert.equal(sandboxPath('/system', '/'), '/system');
  });

  test('a dot or dot-dot path that lands in /proc, /sys or /dev is rejected like the direct path', () => {
    for (const p of ['/tmp/../proc/1/environ', '/./proc/self/status', '/tmp/../dev/planted', 'x/../sys/kernel']) {
      assert.throws(() => sandboxPath(p, '/'), invalid, p);
    }
  });
});
