import { round } from '../stats.js';
import { renderChart, type ChartPanel } from '../chart-svg.js';
import { mdTable, ratio } from '../markdown.js';
import type { BenchReport } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { check, TARGETS, type TargetCheck } from '../targets.js';
import type { ClusterOptions, ClusterResult, HoldPhase, PerEdge, RealRun } from './cluster-result.js';
import type { HeadlineMetric } from './scenario.js';

/** A store URL without its credentials, for what the report shows. */
export function storeName(url: string): string {
  if (!url) return 'SQLite in the data dir';
  try {
    const u = new URL(url);
    return `PostgreSQL ${u.host}${u.pathname}`;
  } catch {
    return 'PostgreSQL';
  }
}

const perEdgeText = (p: PerEdge): string => {
  const counts = Object.values(p);
  // Past a dozen edges (the hold phase's 100), the range says what the list would.
  if (counts.length > 12) return `${counts.length} edges, ${Math.min(...counts)}–${Math.max(...counts)} each`;
  return perEdgeLines(p);
};
const perEdgeLines = (p: PerEdge): string =>
  Object.entries(p)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([e, n]) => `${e}: ${n}`)
    .join(', ');

/** Issues 11 and 31: ≥ 5,000 creates/s, 32,000 placed in ≤ 2 s (judged as a rate for a smaller batch), spread within 10 %. */
export function clusterTargets(r: ClusterResult): TargetCheck[] {
  const { rate, batch } = r;
  const batchRate = TARGETS.clusterBatchCount / TARGETS.clusterBatchSeconds;
  const full = batch.count === TARGETS.clusterBatchCount;
  const how = batch.mode === 'batch-api' ? 'one POST /v1/batches' : 'individual creates (no batch API)';
  return [
    check(
      `≥ ${TARGETS.clusterCreatesPerSecond} creates/s through the public API`,
      rate.createsPerSecond,
      TARGETS.clusterCreatesPerSecond,
      'creates/s',
      {
        atLeast: true,
        measured: `${rate.ok} in ${rate.seconds} s = ${rate.createsPerSecond}/s (${rate.clients} clients, ${r.edges.length} simulated edges)`,
      },
    ),
    full
      ? check(
          `${TARGETS.clusterBatchCount} placed in ≤ ${TARGETS.clusterBatchSeconds} s`,
          batch.placedSeconds,
          TARGETS.clusterBatchSeconds,
          's',
          {
            measured: `${batch.placed} placed in ${batch.placedSeconds} s (${how})`,
          },
        )
      : check(
          `${TARGETS.clusterBatchCount} placed in ≤ ${TARGETS.clusterBatchSeconds} s (≥ ${batchRate}/s)`,
          batch.placedPerSecond,
          batchRate,
          'placed/s',
          {
            atLeast: true,
            measured: `${batch.placed} placed in ${batch.placedSeconds} s = ${batch.placedPerSecond}/s (${how}; ${TARGETS.clusterBatchCount} would take ${round(TARGETS.clusterBatchCount / batch.placedPerSecond, 1)} s)`,
          },
        ),
    check(`spread within ${TARGETS.clusterSpreadPct} % across equal edges (max/min − 1)`, batch.spreadPct, TARGETS.clusterSpreadPct, '%', {
      measured: `${batch.spreadPct} % (${perEdgeText(batch.perEdge)})`,
    }),
    ...(r.hold ? holdTargets(r.hold) : []),
  ];
}

