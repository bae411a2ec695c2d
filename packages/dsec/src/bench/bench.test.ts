 
/** Unit tests of the benchmark's pure parts: rounds, memory arithmetic, targets, tables, chart. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { renderChart } from './chart-svg.js';
import { mdTable, ratio } from './markdown.js';
import { memUsed, readMeminfo } from './meminfo.js';
import { parsePeers } from './peers/peer.js';
import { fileStamp } from './report.js';
import { batchSizes, pool, roundOrder } from './rounds.js';
import { check, ratioCheck } from './targets.js';

describe('bench rounds', () => {
  test('round order rotates so no peer always goes first', () => {
    assert.deepEqual(roundOrder(['a', 'b'], 0), ['a', 'b']);
    assert.deepEqual(roundOrder(['a', 'b'], 1), ['b', 'a']);
    assert.deepEqual(roundOrder(['a', 'b', 'c'], 4), ['b', 'c', 'a']);
  });

  test('batch sizes add up and differ by at most one', () => {
    assert.deepEqual(batchSizes(200, 8), Array(8).fill(25));
    assert.deepEqual(batchSizes(10, 3), [4, 3, 3]);
    assert.deepEqual(batchSizes(2, 5), [1, 1]);
  });

  test('pool keeps at most N in flight and runs every task', async () => {
    let inFlight = 0;
    let peak = 0;
    const seen: number[] = [];
    await pool(20, 3, async (i) => {
      inFlight++;
      peak = Math.max(peak, inFlight);
      await new Promise((r) => setTimeout(r, 1));
      seen.push(i);
      inFlight--;
    });
    assert.equal(peak, 3);
    assert.deepEqual(
      seen.sort((a, b) => a - b),
      [...Array(20).keys()],
    );
  });
});

describe('bench memory', () => {
  test('meminfo fields are read in KiB and differences go the right way', () => {
    const a = readMeminfo(
      'MemTotal: 100 kB\nMemFree: 50 kB\nMemAvailable: 80 kB\nSlab: 10 kB\nSUnreclaim: 4 kB\nKernelStack: 1 kB\nPageTables: 2 kB\n',
    );
    const b = readMeminfo('MemFree: 40 kB\nMemAvailable: 70 kB\nSlab: 13 kB\nSUnreclaim: 5 kB\nKernelStack: 2 kB\nPageTables: 2 kB\n');
    assert.deepEqual(memUsed(a, b), {
      memAvailableKiB: 10,
      memFreeKiB: 10,
      slabKiB: 3,
      sUnreclaimKiB: 1,
      kernelStackKiB: 1,
      pageTablesKiB: 0,
    });
  });
});

describe('bench targets', () => {
  test('a ratio target is judged against the budget it allows', () => {
    const met = ratioCheck('p50 ≤ 1.2× crun', 24, 21, 1.2, 'crun');
    assert.equal(met.ok, true);
    const missed = ratioCheck('p50 ≤ 1.2× crun', 30, 20, 1.2, 'crun');
    assert.equal(missed.ok, false);
    assert.match(missed.note, /missed by 6 ms \(25% over/);
  });

  test('an at-least target and a missing value', () => {
    assert.equal(check('≥ 30/s', 31, 30, '/s', { atLeast: true }).ok, true);
    assert.equal(check('≥ 30/s', 20, 30, '/s', { atLeast: true }).ok, false);
    assert.equal(check('x', NaN, 30, '/s').ok, undefined);
  });
});

describe('bench output', () => {
  test('peers always include crun and reject unknown names', () => {
    assert.deepEqual(parsePeers('podman,docker'), ['crun', 'podman', 'docker']);
    assert.deepEqual(parsePeers('crun'), ['crun']);
    assert.throws(() => parsePeers('lxc'), /unknown peer/);
  });

  test('markdown tables align numbers right and text left', () => {
    const t = mdTable(
      ['metric', 'dsec', 'ratio'],
      [
        ['p50', 20.5, ratio(20.5, 10)],
        ['p99', NaN, ratio(1, NaN)],
      ],
    );
    assert.equal(t.split('\n')[1], '| :--- | ---: | ---: |');
    assert.match(t, /\| p50 \| 20.5 \| 2.05× \|/);
    assert.match(t, /\| p99 \| n\/a \| n\/a \|/);
  });

  test('file stamps are compact UTC', () => {
    assert.equal(fileStamp('2025-01-31T12:34:56.789Z'), '20250131T123456Z');
  });

  test('the chart is one self-contained SVG with escaped text', () => {
    const svg = renderChart('a <b>', 'sub', [
      {
        title: 'p50',
        unit: 'ms',
        better: 'lower',
        bars: [
          { label: 'dsec', value: 30 },
          { label: 'crun', value: NaN },
        ],
        target: { value: 25, label: 't' },
      },
    ]);
    assert.match(svg, /^<svg xmlns="http:\/\/www.w3.org\/2000\/svg"/);
    assert.match(svg, /a &lt;b&gt;/);
    assert.match(svg, />n\/a</);
    assert.doesNotMatch(svg, /<script|href=/);
  });
});
