/**
 * `dsec bench cluster --hold N`: one control plane holding N sandboxes on simulated edges (issue 31),
 * filled with batches of at most 32,000, then every read measured alone, with nothing else in flight,
 * from a client process of its own (hold-reads.ts): a sandbox by id, lists by label (a small
 * selection and a whole batch, paged), /metrics, the dashboard's overview, a finished batch's
 * status; then the control plane's RSS, and a kill by label of one whole batch with its progress.
 */
import { readFileSync } from 'node:fs';
import { BENCH_IMAGE } from '../fixture.js';
import { summarizeLatency } from '../latency.js';
import { round } from '../stats.js';
import { runBatchApi } from './cluster-batch-api.js';
import type { HoldPhase } from './cluster-result.js';
import { ndjsonLines } from '../ndjson-lines.js';
import { fileURLToPath } from 'node:url';
import { LineChild } from './rollout-child.js';
import { STATUS_PAGE, type HoldReadsInput, type HoldReadsOutput } from './hold-reads.js';

/** The batch API's largest batch: the hold is filled with these, and one of them is killed by label at the end. */
export const HOLD_BATCH = 32_000;
/** The small selection listed by label. */
const SMALL = 100;
/** Sandboxes a page of a list asks for. */
export const PAGE = 1000;
/** What the dashboard's overview page (packages/dsec/ui/src/pages/overview.tsx and its components) fetches, all at once. */
export const OVERVIEW_REQUESTS = ['/v1/nodes', '/v1/sandboxes/counts', '/metrics', '/v1/pools'];
const NDJSON = 'application/x-ndjson';

/** Fields of /proc/PID/status in MiB, from one read (so the RSS and its parts are of one instant). */
function statusMiB(pid: number): (field: 'VmRSS' | 'VmHWM' | 'RssAnon' | 'RssFile' | 'RssShmem') => number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  return (field) => {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
    return m ? round(Number(m[1]) / 1024, 1) : NaN;
  };
}

/** A gauge of the control plane's /metrics text, in MiB (NaN when it is not there). */
function metricMiB(text: string, name: string): number {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? round(Number(m[1]) / 1048576, 1) : NaN;
}

/** POST /v1/sandboxes/kill, asking for its progress as NDJSON; counts the progress lines before the result. */
async function killByLabel(url: string, apiKey: string, labels: Record<string, string>): Promise<HoldPhase['kill']> {
  const t0 = performance.now();
  const res = await fetch(`${url}/v1/sandboxes/kill`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json', accept: `${NDJSON}, application/json` },
    body: JSON.stringify({ labels }),
  });
  if (res.status !== 200 || !res.body) throw new Error(`POST /v1/sandboxes/kill: HTTP ${res.status} ${await res.text()}`);
  let first = NaN;
  if (!(res.headers.get('content-type') ?? '').includes(NDJSON)) {
    const r = (await res.json()) as { ids: string[]; failures: unknown[] };
    const s = (performance.now() - t0) / 1000;
    return {
      selected: r.ids.length + r.failures.length,
      killed: r.ids.length,
      failures: r.failures.length,
      seconds: round(s, 2),
      progressReports: 0,
      firstReportSeconds: round(s, 2),
      how: 'one JSON answer at the end (no progress)',
    };
  }
  let reports = 0;
  let result: { total: number; killed: number; failed: number } | undefined;
  for await (const e of ndjsonLines<{ type: string; total: number; done: number; failed: number; ids?: string[] }>(res.body)) {
    if (Number.isNaN(first)) first = performance.now() - t0;
    if (e.type === 'progress') reports++;
    if (e.type === 'done') result = { total: e.total, killed: e.done - e.failed, failed: e.failed };
  }
  if (!result) throw new Error('POST /v1/sandboxes/kill: the stream ended without its done line');
  return {
    selected: result.total,
    killed: result.killed,
    failures: result.failed,
    seconds: round((performance.now() - t0) / 1000, 2),
    progressReports: reports,
    firstReportSeconds: round(first / 1000, 2),
    how: `NDJSON (Accept: ${NDJSON}): progress lines, then the result`,
  };
}