/** Issue 31's: 400,000 held on ≥ 100 edges with reads within their budgets, a kill by label that reports progress. */
export function holdTargets(h: HoldPhase): TargetCheck[] {
  const at = `at ${h.sandboxes} held, ${h.edges} edges`;
  const ms = TARGETS.clusterHoldReadP99Ms;
  return [
    check(`${TARGETS.clusterHoldSandboxes} sandboxes held`, h.sandboxes, TARGETS.clusterHoldSandboxes, 'sandboxes', {
      atLeast: true,
      measured: `${h.sandboxes} on ${h.edges} simulated edges (${h.fillFailed} failed to fill)`,
    }),
    check(`GET /v1/sandboxes/{id} p99 ≤ ${ms} ms`, h.get.p99, ms, 'ms', { measured: `${h.get.p99} ms (${at})` }),
    check(`list by label (${h.listSmall.selected} selected) p99 ≤ ${ms} ms`, h.listSmall.p99, ms, 'ms', {
      measured: `${h.listSmall.p99} ms (${at})`,
    }),
    check(`list by label (${h.listLarge.selected} selected), each page p99 ≤ ${ms} ms`, h.listLarge.p99, ms, 'ms', {
      measured: `${h.listLarge.p99} ms, ${h.listLarge.pages} page(s) (${at})`,
    }),
    check(`/metrics scrape ≤ ${TARGETS.clusterHoldMetricsMs} ms (p99)`, h.metrics.p99, TARGETS.clusterHoldMetricsMs, 'ms', {
      measured: `${h.metrics.p99} ms (${at})`,
    }),
    check(`dashboard overview ≤ ${TARGETS.clusterHoldOverviewMs} ms (p99)`, h.overview.p99, TARGETS.clusterHoldOverviewMs, 'ms', {
      measured: `${h.overview.p99} ms (${at})`,
    }),
    {
      target: `kill by label of ${h.kill.selected} completes and reports progress`,
      measured: `${h.kill.killed} killed, ${h.kill.failures} failed in ${h.kill.seconds} s; ${h.kill.progressReports} progress reports`,
      ok: h.kill.failures === 0 && h.kill.killed === h.kill.selected && h.kill.progressReports > 0,
      note: h.kill.progressReports > 0 ? `first report after ${h.kill.firstReportSeconds} s` : 'no progress before the answer',
    },
  ];
}

function holdTable(h: HoldPhase): string {
  const l = (s: { p50: number; p99: number; count: number }): string => `${s.p50} / ${s.p99} (${s.count})`;
  return mdTable(
    ['metric', 'value'],
    [
      [`held: sandboxes on ${h.edges} simulated edges (${h.batches} batches; failed)`, `${h.sandboxes} (${h.fillFailed})`],
      ['filled in (s)', h.fillSeconds],
      ['GET /v1/sandboxes/{id}, random ids, p50 / p99 ms (reads)', l(h.get)],
      [`GET /v1/sandboxes?label= selecting ${h.listSmall.selected}, p50 / p99 ms`, l(h.listSmall)],
      [
        `GET /v1/sandboxes?label= selecting ${h.listLarge.selected}, per page of ≤ ${h.listLarge.pageSize}, p50 / p99 ms`,
        `${l(h.listLarge)}; ${h.listLarge.pages} page(s), ${h.listLarge.totalMs} ms for all`,
      ],
      ...(h.listStatus
        ? [
            [
              `GET /v1/sandboxes?status=running, pages of ${h.listStatus.pageSize} by cursor (the dashboard's tiles), p50 / p99 ms`,
              l(h.listStatus),
            ],
          ]
        : []),
      ['GET /metrics, p50 / p99 ms', `${l(h.metrics)}; ${h.metrics.bytes} bytes`],
      [`dashboard overview (${h.overview.requests.join(', ')} at once), p50 / p99 ms`, l(h.overview)],
      [`GET /v1/batches/{id}, a finished batch of ${h.batchInfo.batchSize}, p50 / p99 ms`, l(h.batchInfo)],
      ['control plane RSS / peak RSS (MiB)', `${h.rssMiB} / ${h.peakRssMiB}`],
      ...(h.memory
        ? [
            [
              'of the RSS: anonymous / file-backed / shared (MiB); V8 heap used / total, external (MiB)',
              `${h.memory.anonMiB} / ${h.memory.fileMiB} / ${h.memory.shmemMiB}; ${h.memory.heapUsedMiB} / ${h.memory.heapTotalMiB}, ${h.memory.externalMiB}`,
            ],
          ]
        : []),
      [
        `kill by label: ${h.kill.selected} selected; killed / failed; seconds`,
        `${h.kill.killed} / ${h.kill.failures}; ${h.kill.seconds} s`,
      ],
      ['kill by label: progress', `${h.kill.how}; ${h.kill.progressReports} reports, the first after ${h.kill.firstReportSeconds} s`],
    ],
  );
}

function realTable(real: RealRun): string {
  const a = real.allInOne;
  const c = real.cluster;
  const rows: [string, number, number][] = [
    ['sandboxes that ran `echo ok`', a.completed, c.completed],
    ['total wall time (s)', a.seconds, c.seconds],
    ['sandboxes per second (create + exec)', a.perSecond, c.perSecond],
    ['create p50 (ms)', a.create.p50, c.create.p50],
    ['create p99 (ms)', a.create.p99, c.create.p99],
    ['create + exec p50 (ms)', a.createExec.p50, c.createExec.p50],
    ['create + exec p99 (ms)', a.createExec.p99, c.createExec.p99],
  ];
  return mdTable(
    ['metric', 'dsec up (all-in-one)', 'dsec control + 3 × dsec edge', 'cluster ÷ all-in-one'],
    rows.map(([m, x, y]) => [m, x, y, ratio(y, x)]),
  );
}

