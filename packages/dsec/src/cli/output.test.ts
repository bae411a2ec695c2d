import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { collectKv, collectList, humanBytes } from './output.js';

describe('collectKv', () => {
  test('collects repeated KEY=VALUE flags into a map', () => {
    assert.deepEqual(collectKv('b=2', collectKv('a=1')), { a: '1', b: '2' });
  });

  test('the value may contain "=" and be empty', () => {
    assert.deepEqual(collectKv('opts=a=b'), { opts: 'a=b' });
    assert.deepEqual(collectKv('empty='), { empty: '' });
  });

  test('a later flag with the same key wins', () => {
    assert.deepEqual(collectKv('a=2', { a: '1' }), { a: '2' });
  });

  test('a flag without KEY= is an error', () => {
    assert.throws(() => collectKv('novalue'), /expected KEY=VALUE/);
    assert.throws(() => collectKv('=value'), /expected KEY=VALUE/);
  });
});

describe('collectList', () => {
  test('appends in order', () => {
    assert.deepEqual(collectList('b', collectList('a')), ['a', 'b']);
  });
});

describe('humanBytes', () => {
  test('bytes, KiB, MiB and GiB', () => {
    assert.equal(humanBytes(0), '0 B');
    assert.equal(humanBytes(1023), '1023 B');
    assert.equal(humanBytes(1024), '1.0 KiB');
    assert.equal(humanBytes(5 * 1024 * 1024 + 512 * 1024), '5.5 MiB');
    assert.equal(humanBytes(3 * 1024 ** 3), '3.0 GiB');
  });

  test('stays in GiB above that', () => {
    assert.equal(humanBytes(2048 * 1024 ** 3), '2048.0 GiB');
  });
});
