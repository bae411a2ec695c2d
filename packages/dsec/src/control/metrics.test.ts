import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parsePromText } from '../cli/top/prom-text.js';
import { Metrics } from './metrics.js';

/** The value of an unlabelled metric in a scrape. */
async function scrapeValue(m: Metrics, name: string): Promise<number> {
  const s = parsePromText(await m.registry.metrics());
  const v = s.get(name);
  assert.ok(v !== undefined, `${name} is in the scrape`);
  return v;
}

test('dsec_event_loop_busy_seconds_total counts the time the event loop ran code, and only goes up', async () => {
  const m = new Metrics();
  const before = await scrapeValue(m, 'dsec_event_loop_busy_seconds_total');
  // Work in one callback: the loop is busy for all of it, however loaded the machine is.
  const t0 = performance.now();
  let x = 0;
  while (performance.now() - t0 < 120) x += Math.sqrt(x + 1);
  const spun = (performance.now() - t0) / 1000;
  await new Promise((r) => setImmediate(r)); // the spin's callback ends: its time is counted
  const after = await scrapeValue(m, 'dsec_event_loop_busy_seconds_total');
  assert.ok(after - before >= spun * 0.99, `counted ${after - before} s of a ${spun} s spin`);
  assert.ok((await scrapeValue(m, 'dsec_event_loop_busy_seconds_total')) >= after, 'a counter never goes down');
  assert.ok(x > 0);
});

test('without process metrics (two control planes in one process) there is no event-loop counter', async () => {
  const m = new Metrics({ processMetrics: false });
  const s = parsePromText(await m.registry.metrics());
  assert.equal(s.get('dsec_event_loop_busy_seconds_total'), undefined);
});
