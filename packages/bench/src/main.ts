#!/usr/bin/env node
/**
 * The bench's CLI: `dsec bench <scenario> …` (dsec's CLI runs this file with the same arguments,
 * see packages/dsec/src/cli/commands/bench.ts) or, directly, `node packages/bench/dist/src/main.js
 * [bench] <scenario> …`. The command tree, flags, output and result files are `dsec bench`'s.
 */
import { Command } from 'commander';
import { DsecError } from '@dsec/sdk';
import { HostNotReadyError, OptionsError, Progress } from 'dsec/runtime';
import { BenchInterrupted } from './cleanup.js';
import { parsePeers } from './peers/peer.js';
import { rerender } from './rerender.js';
import { runBench, type BenchOutcome, type ScenarioRun } from './run-bench.js';
import { SCENARIOS } from './scenarios/index.js';
import { defaultOptions, type BenchScenarioDef, type ScenarioFlag } from './scenarios/scenario.js';

// `dsec bench create …` passes `bench create …`; run directly, `create …` alone works too.
const given = process.argv.slice(2);
const argv = given[0] === 'bench' ? given : ['bench', ...given];

const say = (m: string): void => void process.stderr.write(`${m}\n`);

function int(name: string, min: number): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer ≥ ${min}, got ${JSON.stringify(v)}`);
    return n;
  };
}

function intList(name: string, min: number): (v: string) => number[] {
  return (v) => {
    const parse = int(name, min);
    const list = v.split(',').map((x) => parse(x.trim()));
    if (list.length === 0) throw new Error(`--${name} needs at least one value`);
    return list;
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

async function run(scenarios: ScenarioRun[], combined: boolean, flags: CommonFlags): Promise<void> {
  let outcome: BenchOutcome;
  // On a terminal the run's lines scroll above a status line: the scenario (n of N in `all`) and
  // the time so far; elsewhere the lines alone, as before.
  const bar = new Progress('bench');
  try {
    outcome = await runBench({
      scenarios,
      combined,
      peers: parsePeers(flags.peers),
      outDir: flags.out,
      nice: flags.nice,
      commandLine: ['dsec', ...argv].join(' '),
      say: (m) => bar.log(`${m}\n`),
      onScenario: (i, total, name) => {
        if (!bar.tty) return;
        if (total > 1) bar.update(i, total);
        bar.step(name);
      },
    });
    bar.end();
  } catch (err) {
    bar.end();
    if (!(err instanceof BenchInterrupted)) throw err;
    say(`dsec bench: ${err.message}; cleaned up, no results written`);
    process.exitCode = 130;
    return;
  }
  if (flags.json) {
    const reports = outcome.reports.map((r) => r.report);
    process.stdout.write(JSON.stringify(combined ? { summary: outcome.all?.summary, reports } : reports[0], null, 2) + '\n');
  } else printSummary(outcome);
  for (const { files } of outcome.reports)
    say(`results: ${[files.json, files.markdown, files.svg, files.latest].filter(Boolean).join('\n         ')}`);
  if (outcome.all) say(`summary: ${outcome.all.files.markdown}\n         ${outcome.all.files.json}\n         ${outcome.all.files.latest}`);
  const cleanup = outcome.reports[0]?.report.cleanup;
  if (cleanup?.leaks.length || cleanup?.errors.length || outcome.failed.length) process.exitCode = 1;
}

function printSummary(outcome: BenchOutcome): void {
  const lines: string[] = [];
  for (const { report } of outcome.reports) {
    const def = SCENARIOS.find((s) => s.name === report.scenario);
    if (outcome.reports.length > 1) lines.push(`== ${report.scenario}`);
    lines.push(...(def?.lines(report.result) ?? []));
    for (const u of report.unavailable) lines.push(`${u.name.padEnd(7)} did not run: ${u.reason}`);
    for (const t of report.targets)
      lines.push(`target ${t.target}: ${t.ok === undefined ? 'not judged' : t.ok ? 'met' : 'MISSED'} (${t.measured}; ${t.note})`);
  }
  for (const f of outcome.failed) lines.push(`FAILED ${f.scenario}: ${f.error}`);
  const c = outcome.reports[0]?.report.cleanup;
  if (c)
    lines.push(
      c.leaks.length || c.errors.length ? `cleanup left: ${[...c.errors, ...c.leaks].join('; ')}` : 'cleanup verified: nothing left behind',
    );
  process.stdout.write(lines.join('\n') + '\n');
}

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

/** `--<prefix><long>`: `all` takes every scenario's flags as `--density-count` and so on. */
function addFlag(cmd: Command, f: ScenarioFlag, prefix = ''): void {
  const long = `--${prefix}${f.long} <n>`;
  const flags = !prefix && f.short ? `-${f.short}, ${long}` : long;
  if (f.text) cmd.option(long.replace(' <n>', ' <value>'), f.description, String(f.default));
  else if (f.list) cmd.option(flags.replace(' <n>', ' <list>'), f.description, intList(`${prefix}${f.long}`, f.min), f.default);
  else cmd.option(flags, f.description, int(`${prefix}${f.long}`, f.min), f.default);
}

/** Commander's key for `--<prefix><long>`: camel case. */
function flagKey(prefix: string, long: string): string {
  return `${prefix}${long}`.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

function optionsFrom(def: BenchScenarioDef, given: Record<string, unknown>, prefix = ''): object {
  const picked: Record<string, number | number[] | string> = {};
  for (const f of def.flags) picked[f.key] = given[flagKey(prefix, f.long)] as number | number[] | string;
  return defaultOptions(def, picked);
}

function registerBenchCommands(program: Command): void {
  const bench = program
    .command('bench')
    .description('benchmarks side by side with raw crun (always), podman and docker; needs root (see docs/BENCHMARKS.md)');

  for (const def of SCENARIOS) {
    const cmd = common(bench.command(def.name).description(def.summary));
    for (const f of def.flags) addFlag(cmd, f);
    cmd.action(async (f: CommonFlags & Record<string, unknown>) => {
      await run([{ def, options: optionsFrom(def, f) }], false, f);
    });
  }

  const all = common(
    bench
      .command('all')
      .description(`every scenario (${SCENARIOS.map((s) => s.name).join(', ')}) on the same peers, and a combined summary`),
  );
  for (const def of SCENARIOS) for (const f of def.flags) addFlag(all, f, `${def.name}-`);
  all.action(async (f: CommonFlags & Record<string, unknown>) => {
    await run(
      SCENARIOS.map((def) => ({ def, options: optionsFrom(def, f, `${def.name}-`) })),
      true,
      f,
    );
  });

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
}

const program = new Command('dsec').showHelpAfterError();
registerBenchCommands(program);
try {
  await program.parseAsync(argv, { from: 'user' });
} catch (err) {
  if (err instanceof DsecError) process.stderr.write(`dsec: ${err.message}${err.code ? ` (${err.code})` : ''}\n`);
  // The user's mistake or the host's state: the message says what to do; a stack trace would not.
  else if (err instanceof OptionsError || err instanceof HostNotReadyError) process.stderr.write(`dsec: ${err.message}\n`);
  else process.stderr.write(`dsec: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
}
