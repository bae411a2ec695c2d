import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { readNdjson } from './ndjson.js';

function streamOf(chunks: (string | Uint8Array)[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(typeof c === 'string' ? new TextEncoder().encode(c) : c);
      controller.close();
    },
  });
}

async function collect<T>(chunks: (string | Uint8Array)[]): Promise<T[]> {
  const out: T[] = [];
  for await (const v of readNdjson<T>(streamOf(chunks))) out.push(v);
  return out;
}

describe('readNdjson', () => {
  test('yields one object per line', async () => {
    assert.deepEqual(await collect(['{"a":1}\n{"a":2}\n']), [{ a: 1 }, { a: 2 }]);
  });

  test('joins a line split across chunks', async () => {
    assert.deepEqual(await collect(['{"type":"std', 'out","n":', '1}\n']), [{ type: 'stdout', n: 1 }]);
  });

  test('a last line without a newline is still yielded', async () => {
    assert.deepEqual(await collect(['{"a":1}\n{"a":2}']), [{ a: 1 }, { a: 2 }]);
  });

  test('blank lines are skipped', async () => {
    assert.deepEqual(await collect(['\n{"a":1}\n\n  \n{"a":2}\n']), [{ a: 1 }, { a: 2 }]);
  });

  test('a multi-byte UTF-8 character split between chunks is decoded intact', async () => {
    const bytes = new TextEncoder().encode('{"s":"✓"}\n');
    const cut = bytes.indexOf(0xe2) + 1;
    assert.deepEqual(await collect([bytes.slice(0, cut), bytes.slice(cut)]), [{ s: '✓' }]);
  });

  test('an empty body yields nothing', async () => {
    assert.deepEqual(await collect([]), []);
  });
});
