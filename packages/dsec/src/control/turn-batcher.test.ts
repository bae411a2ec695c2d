import assert from 'node:assert/strict';
import { test } from 'node:test';
import { TurnBatcher } from './turn-batcher.js';

const turn = (): Promise<void> => new Promise((r) => setImmediate(r));

test('items added in one turn go as one batch per key; a lone item goes by itself', async () => {
  const batches: string[][] = [];
  const b = new TurnBatcher<string, string>(async (key, items) => {
    batches.push([key, ...items]);
    return items.map((i) => i.toUpperCase());
  });
  const same = await Promise.all([b.add('e1', 'a'), b.add('e1', 'b'), b.add('e2', 'c')]);
  assert.deepEqual(same, ['A', 'B', 'C']);
  assert.deepEqual(batches, [
    ['e1', 'a', 'b'],
    ['e2', 'c'],
  ]);
  assert.equal(await b.add('e1', 'lone'), 'LONE');
  assert.deepEqual(batches.at(-1), ['e1', 'lone']);
});

test('an Error answers its own item; a thrown error answers the whole batch; maxBatch splits', async () => {
  const sizes: number[] = [];
  const b = new TurnBatcher<number, number>(
    async (_, items) => {
      sizes.push(items.length);
      if (items.includes(13)) throw new Error('unlucky batch');
      return items.map((i) => (i % 2 ? new Error(`odd ${i}`) : i * 10));
    },
    { maxBatch: 2 },
  );
  const out = await Promise.allSettled([b.add('k', 2), b.add('k', 3), b.add('k', 4), b.add('k', 13)]);
  assert.deepEqual(sizes, [2, 2]);
  assert.deepEqual(
    out.map((o) => (o.status === 'fulfilled' ? o.value : (o.reason as Error).message)),
    [20, 'odd 3', 'unlucky batch', 'unlucky batch'],
  );
});

test('with maxInflight, what arrives while batches are out waits and goes together when one answers', async () => {
  const sizes: number[] = [];
  const gates: (() => void)[] = [];
  const b = new TurnBatcher<number, number>(
    async (_, items) => {
      sizes.push(items.length);
      await new Promise<void>((r) => gates.push(r));
      return items;
    },
    { maxInflight: 1 },
  );
  const first = b.add('k', 1);
  await turn();
  assert.deepEqual(sizes, [1], 'an idle key sends at once');
  const later = [b.add('k', 2), b.add('k', 3)];
  await turn();
  const more = b.add('k', 4);
  await turn();
  assert.deepEqual(sizes, [1], 'nothing more goes while the first batch is out');
  gates.shift()!();
  assert.equal(await first, 1);
  await turn();
  assert.deepEqual(sizes, [1, 3], 'the three that waited go as one batch');
  gates.shift()!();
  assert.deepEqual(await Promise.all([...later, more]), [2, 3, 4]);
});

test('an item settled early is answered at once; what run says of it later is not heard', async () => {
  let finish!: () => void;
  const held = new Promise<void>((r) => (finish = r));
  const b = new TurnBatcher<string, string>(async (_, items, { settle }) => {
    settle(1, 'B early');
    settle(1, 'B twice'); // a second answer for an item is ignored
    await held;
    return items.map((i) => (i === 'b' ? new Error('too late for b') : i.toUpperCase()));
  });
  const a = b.add('k', 'a');
  let early: string | undefined;
  void b.add('k', 'b').then((v) => (early = v));
  for (let i = 0; i < 10 && early === undefined; i++) await turn();
  assert.equal(early, 'B early', 'answered while the batch is still out');
  finish();
  assert.equal(await a, 'A');
});

test('a batch that releases its place lets the next batch go while it is still out', async () => {
  const finish: (() => void)[] = [];
  const sent: string[][] = [];
  const b = new TurnBatcher<string, string>(
    async (_, items, { release }) => {
      sent.push(items);
      if (items.includes('a')) release();
      await new Promise<void>((r) => finish.push(r));
      return items;
    },
    { maxInflight: 1 },
  );
  const a = b.add('k', 'a');
  await turn();
  const c = b.add('k', 'c');
  for (let i = 0; i < 10 && sent.length < 2; i++) await turn();
  assert.deepEqual(sent, [['a'], ['c']], 'c went while a was still out');
  const d = b.add('k', 'd');
  for (let i = 0; i < 5; i++) await turn();
  assert.deepEqual(sent, [['a'], ['c']], 'c did not release: d waits for it');
  finish[1]!();
  assert.equal(await c, 'c');
  for (let i = 0; i < 10 && sent.length < 3; i++) await turn();
  assert.deepEqual(sent.at(-1), ['d']);
  for (const f of finish) f();
  assert.deepEqual(await Promise.all([a, d]), ['a', 'd']);
});

test('with turns, items of the turns between go in one batch; a lone item still goes without a timer', async () => {
  const batches: string[][] = [];
  const b = new TurnBatcher<string, string>(
    async (_, items) => {
      batches.push(items);
      return items;
    },
    { turns: 3 },
  );
  const first = b.add('k', 'a');
  await turn();
  const second = b.add('k', 'b');
  await turn();
  const third = b.add('k', 'c');
  assert.deepEqual(await Promise.all([first, second, third]), ['a', 'b', 'c']);
  assert.deepEqual(batches, [['a', 'b', 'c']], 'what came in the two turns after the first item joined its batch');
  assert.equal(await b.add('k', 'lone'), 'lone');
  assert.deepEqual(batches.at(-1), ['lone']);
});
