import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { percentile, round, summarize } from './stats.js';

describe('percentile (nearest rank)', () => {
  const ten = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5];

  test('p50 of 1..10 is 5, p90 is 9, p100 is 10', () => {
    assert.equal(percentile(ten, 50), 5);
    assert.equal(percentile(ten, 90), 9);
    assert.equal(percentile(ten, 100), 10);
  });

  test('p0 is the minimum', () => {
    assert.equal(percentile(ten, 0), 1);
  });

  test('p99 of 100 values is the 99th smallest', () => {
    const values = Array.from({ length: 100 }, (_, i) => 100 - i);
    assert.equal(percentile(values, 99), 99);
  });

  test('one value is every percentile', () => {
    assert.equal(percentile([42], 1), 42);
    assert.equal(percentile([42], 99), 42);
  });

  test('an empty list gives NaN', () => {
    assert.ok(Number.isNaN(percentile([], 50)));
  });

  test('does not reorder its input', () => {
    const input = [3, 1, 2];
    percentile(input, 50);
    assert.deepEqual(input, [3, 1, 2]);
  });

  test('sorts numerically, not as strings', () => {
    assert.equal(percentile([100, 9, 20], 100), 100);
    assert.equal(percentile([100, 9, 20], 1), 9);
  });
});

describe('round', () => {
  test('rounds to one digit by default', () => {
    assert.equal(round(1.26), 1.3);
  });
  test('rounds to the given digits', () => {
    assert.equal(round(3.14159, 3), 3.142);
    assert.equal(round(2.5, 0), 3);
  });
});

describe('summarize', () => {
  test('count, p50, p99, min and max, rounded to 0.1', () => {
    const s = summarize([1.04, 2.06, 3.01, 4, 100.44]);
    assert.deepEqual(s, { count: 5, p50: 3, p99: 100.4, min: 1, max: 100.4 });
  });

  test('does not reorder its input', () => {
    const input = [5, 4, 3];
    summarize(input);
    assert.deepEqual(input, [5, 4, 3]);
  });
});
