import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { CappedOutput } from './capped-output.js';

describe('CappedOutput', () => {
  test('keeps up to its cap, counts everything, and reads from any offset across chunk boundaries', () => {
    const out = new CappedOutput(10);
    assert.equal(out.push(Buffer.from('abcd')).toString(), 'abcd');
    assert.equal(out.push(Buffer.from('efg')).toString(), 'efg');
    assert.equal(out.push(Buffer.from('hijkl')).toString(), 'hij');
    assert.equal(out.push(Buffer.from('mn')).length, 0);
    assert.equal(out.total, 14);
    assert.equal(out.truncated, true);
    assert.equal(out.bytes().toString(), 'abcdefghij');
    for (let i = 0; i <= 12; i++) assert.equal(out.since(i).toString(), 'abcdefghij'.slice(i), `since(${i})`);
    assert.equal(out.encode('base64'), Buffer.from('abcdefghij').toString('base64'));
  });

  test('nothing kept reads as empty', () => {
    const out = new CappedOutput(0);
    out.push(Buffer.from('x'));
    assert.equal(out.bytes().length, 0);
    assert.equal(out.since(5).length, 0);
  });
});