export function renderCluster(report: BenchReport<ClusterResult>, svgName: string): { markdown: string; svg: string } {
  const r = report.result;
  const o = report.options as unknown as ClusterOptions;
  const { rate, batch, costs } = r;
  const held = r.edgeHeld.reduce((s, e) => s + e.sandboxes, 0);
  const controlCpu = rate.cpu[0];
  const panels: ChartPanel[] = [
    {
      title: `creates/s, ${rate.clients} clients, ${r.edges.length} simulated edges`,
      unit: 'creates/s',
      better: 'higher',
      bars: [{ label: 'dsec', value: rate.createsPerSecond }],
      target: { value: TARGETS.clusterCreatesPerSecond, label: `target ${TARGETS.clusterCreatesPerSecond}/s` },
    },
    {
      title: `batch of ${batch.count}: placed per second`,
      unit: 'placed/s',
      better: 'higher',
      bars: [{ label: 'dsec', value: batch.placedPerSecond }],
      target: {
        value: TARGETS.clusterBatchCount / TARGETS.clusterBatchSeconds,
        label: `target ${TARGETS.clusterBatchCount / TARGETS.clusterBatchSeconds}/s`,
      },
    },
    { title: 'create p50 under load', unit: 'ms', better: 'lower', bars: [{ label: 'dsec', value: rate.latency.p50 }] },
    {
      title: 'spread across edges (max/min − 1)',
      unit: '%',
      better: 'lower',
      bars: [{ label: 'dsec', value: batch.spreadPct }],
      target: { value: TARGETS.clusterSpreadPct, label: `target ${TARGETS.clusterSpreadPct} %` },
    },
  ];
  if (!('unavailable' in r.real)) {
    panels.push({
      title: `real: create p50, ${r.real.count} sandboxes, ${r.real.concurrency} in flight`,
      unit: 'ms',
      better: 'lower',
      bars: [
        { label: 'all-in-one', value: r.real.allInOne.create.p50 },
        { label: '3 edges', value: r.real.cluster.create.p50 },
      ],
    });
  }
  const svg = renderChart(`dsec bench cluster — ${report.startedAt}`, chartSubtitle(report), panels);
  const md = [
    `# dsec bench cluster — ${report.startedAt}`,
    '',
    `The control plane's own rate: \`dsec control\` with ${r.edges.length} **simulated** edges (they speak the edge protocol and join ` +
      'and heartbeat like `dsec edge`, but a create only records the sandbox in memory: no crun). Load through the public API: ' +
      `raw keep-alive HTTP, POST /v1/sandboxes \`{image: busybox, resources: {memoryMiB: 64, cpu: 0.1}}\`.`,
    '',
    `Layout: ${r.layout}`,
    '',
    '## The control plane against simulated edges',
    '',
    mdTable(
      ['metric', 'value'],
      [
        [`creates/s (${rate.ok} creates, ${rate.clients} concurrent clients)`, rate.createsPerSecond],
        ...(rate.controlLoopBusy !== undefined
          ? [["the control plane's event loop busy in the rate phase (its one thread; 1 = saturated)", rate.controlLoopBusy]]
          : []),
        ...(batch.controlLoopBusy !== undefined ? [["the control plane's event loop busy in the batch", batch.controlLoopBusy]] : []),
        ...(rate.warmup
          ? [
              [
                `creates/s of the warm-up just before (${rate.warmup.ok} creates, a fresh control plane's first)`,
                rate.warmup.createsPerSecond,
              ],
            ]
          : []),
        ['create latency under that load, p50 / p90 / p99 (ms)', `${rate.latency.p50} / ${rate.latency.p90} / ${rate.latency.p99}`],
        [`batch of ${batch.count}: how`, batch.note],
        ['batch: accepted after (s)', batch.mode === 'batch-api' ? batch.acceptedSeconds : 'n/a (each create is accepted as it is placed)'],
        ['batch: all placed after (s)', batch.placedSeconds],
        ['batch: all running after (s)', batch.runningSeconds],
        ['batch: placed per second', batch.placedPerSecond],
        ['batch: placed / failed', `${batch.placed} / ${batch.failed}`],
        ['batch: sandboxes per edge', perEdgeText(batch.perEdge)],
        ['batch: spread, max/min − 1 (%)', batch.spreadPct],
        [
          'GET /v1/nodes (no edge call) while the batch runs, p50 / p99 (ms)',
          `${batch.readLatency.p50} / ${batch.readLatency.p99} (${batch.readLatency.count} reads)`,
        ],
        ...(batch.mode === 'individual-creates'
          ? [['batch: create latency p50 / p99 (ms)', `${batch.createLatency.p50} / ${batch.createLatency.p99}`] as [string, string]]
          : []),
        ['rate phase: sandboxes per edge', perEdgeText(rate.perEdge)],
        [
          'accepted by the API in all phases / held by the simulated edges',
          `${r.acceptedTotal} / ${held}${r.acceptedTotal === held ? ' (all there)' : ' (MISMATCH)'}`,
        ],
      ],
    ),
    '',
    '## Where a create goes',
    '',
    'CPU time each process spent in the rate phase, per create (all three share the same 2 cores):',
    '',
    mdTable(
      ['process', 'CPU s', 'CPU µs per create'],
      rate.cpu.map((c) => [c.process, c.seconds, c.usPerCreate]),
    ),
    '',
    `Together they used ${round(
      rate.cpu.reduce((t, c) => t + c.seconds, 0),
      2,
    )} CPU-seconds of the ${round(rate.seconds * report.host.cpus, 1)} ` +
      `that ${report.host.cpus} cores had in the phase's ${rate.seconds} s (${round((100 * rate.cpu.reduce((t, c) => t + c.seconds, 0)) / (rate.seconds * report.host.cpus), 0)} %); ` +
      `the rest went to other jobs on this shared host (load average ${report.host.loadAverage1m} at start).`,
    '',
    controlCpu && controlCpu.usPerCreate > 0
      ? `At ${controlCpu.usPerCreate} µs of CPU per create, one core running only the control plane would top out near ${Math.round(1e6 / controlCpu.usPerCreate)} creates/s (Node runs the control plane's JavaScript on one thread).`
      : '',
    '',
    machineCeiling(rate.cpu, report.host.cpus, 'create', TARGETS.clusterCreatesPerSecond, `${TARGETS.clusterCreatesPerSecond} creates/s`),
    '',
    ...(batch.cpu
      ? [
          `CPU time each process spent on the batch of ${batch.count}, from its request to its last event, per sandbox placed:`,
          '',
          mdTable(
            ['process', 'CPU s', 'CPU µs per sandbox'],
            batch.cpu.map((c) => [c.process, c.seconds, c.usPerCreate]),
          ),
          '',
          machineCeiling(
            batch.cpu,
            report.host.cpus,
            'sandbox',
            TARGETS.clusterBatchCount / TARGETS.clusterBatchSeconds,
            `${TARGETS.clusterBatchCount} in ${TARGETS.clusterBatchSeconds} s`,
          ),
          '',
        ]
      : []),
    'Parts of one create, each measured alone in the benchmark process:',
    '',
    mdTable(
      ['part', 'µs'],
      [
        ['state store writes of one create (insert with its spec, then status → running; SQLite WAL)', costs.sqliteWritesUs],
        ['one create over the edge protocol (HttpEdgeClient → simulated edge, loopback HTTP, schema validation)', costs.edgeCallUs],
        ['one create through the public API, one client, nothing else in flight (p50)', costs.serialCreateUs],
      ],
    ),
    '',
    ...(r.hold
      ? [
          `## Holding ${r.hold.sandboxes} sandboxes`,
          '',
          `Filled with batches (POST /v1/batches, ≤ 32,000 each, one label per batch), then each read measured alone, one request at a time, with nothing else in flight. The control plane's state store: ${storeName(o.store ?? '')}.`,
          '',
          holdTable(r.hold),
          '',
        ]
      : []),
    '## Real run: three crun edges vs the all-in-one',
    '',
    'unavailable' in r.real
      ? `Not run: ${r.real.unavailable}`
      : [
          `${r.real.count} busybox sandboxes each way, each created and running \`echo ok\` (output checked), ${r.real.concurrency} in flight, through the SDK` +
            (r.real.rounds ? ` in ${r.real.rounds} rounds per side, the sides alternating (ABBA…); ` : '; ') +
            `the all-in-one is \`dsec up\`'s wiring in the benchmark process (in-process edge), the cluster is \`dsec control\` and three \`dsec edge\` ` +
            'daemons as child processes on loopback ports, each with its own data dir (layers fetched from the blob endpoint; a warm-up of 6 first). ' +
            'All on the same machine, so the three edges share its 2 cores and its one crun.',
          '',
          realTable(r.real),
          '',
          `Cluster sandboxes per edge: ${perEdgeText(r.real.cluster.perEdge)}.`,
          ...[
            ...r.real.allInOne.errors.map((e) => `- all-in-one error: ${e}`),
            ...r.real.cluster.errors.map((e) => `- cluster error: ${e}`),
          ],
        ].join('\n'),
    '',
    `Options: ${JSON.stringify({ edges: o.edges, clients: o.clients, creates: o.creates, batchCount: o.batchCount, batchConcurrency: o.batchConcurrency, realCount: o.realCount, realConcurrency: o.realConcurrency, hold: o.hold, store: storeName(o.store ?? '') })}`,
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export function clusterLines(r: ClusterResult): string[] {
  const out = [
    `rate    ${r.rate.ok} creates in ${r.rate.seconds} s = ${r.rate.createsPerSecond}/s (${r.rate.clients} clients, ${r.edges.length} simulated edges), create p50 ${r.rate.latency.p50} ms p99 ${r.rate.latency.p99} ms` +
      (r.rate.warmup ? `; warm-up before it ${r.rate.warmup.ok} at ${r.rate.warmup.createsPerSecond}/s` : ''),
    `batch   ${r.batch.placed}/${r.batch.count} placed in ${r.batch.placedSeconds} s = ${r.batch.placedPerSecond}/s (${r.batch.mode}), spread ${r.batch.spreadPct} % (${perEdgeText(r.batch.perEdge)}), GET p50 ${r.batch.readLatency.p50} ms`,
    `cost    control plane ${r.rate.cpu[0]?.usPerCreate} µs CPU per create${r.rate.controlLoopBusy !== undefined ? ` (its event loop ${Math.round(r.rate.controlLoopBusy * 100)} % busy)` : ''}; sqlite writes ${r.costs.sqliteWritesUs} µs; edge call ${r.costs.edgeCallUs} µs`,
  ];
  if (r.hold)
    out.push(
      `hold    ${r.hold.sandboxes} held: get p99 ${r.hold.get.p99} ms, list p99 ${r.hold.listSmall.p99} / ${r.hold.listLarge.p99} ms, /metrics p99 ${r.hold.metrics.p99} ms, overview p99 ${r.hold.overview.p99} ms, batch p99 ${r.hold.batchInfo.p99} ms, RSS ${r.hold.rssMiB} MiB, kill ${r.hold.kill.killed} in ${r.hold.kill.seconds} s (${r.hold.kill.progressReports} reports)`,
    );
  if ('unavailable' in r.real) out.push(`real    not run: ${r.real.unavailable}`);
  else
    out.push(
      `real    all-in-one ${r.real.allInOne.completed} in ${r.real.allInOne.seconds} s, create p50 ${r.real.allInOne.create.p50} ms; ` +
        `3 edges ${r.real.cluster.completed} in ${r.real.cluster.seconds} s, create p50 ${r.real.cluster.create.p50} ms`,
    );
  return out;
}

export function clusterHeadline(r: ClusterResult): HeadlineMetric[] {
  return [
    { metric: 'cluster: creates/s against simulated edges', better: 'higher', values: { dsec: r.rate.createsPerSecond } },
    { metric: `cluster: batch of ${r.batch.count}, all placed (s)`, better: 'lower', values: { dsec: r.batch.placedSeconds } },
  ];
}

/**
 * What the machine allows whatever the control plane's thread does: the three processes share its
 * cores, so their CPU per create together bounds the rate (every core busy with nothing else), and
 * the target asks for at most cores ÷ rate of it. Empty when nothing was measured.
 */
export function machineCeiling(
  cpu: readonly { usPerCreate: number }[],
  cores: number,
  unit: 'create' | 'sandbox',
  targetPerSecond: number,
  target: string,
): string {
  const us = cpu.reduce((t, c) => t + c.usPerCreate, 0);
  if (!(us > 0)) return '';
  return (
    `The three together spent ${round(us, 1)} µs of CPU per ${unit}: ${cores} cores running only them would top out near ${Math.round((cores * 1e6) / us)} ${unit === 'create' ? 'creates' : 'sandboxes'}/s. ` +
    `${target} needs them at ${round((cores * 1e6) / targetPerSecond, 1)} µs per ${unit} or less, with every core theirs.`
  );
}
