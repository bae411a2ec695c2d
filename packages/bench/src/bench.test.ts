/** Unit tests of the benchmark's pure parts: rounds, memory arithmetic, targets, tables, chart. */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { renderChart } from './chart-svg.js';
import { headroomProblem, inScope, memoryCgroup, residentHelpers, type HostProcess } from './host-census.js';
import type { HostInfo } from './host-info.js';
import { type LatencySummary, summarizeLatency } from './latency.js';
import { mdTable, ratio } from './markdown.js';
import { memUsed, readMeminfo } from './meminfo.js';
import { parsePeers } from './peers/peer.js';
import { renderAllMarkdown, type AllSummary } from './report-all.js';
import { fileStamp } from './report.js';
import { type BenchReport } from './result-types.js';
import { burstTargets, type BurstResult } from './scenarios/burst.js';
import { hardeningTargets } from './scenarios/hardening-report.js';
import { type ArmResult, type HardeningResult } from './scenarios/hardening-result.js';
import { densityTargets, fillRatio, type DensityResult } from './scenarios/density.js';
import { SCENARIOS } from './scenarios/index.js';
import { pauseScenario, type PauseResult } from './scenarios/pause.js';
import { storeName } from './scenarios/cluster-report.js';
import { defaultOptions } from './scenarios/scenario.js';
import { snapshotTargets, type SnapshotScenarioResult } from './scenarios/snapshot.js';
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

  test("hardening: defences judged on the precompiled-filter arm when the run has it; a network policy's cost on create in ms", () => {
    const arm = (label: string, p50: number): ArmResult => ({ label, what: label, latency: summarizeLatency([p50]), errors: [] });
    const result = (arms: ArmResult[]): HardeningResult =>
      ({ create: arms, exec: [], switch: { put: summarizeLatency([5]) }, peers: [], dropped: [] }) as unknown as HardeningResult;
    const [defences, network] = hardeningTargets(
      result([arm('crun', 30), arm('crun bpf', 21), arm('crun bare', 20), arm('dsec', 25), arm('dsec+net', 40)]),
    );
    assert.match(defences!.target, /crun bpf/);
    assert.equal(defences!.ok, true, defences!.measured);
    assert.match(network!.measured, /\+15 ms/);
    assert.equal(network!.ok, false);
    const [old] = hardeningTargets(result([arm('crun', 30), arm('crun bare', 20), arm('dsec', 25), arm('dsec+net', 30)]));
    assert.match(old!.target, /\(crun with/, 'a run from before the precompiled arm is judged on crun');
    assert.equal(old!.ok, false);
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

const lat = (p50: number): LatencySummary => ({ count: 10, p50, p90: p50, p99: p50, min: p50, max: p50, mean: p50 });
const base = { description: 'd', version: 'v', errors: [] };

describe('bench scenarios registry', () => {
  test("names and each scenario's option keys and flags are unique; defaults come from the flags", () => {
    const names = SCENARIOS.map((s) => s.name);
    assert.equal(new Set(names).size, names.length);
    for (const s of SCENARIOS) {
      assert.equal(new Set(s.flags.map((f) => f.key)).size, s.flags.length, s.name);
      assert.equal(new Set(s.flags.map((f) => f.long)).size, s.flags.length, s.name);
    }
    assert.deepEqual(defaultOptions(pauseScenario, { count: 7 }), { count: 7, rounds: 10, warmup: 5 });
  });

  test("cluster's --store is text (a postgres:// URL, or SQLite by default), shown without its credentials", () => {
    const cluster = SCENARIOS.find((s) => s.name === 'cluster')!;
    const flag = cluster.flags.find((f) => f.long === 'store');
    assert.deepEqual([flag?.text, flag?.default], [true, '']);
    assert.equal((defaultOptions(cluster, {}) as { store: string }).store, '');
    assert.equal(storeName(''), 'SQLite in the data dir');
    assert.equal(storeName('postgres://dsec:secret@127.0.0.1:5432/hold'), 'PostgreSQL 127.0.0.1:5432/hold');
  });

  test('a scenario renders its report: table with ratios, targets, chart', () => {
    const result: PauseResult = {
      peers: [
        { name: 'dsec', ...base, pause: lat(4), resume: lat(6) },
        { name: 'crun', ...base, pause: lat(8), resume: lat(8) },
      ],
      dropped: [],
    };
    const report: BenchReport<PauseResult> = {
      scenario: 'pause',
      startedAt: '2025-01-01T00:00:00.000Z',
      finishedAt: '2025-01-01T00:01:00.000Z',
      host: HOST,
      loadAverage1mAtEnd: 1,
      options: { count: 10, rounds: 2, warmup: 0 },
      unavailable: [{ name: 'docker', reason: 'set-up failed: no dockerd' }],
      targets: pauseScenario.targets(result),
      profile: [],
      notInstrumented: [],
      cleanup: { errors: [], leaks: [] },
      result,
    };
    assert.deepEqual(
      report.targets.map((t) => t.ok),
      [true, false],
    );
    const { markdown, svg } = pauseScenario.render(report, 'x.svg');
    assert.match(markdown, /\| pause p50 \(ms\) \| 4 \| 8 \| 0.50× \|/);
    assert.match(markdown, /\*\*docker\*\*: set-up failed: no dockerd/);
    assert.match(markdown, /!\[chart\]\(x.svg\)/);
    assert.match(svg, /^<svg/);
  });
});

const HOST: HostInfo = {
  hostname: 'h',
  kernel: '6.1',
  os: 'Debian',
  cpus: 2,
  cpuModel: 'cpu',
  memTotalMiB: 24000,
  loadAverage1m: 1,
  node: 'v20',
  dsec: '0.1.0',
  commandLine: 'dsec bench all',
};

describe('bench targets of the new scenarios', () => {
  test('burst is judged as a rate, so a smaller -n is judged alike', () => {
    const r = (n: number, s: number): BurstResult => ({
      peers: [{ name: 'dsec', ...base, completed: n, totalSeconds: s, sandboxesPerSecond: n / s, perSandbox: lat(100), removeSeconds: 1 }],
      dropped: [],
    });
    assert.equal(burstTargets(r(1000, 25))[0]!.ok, true);
    assert.equal(burstTargets(r(100, 2.5))[0]!.ok, true);
    assert.equal(burstTargets(r(1000, 40))[0]!.ok, false);
  });

  test('density: memory per sandbox, resident helpers, the next sandbox on a full node against an empty one', () => {
    const point = (level: number, held: number, createMs: number, execMs: number) => ({
      level,
      held,
      create: lat(createMs),
      exec: lat(execMs),
      memAvailableMiB: 1,
      fds: 1,
      mounts: 1,
    });
    const r = (mib: number, helpers: Record<string, number>, n = 1000, fullCreate = 30, fullExec = 10): DensityResult => ({
      peers: [
        {
          name: 'dsec',
          ...base,
          sandboxes: n,
          createSeconds: 1,
          removeSeconds: 1,
          perSandbox: {
            memAvailableMiB: mib,
            freedMiB: mib,
            slabKiB: 1,
            sUnreclaimKiB: 1,
            kernelStackKiB: 1,
            pageTablesKiB: 1,
            cgroupChargedKiB: 1,
          },
          helpers,
          helpersPerSandbox: Object.values(helpers).reduce((a, b) => a + b, 0) / n,
          curve: [point(0, 0, 25, 8), point(0.1, n / 10, 26, 8), point(0.5, n / 2, 27, 9), point(1, n, fullCreate, fullExec)],
        },
      ],
      dropped: [],
    });
    assert.deepEqual(
      densityTargets(r(0.9, {})).map((t) => t.ok),
      [true, true, true, true],
    );
    const bad = densityTargets(r(1.5, { conmon: 1000 }, 1000, 40, 13));
    assert.deepEqual(
      bad.map((t) => t.ok),
      [false, false, false, false],
    );
    assert.match(bad[0]!.target, /1000 held/);
    assert.match(bad[3]!.measured, /conmon ×1000/);
    assert.equal(
      fillRatio(r(1, {}).peers[0]!.curve, (p) => p.create.p50),
      30 / 25,
    );
    // A run that stopped before a second point has no full node to judge.
    const one = r(1, {});
    one.peers[0]!.curve = one.peers[0]!.curve.slice(0, 1);
    assert.equal(densityTargets(one)[0]!.ok, undefined);
  });

  test('snapshot: restore against create, fork against restore, data checked, size-bound target not judged at another size', () => {
    const r = (dataMiB: number, bytes: number): SnapshotScenarioResult => ({
      expectedBytes: dataMiB * 1048576,
      peers: [
        {
          name: 'dsec',
          ...base,
          writeSeconds: 1,
          create: lat(60),
          snapshot: lat(1500),
          restore: lat(75),
          fork: { count: 32, wallSeconds: 2 },
          restoredBytes: bytes,
          forkedBytes: bytes,
        },
      ],
      dropped: [],
    });
    const ok = snapshotTargets(r(100, 100 * 1048576));
    assert.deepEqual(
      ok.map((t) => t.ok),
      [true, true, true, true],
    );
    const other = snapshotTargets(r(20, 5));
    assert.equal(other[0]!.ok, undefined);
    assert.equal(other[3]!.ok, false);
  });
});

describe('bench host census', () => {
  test('the memory cgroup is read from v1 and v2 lines', () => {
    assert.equal(memoryCgroup('12:pids:/a\n4:memory:/dsec/sb-1\n0::/x\n'), '/dsec/sb-1');
    assert.equal(memoryCgroup('0::/system.slice/x\n'), '/system.slice/x');
    assert.equal(inScope('/dsec/sb-bench1-2', { parent: 'dsec', prefix: 'sb-bench1-' }), true);
    assert.equal(inScope('/dsec/sb-other', { parent: 'dsec', prefix: 'sb-bench1-' }), false);
    assert.equal(inScope('/dsec-bench-x-crun/c1', { parent: 'dsec-bench-x-crun' }), true);
  });

  test('resident helpers are new ancestors of sandbox processes outside their cgroup', () => {
    const p = (pid: number, ppid: number, comm: string, cgroup: string): HostProcess => ({ pid, ppid, comm, cgroup });
    const now = [
      p(1, 0, 'init', '/'),
      p(10, 1, 'containerd', '/'),
      p(20, 10, 'containerd-shim', '/'),
      p(21, 20, 'sleep', '/peer/c1'),
      p(30, 1, 'catatonit', '/peer/c2'),
      p(31, 30, 'sleep', '/peer/c2'),
      p(40, 1, 'make', '/'),
    ];
    assert.deepEqual(residentHelpers(new Set([1, 10]), { parent: 'peer' }, now), { 'containerd-shim': 1 });
  });

  test('a run the host cannot hold is refused with what does not fit', () => {
    const host = { pidMax: 32768, threadsMax: 100000, tasks: 500, memAvailableMiB: 20000 };
    assert.equal(headroomProblem(1000, ['crun', 'podman', 'docker'], host), undefined);
    assert.match(headroomProblem(12000, ['crun'], host) ?? '', /pid_max/);
    assert.match(headroomProblem(1000, ['docker'], { ...host, memAvailableMiB: 4000 }) ?? '', /MiB available/);
  });
});

describe('bench all summary', () => {
  test('one table of every scenario with dsec ÷ peer ratios, and every target prefixed by its scenario', () => {
    const summary: AllSummary = {
      startedAt: '2025-01-01T00:00:00.000Z',
      finishedAt: '2025-01-01T01:00:00.000Z',
      host: HOST,
      options: { peers: ['crun', 'podman'], nice: 0 },
      scenarios: [
        {
          scenario: 'pause',
          report: 'pause-x.md',
          headline: [{ metric: 'pause p50 (ms)', better: 'lower', values: { dsec: 5, crun: 10, podman: 50 } }],
          targets: [{ target: 'pause p50 ≤ 5 ms', measured: '5 ms', ok: true, note: 'met' }],
          unavailable: [{ name: 'crun', reason: 'not applicable' }],
        },
      ],
      failed: [],
      cleanup: { errors: [], leaks: [] },
    };
    const md = renderAllMarkdown(summary);
    assert.match(md, /\| scenario \| metric \| dsec \| crun \| podman \| dsec ÷ crun \| dsec ÷ podman \|/);
    assert.match(md, /\| pause \| pause p50 \(ms\) \| 5 \| 10 \| 50 \| 0.50× \| 0.10× \|/);
    assert.match(md, /\| pause: pause p50 ≤ 5 ms \|/);
    assert.match(md, /\[pause\]\(pause-x.md\)/);
    assert.match(md, /cleanup: verified/);
  });
});
