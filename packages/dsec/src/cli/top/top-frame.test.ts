import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { NodeInfo } from '@dsec/sdk/schema';
import { parsePromText } from './prom-text.js';
import { renderTopFrame, type TopSample } from './top-frame.js';

const GiB = 1 << 30;

/** The fields of a node a frame reads. */
function node(id: string, state: string, sandboxes: number): NodeInfo {
  return {
    id,
    pool: 'default',
    state,
    sandboxes,
    maxSandboxes: 4000,
    utilisation: 0.25,
    capacity: { cpus: 8, cpuCommitted: 3, cpuUsage: 0.5, memoryBytes: 16 * GiB, memoryAvailableBytes: 12 * GiB },
    layerCache: { entries: 2, bytes: 1 << 20 },
  } as unknown as NodeInfo;
}

function sample(at: number, metrics: string, nodes: NodeInfo[]): TopSample {
  return { at, metrics: parsePromText(metrics), nodes };
}

const now = new Date('2026-11-30T12:00:00Z');

test('top frame: right after a batch the moment shows 0/s and the last minute what the batch did', () => {
  // 600 creates in the last minute (a batch that ended before the two samples), none between them.
  const text = (creates: number) =>
    [
      `dsec_sandbox_creates_total{backend="container"} ${creates}`,
      'dsec_sandboxes{state="running",pool="default",edge="a"} 600',
      'dsec_events_last_minute{event="create"} 600',
      'dsec_events_last_minute{event="create_error"} 6',
      'dsec_events_last_minute{event="kill"} 0',
      'dsec_events_last_minute{event="exec"} 1200',
      'dsec_batches_running 0',
    ].join('\n');
  const frame = renderTopFrame(sample(0, text(600), [node('a', 'ready', 600)]), sample(2000, text(600), [node('a', 'ready', 600)]), {
    url: 'http://x',
    now,
  });
  assert.match(frame, /^creates 0\.0\/s \(errors 0\.0\/s\) · kills 0\.0\/s · execs 0\.0\/s · batches running 0$/m);
  assert.match(frame, /^last minute: creates 10\.0\/s \(errors 0\.1\/s\) · kills 0\.0\/s · execs 20\.0\/s$/m);
  assert.match(frame, /^sandboxes 600: 600 running/m);
});

test('top frame: rates between two samples; a server without the last-minute count gets no such line', () => {
  const frame = renderTopFrame(
    sample(0, 'dsec_sandbox_creates_total{backend="container"} 10', []),
    sample(1000, 'dsec_sandbox_creates_total{backend="container"} 12', []),
    { url: 'http://x', now },
  );
  assert.match(frame, /^creates 2\.0\/s/m);
  assert.doesNotMatch(frame, /last minute/);
  assert.match(renderTopFrame(undefined, sample(0, '', []), { url: 'http://x', now }), /^creates –/m, 'one sample: no rate');
});

test('top frame: a lost edge shows as lost with no figures from its last heartbeat', () => {
  const frame = renderTopFrame(undefined, sample(0, '', [node('a', 'ready', 5), node('b', 'lost', 7)]), { url: 'http://x', now });
  assert.match(frame, /^edges 2: 1 ready, 1 not \(b lost\)$/m);
  const row = (id: string) => frame.split('\n').find((l) => l.startsWith(`${id} `)) ?? '';
  assert.match(row('a'), /^a\s+default\s+ready\s+5\/4000\s+50%\s+3\/8\s+4\.0 GiB\/16\.0 GiB\s+25%\s+2 layers, 1\.0 MiB$/);
  assert.match(row('b'), /^b\s+default\s+lost(\s+–){6}$/);
  assert.doesNotMatch(row('b'), /\d/, 'nothing stale: no number at all');
});
