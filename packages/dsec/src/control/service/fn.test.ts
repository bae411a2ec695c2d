import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { FnRunResult } from '@dsec/sdk/schema';
import pino from 'pino';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import { OutputBudget } from '../../output-budget.js';
import { FnService } from './fn.js';

const settle = (): Promise<void> => new Promise((r) => setImmediate(r));

describe('FnService.batch', () => {
  test('a reader that stops reading stops the calls: results waiting count against the concurrency', async () => {
    const svc = new FnService({
      edges: {} as EdgeRegistry,
      compose: async () => ({ imageId: 'img', layers: [], config: {} as never }),
      metrics: { fnCall: () => {} },
      log: pino({ level: 'silent' }),
      outputBudget: new OutputBudget(1 << 30, { whole: 'w', owner: 'o', otherwise: 'x' }),
    });
    let started = 0;
    let held = 0;
    svc.run = async (_call, opts) => {
      started++;
      held++;
      let once = false;
      opts?.hold?.(() => {
        if (!once) held--;
        once = true;
      });
      return { exitCode: 0 } as FnRunResult;
    };
    const calls = Array.from({ length: 50 }, () => ({ runtime: 'bash' as const, code: 'true' }));
    const lines = svc.batch({ calls, concurrency: 4 });
    const got = [await lines.next(), await lines.next()];
    assert.deepEqual(
      got.map((g) => g.done),
      [false, false],
    );
    for (let i = 0; i < 20; i++) await settle(); // every call that could start has
    assert.ok(started <= 2 + 4 + 1, `${started} of 50 calls started for a reader that took 2 lines (concurrency 4)`);
    assert.equal(held, started - 1, 'each result keeps its reservation until the reader takes the line after it');
    let rest = 0;
    for await (const _ of lines) rest++;
    assert.equal(rest, 48);
    assert.equal(started, 50);
    assert.equal(held, 0, 'all given back once read');
  });
});