export async function runHold(
  ctl: { url: string; apiKey: string; pid: number; edges: number },
  n: number,
  say: (s: string) => void,
  signal: AbortSignal,
): Promise<HoldPhase> {
  if (n <= SMALL) throw new Error(`--hold ${n}: hold more than ${SMALL} (a selection of ${SMALL}, then at least one batch)`);
  const sizes: number[] = [];
  for (let left = n - Math.min(SMALL, n); left > 0; left -= HOLD_BATCH) sizes.push(Math.min(HOLD_BATCH, left));
  const ids: string[] = [];
  const batchIds: string[] = [];
  let failed = 0;
  const t0 = performance.now();
  // The small selection first, then batches labelled hold-batch=<k> (one label per batch: a list or a kill of it selects the whole batch).
  const fills: { count: number; labels: Record<string, string> }[] = [
    { count: Math.min(SMALL, n), labels: { 'hold-probe': 'small' } },
    ...sizes.map((count, k) => ({ count, labels: { 'hold-batch': String(k) } })),
  ];
  for (const [k, f] of fills.entries()) {
    const spec = { image: BENCH_IMAGE, resources: { memoryMiB: 64, cpu: 0.1 }, labels: f.labels };
    const tb = performance.now();
    // The API's default concurrency (64 per edge): the fill is set-up, not what is measured.
    const r = await runBatchApi(ctl.url, ctl.apiKey, { count: f.count, spec }, signal, ids);
    if (!r) throw new Error('POST /v1/batches is not on this build: the hold phase fills with batches');
    failed += r.failed;
    batchIds.push(r.id);
    say(`  fill ${k + 1}/${fills.length}: ${r.placed} placed in ${round((performance.now() - tb) / 1000, 1)} s (${ids.length} held)`);
  }
  const fillSeconds = round((performance.now() - t0) / 1000, 1);
  signal.throwIfAborted();

  say('  reads, one at a time, nothing else in flight, from a client process of its own…');
  const reader = new LineChild(process.execPath, [fileURLToPath(new URL('./hold-reads-child.js', import.meta.url))]);
  const input: HoldReadsInput = {
    url: ctl.url,
    apiKey: ctl.apiKey,
    ids: Array.from({ length: 1000 }, () => ids[Math.floor(Math.random() * ids.length)]!),
    smallLabel: 'hold-probe=small',
    largeLabel: 'hold-batch=0',
    page: PAGE,
    batchId: batchIds[batchIds.length - 1]!,
    overview: OVERVIEW_REQUESTS,
  };
  let reads: HoldReadsOutput;
  try {
    reads = (await reader.ask(input)) as unknown as HoldReadsOutput;
  } finally {
    await reader.close();
  }
  const { get, listSmall, metrics, overview, batchInfo, metricsText } = reads;
  const status = statusMiB(ctl.pid);
  const rssMiB = status('VmRSS');
  const peakRssMiB = status('VmHWM');
  // Where the resident memory is: anonymous (V8's heap and the rest of the process's own) or
  // file-backed (SQLite's memory-mapped database pages, code), and V8's own figures from /metrics.
  const memory = {
    anonMiB: status('RssAnon'),
    fileMiB: status('RssFile'),
    shmemMiB: status('RssShmem'),
    heapUsedMiB: metricMiB(metricsText, 'nodejs_heap_size_used_bytes'),
    heapTotalMiB: metricMiB(metricsText, 'nodejs_heap_size_total_bytes'),
    externalMiB: metricMiB(metricsText, 'nodejs_external_memory_bytes'),
  };
  say(`  get p99 ${round(summarizeLatency(get).p99, 1)} ms; /metrics p50 ${summarizeLatency(metrics).p50} ms; RSS ${rssMiB} MiB`);

  // The first batch: a whole one of HOLD_BATCH (issue 31's kill by label of 32,000) when the hold is that large; the last is what is left over.
  say(`  kill by label hold-batch=0 (${sizes[0] ?? 0} sandboxes)…`);
  const kill = await killByLabel(ctl.url, ctl.apiKey, { 'hold-batch': '0' });
  say(`  killed ${kill.killed} in ${kill.seconds} s, ${kill.progressReports} progress reports`);
  return {
    sandboxes: ids.length,
    edges: ctl.edges,
    batches: fills.length,
    fillSeconds,
    fillFailed: failed,
    get: summarizeLatency(get),
    listSmall: { ...summarizeLatency(listSmall), selected: reads.smallSelected },
    listLarge: {
      ...summarizeLatency(reads.listLarge),
      selected: reads.largeSelected,
      pages: reads.largePages,
      pageSize: PAGE,
      totalMs: round(reads.largeMs, 1),
    },
    listStatus: { ...summarizeLatency(reads.listStatus), pageSize: STATUS_PAGE },
    metrics: { ...summarizeLatency(metrics), bytes: metricsText.length },
    overview: { ...summarizeLatency(overview), requests: OVERVIEW_REQUESTS },
    batchInfo: { ...summarizeLatency(batchInfo), batchSize: sizes[sizes.length - 1] ?? 0 },
    rssMiB,
    peakRssMiB,
    memory,
    kill,
  };
}
