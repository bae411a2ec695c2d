import type { NodeInfo } from '@dsec/sdk/schema';
import { humanBytes } from '../output.js';
import type { Scrape } from './prom-text.js';

/** What one look at the cluster gives: the control plane's /metrics and its edges (/v1/nodes). */
export interface TopSample {
  /** ms (monotonic): rates are differences between two samples. */
  at: number;
  metrics: Scrape;
  nodes: NodeInfo[];
}

const STATES = ['running', 'creating', 'paused', 'stopped', 'failed', 'lost'] as const;

/** Per second between two samples, of a counter summed over its series; undefined without an earlier one. */
function rate(prev: TopSample | undefined, cur: TopSample, name: string): number | undefined {
  if (!prev || cur.at <= prev.at) return undefined;
  const d = cur.metrics.sum(name) - prev.metrics.sum(name);
  // A restarted control plane starts its counters from zero: no rate for that interval.
  return d < 0 ? undefined : d / ((cur.at - prev.at) / 1000);
}

/**
 * Per second over the last minute, from the control plane's own count (dsec_events_last_minute):
 * what a look of a moment (--once) misses when the work ended just before it. Undefined from a
 * server that does not report it.
 */
function lastMinute(cur: TopSample, event: string): number | undefined {
  const n = cur.metrics.get('dsec_events_last_minute', { event });
  return n === undefined ? undefined : n / 60;
}

function perSecond(r: number | undefined): string {
  if (r === undefined) return '–';
  return `${r >= 100 ? Math.round(r) : r.toFixed(1)}/s`;
}

function pct(x: number | undefined): string {
  return x === undefined || Number.isNaN(x) ? '–' : `${Math.round(x * 100)}%`;
}

function pad(rows: string[][]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return rows.map((r) =>
    r
      .map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd(),
  );
}

/**
 * One frame of `dsec top`: the cluster's sandboxes by state, create and exec rates (between this
 * sample and the one before, and over the last minute as the control plane counted them), and a
 * row per edge with its sandboxes, CPU (busy share and committed limits) and memory (in use of
 * total), as the edge last reported them; a lost edge's row has its state and no figures.
 */
export function renderTopFrame(prev: TopSample | undefined, cur: TopSample, opts: { url: string; now?: Date } = { url: '' }): string {
  const m = cur.metrics;
  const byState = STATES.map((s) => `${m.sum('dsec_sandboxes', { state: s })} ${s}`).join(', ');
  const total = m.sum('dsec_sandboxes');
  const creates = rate(prev, cur, 'dsec_sandbox_creates_total');
  const errors = rate(prev, cur, 'dsec_sandbox_create_errors_total');
  const execs = rate(prev, cur, 'dsec_exec_duration_seconds_count');
  const kills = rate(prev, cur, 'dsec_sandbox_kills_total');
  const ready = cur.nodes.filter((n) => n.state === 'ready').length;
  const minute = lastMinute(cur, 'create');
  const batches = m.get('dsec_batches_running') ?? 0;
  const lines = [
    `dsec top · ${opts.url} · ${(opts.now ?? new Date()).toISOString().replace('T', ' ').slice(0, 19)} UTC`,
    `sandboxes ${total}: ${byState}`,
    `creates ${perSecond(creates)} (errors ${perSecond(errors)}) · kills ${perSecond(kills)} · execs ${perSecond(execs)} · batches running ${batches}`,
    ...(minute === undefined
      ? []
      : [
          `last minute: creates ${perSecond(minute)} (errors ${perSecond(lastMinute(cur, 'create_error'))}) · kills ${perSecond(lastMinute(cur, 'kill'))} · execs ${perSecond(lastMinute(cur, 'exec'))}`,
        ]),
    `edges ${cur.nodes.length}: ${ready} ready${
      cur.nodes.length > ready
        ? `, ${cur.nodes.length - ready} not (${cur.nodes
            .filter((n) => n.state !== 'ready')
            .map((n) => `${n.id} ${n.state}`)
            .join(', ')})`
        : ''
    }`,
    '',
  ];
  const rows = [['EDGE', 'POOL', 'STATE', 'SANDBOXES', 'CPU BUSY', 'CPU COMMITTED', 'MEMORY USED', 'UTIL', 'LAYER CACHE']];
  for (const n of [...cur.nodes].sort((a, b) => a.id.localeCompare(b.id))) {
    const c = n.capacity;
    // A lost edge's figures are its last heartbeat's, from before it stopped answering: not shown as if current.
    if (n.state === 'lost') {
      rows.push([n.id, n.pool, n.state, '–', '–', '–', '–', '–', '–']);
      continue;
    }
    rows.push([
      n.id,
      n.pool,
      n.state,
      `${n.sandboxes}/${n.maxSandboxes}`,
      pct(c.cpuUsage),
      `${Math.round(c.cpuCommitted * 10) / 10}/${c.cpus}`,
      `${humanBytes(c.memoryBytes - c.memoryAvailableBytes)}/${humanBytes(c.memoryBytes)}`,
      pct(n.utilisation),
      `${n.layerCache.entries} layer${n.layerCache.entries === 1 ? '' : 's'}, ${humanBytes(n.layerCache.bytes)}`,
    ]);
  }
  lines.push(...pad(rows));
  return `${lines.join('\n')}\n`;
}
