import type { Command } from 'commander';
import { BenchInterrupted } from '../../bench/cleanup.js';
import { parsePeers } from '../../bench/peers/peer.js';
import { rerender, type BenchReport } from '../../bench/report.js';
import { runBench, type BenchScenario } from '../../bench/run-bench.js';

const say = (m: string): void => void process.stderr.write(`${m}\n`);

function int(name: string, min: number): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer ≥ ${min}, got ${JSON.stringify(v)}`);
    return n;
  };
}

function niceValue(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < -20 || n > 19) throw new Error(`--nice must be an integer from -20 to 19, got ${JSON.stringify(v)}`);
  return n;
}

interface CommonFlags {
  nice: number;
  peers: string;
  json?: boolean;
  out: string;
}

async function run(scenario: BenchScenario, flags: CommonFlags): Promise<void> {
  let outcome: Awaited<ReturnType<typeof runBench>>;
  try {
    outcome = await runBench({
      scenario,
      peers: parsePeers(flags.peers),
      outDir: flags.out,
      nice: flags.nice,
      commandLine: ['dsec', ...process.argv.slice(2)].join(' '),
      say,
    });
  } catch (err) {
    if (!(err instanceof BenchInterrupted)) throw err;
    say(`dsec bench: ${err.message}; cleaned up, no results written`);
    process.exitCode = 130;
    return;
  }
  const { report, files } = outcome;
  if (flags.json) process.stdout.write(JSON.stringify(report, null, 2) + '\n');
  else printSummary(report);
  say(`results: ${files.json}\n         ${files.markdown}\n         ${files.svg}\n         ${files.latest}`);
  if (report.cleanup.leaks.length || report.cleanup.errors.length) process.exitCode = 1;
}

function printSummary(report: BenchReport): void {
  const lines: string[] = [];
  if (report.scenario === 'create') {
    for (const p of report.result.peers) {
      lines.push(
        `${p.name.padEnd(7)} create p50 ${p.sequential.p50} ms  p99 ${p.sequential.p99} ms  ` +
          `${p.concurrent.createsPerSecond} creates/s (${p.concurrent.concurrency} in flight)  ${p.memory.perSandboxMiB} MiB/sandbox`,
      );
    }
  } else {
    for (const p of report.result.peers) lines.push(`${p.name.padEnd(7)} exec p50 ${p.exec.p50} ms  p99 ${p.exec.p99} ms`);
  }
  for (const u of report.unavailable) lines.push(`${u.name.padEnd(7)} did not run: ${u.reason}`);
  for (const t of report.targets)
    lines.push(`target ${t.target}: ${t.ok === undefined ? 'not judged' : t.ok ? 'met' : 'MISSED'} (${t.measured}; ${t.note})`);
  const c = report.cleanup;
  lines.push(
    c.leaks.length || c.errors.length ? `cleanup left: ${[...c.errors, ...c.leaks].join('; ')}` : 'cleanup verified: nothing left behind',
  );
  process.stdout.write(lines.join('\n') + '\n');
}

export function registerBenchCommands(program: Command): void {
  const bench = program
    .command('bench')
    .description('benchmarks side by side with raw crun (always), podman and docker; needs root (see docs/BENCHMARKS.md)');

  const common = (cmd: Command): Command =>
    cmd
      .option(
        '--peers <list>',
        'comma-separated peers besides dsec: crun (always included), podman, docker; missing ones are apt-get installed',
        'crun',
      )
      .option('--json', 'print the full report as JSON on stdout')
      .option('--out <dir>', 'where result files go', 'bench/results')
      .option('--nice <n>', 'run the benchmark and all it starts at this nice value (e.g. -10 on a shared host)', niceValue, 0);

  common(
    bench
      .command('create')
      .description('create latency (one at a time), throughput (N in flight) and host memory per idle sandbox')
      .option('-n, --count <n>', 'sandboxes per peer, per phase', int('count', 1), 200)
      .option('-c, --concurrency <n>', 'creates in flight in the throughput phase', int('concurrency', 1), 8)
      .option('--rounds <n>', 'alternating rounds of the one-at-a-time phase', int('rounds', 1), 8)
      .option('--throughput-rounds <n>', 'alternating rounds of the throughput phase', int('throughput-rounds', 1), 4)
      .option('--warmup <n>', 'untimed creates per peer first', int('warmup', 0), 5)
      .option('--settle-ms <ms>', 'pause before each memory reading', int('settle-ms', 0), 1000),
  ).action(
    async (
      f: CommonFlags & { count: number; concurrency: number; rounds: number; throughputRounds: number; warmup: number; settleMs: number },
    ) => {
      await run(
        {
          name: 'create',
          options: {
            count: f.count,
            concurrency: f.concurrency,
            rounds: f.rounds,
            throughputRounds: f.throughputRounds,
            warmup: f.warmup,
            settleMs: f.settleMs,
          },
        },
        f,
      );
    },
  );

  bench
    .command('render <json...>')
    .description('render saved JSON results again as markdown + SVG beside them (e.g. after the report format changed)')
    .option('--latest', 'also refresh latest-<scenario>.md/svg from the last file given')
    .action((files: string[], f: { latest?: boolean }) => {
      files.forEach((file, i) => {
        const out = rerender(file, { latest: (f.latest ?? false) && i === files.length - 1 });
        say(`rendered ${out.markdown}, ${out.svg}${out.latest ? `, ${out.latest}` : ''}`);
      });
    });

  common(
    bench
      .command('exec')
      .description('exec round trip (`true`) through the API vs raw `crun exec` (and podman/docker exec)')
      .option('-n, --count <n>', 'execs per peer', int('count', 1), 200)
      .option('--rounds <n>', 'alternating rounds', int('rounds', 1), 10)
      .option('--warmup <n>', 'untimed execs per peer first', int('warmup', 0), 10),
  ).action(async (f: CommonFlags & { count: number; rounds: number; warmup: number }) => {
    await run({ name: 'exec', options: { count: f.count, rounds: f.rounds, warmup: f.warmup } }, f);
  });
}
