import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { loadavg, setPriority } from 'node:os';
import { createBreakdown, execBreakdown, floorBreakdown } from './breakdown.js';
import { Cleanup, trapSignals } from './cleanup.js';
import { startFixture } from './fixture.js';
import { dsecVersion, hostInfo } from './host-info.js';
import type { PeerName } from './peers/peer.js';
import { setupPeers } from './peers/setup.js';
import { instrumentDsec, phaseKey, Spans } from './profile.js';
import { createTargets } from './report-create.js';
import { execTargets } from './report-exec.js';
import { writeResults, type BenchReport, type ProfileSection, type WrittenFiles } from './report.js';
import { PHASE_CONCURRENT, PHASE_SEQUENTIAL, runCreateScenario, type CreateScenarioOptions } from './scenarios/create.js';
import { PHASE_EXEC, runExecScenario, type ExecScenarioOptions } from './scenarios/exec.js';
import { runNames } from './run-names.js';
import { findBenchLeaks, sweep } from './sweep.js';

export type BenchScenario = { name: 'create'; options: CreateScenarioOptions } | { name: 'exec'; options: ExecScenarioOptions };

export interface BenchRunOptions {
  scenario: BenchScenario;
  peers: PeerName[];
  outDir: string;
  commandLine: string;
  /** Nice value for this process and everything it starts (all peers alike); 0 leaves it as is. */
  nice: number;
  say: (m: string) => void;
}

/**
 * One benchmark run: a temp dir, an in-process dsec, the peers, the scenario, the result files.
 * Everything it makes is undone on the way out, also on failure and Ctrl-C; the report says
 * what (if anything) could not be.
 */
export async function runBench(opts: BenchRunOptions): Promise<{ report: BenchReport; files: WrittenFiles }> {
  const { say } = opts;
  if (process.getuid?.() !== 0) throw new Error('dsec bench needs root (mounts, namespaces, cgroups, apt-get)');
  // Lower than others' nice value, the whole run (server, crun, podman, dockerd) is perturbed less by other
  // jobs on a shared host; every peer inherits it, so the comparison stays even.
  if (opts.nice !== 0) setPriority(opts.nice);
  const startedAt = new Date().toISOString();
  const host = await hostInfo(opts.commandLine);
  const names = runNames();
  const { dir } = names;
  mkdirSync(dir);
  const cleanup = new Cleanup();
  const leaks: string[] = [];
  cleanup.add(`remove ${dir}`, () => sweep(names));
  cleanup.add('check for leftovers', async () => void leaks.push(...(await findBenchLeaks(names))));
  const abort = new AbortController();
  const untrap = trapSignals(abort, cleanup, say);
  const spans = new Spans();
  let body: Omit<BenchReport, 'startedAt' | 'finishedAt' | 'host' | 'loadAverage1mAtEnd' | 'cleanup'> | undefined;
  let failure: unknown;
  try {
    say(`temp dir ${dir}; starting dsec in this process…`);
    const count = opts.scenario.options.count;
    const fixture = await startFixture(names, Math.max(4000, count * 4), cleanup, say);
    const notInstrumented = instrumentDsec(fixture.dsec, spans);
    const { peers, unavailable } = await setupPeers(opts.peers, fixture, {
      cleanup,
      say,
      spans,
      dsecVersion: await dsecVersion(),
      runLabel: `bench-${randomBytes(3).toString('hex')}`,
    });
    if (!peers.some((p) => p.name === 'dsec'))
      throw new Error(`dsec itself could not run: ${unavailable.find((u) => u.name === 'dsec')?.reason}`);
    say(
      `peers: ${peers.map((p) => p.name).join(', ')}${unavailable.length ? `; not running: ${unavailable.map((u) => u.name).join(', ')}` : ''}`,
    );
    const ctx = { signal: abort.signal, spans, say };
    if (opts.scenario.name === 'create') {
      const result = await runCreateScenario(peers, opts.scenario.options, ctx);
      const profile: ProfileSection[] = [];
      const dsec = result.peers.find((p) => p.name === 'dsec');
      const crun = result.peers.find((p) => p.name === 'crun');
      if (dsec && result.ops['dsec']) {
        profile.push({
          title: "Where dsec's create time goes (one at a time, mean per create)",
          rows: createBreakdown(spans, phaseKey('dsec', PHASE_SEQUENTIAL), result.ops['dsec'].sequential, dsec.sequential.mean),
        });
      }
      if (crun && result.ops['crun']) {
        profile.push({
          title: 'The floor, raw crun, split the same way (one at a time, mean per create)',
          rows: floorBreakdown(spans, phaseKey('crun', PHASE_SEQUENTIAL), result.ops['crun'].sequential, crun.sequential.mean),
        });
      }
      if (dsec && result.ops['dsec']) {
        profile.push({
          title: `dsec's create time with ${dsec.concurrent.concurrency} in flight (mean per create; steps overlap, so shares can exceed 100%)`,
          rows: createBreakdown(spans, phaseKey('dsec', PHASE_CONCURRENT), result.ops['dsec'].concurrent, dsec.concurrent.latency.mean),
        });
      }
      body = {
        scenario: 'create',
        options: { ...opts.scenario.options, peers: opts.peers, nice: opts.nice },
        result,
        unavailable: [...unavailable, ...result.dropped],
        targets: createTargets(result),
        profile,
        notInstrumented,
      };
    } else {
      const result = await runExecScenario(peers, opts.scenario.options, ctx);
      const dsec = result.peers.find((p) => p.name === 'dsec');
      const profile: ProfileSection[] = [];
      if (dsec && result.ops['dsec']) {
        profile.push({
          title: "Where dsec's exec time goes (mean per exec)",
          rows: execBreakdown(spans, phaseKey('dsec', PHASE_EXEC), result.ops['dsec'], dsec.exec.mean),
        });
      }
      body = {
        scenario: 'exec',
        options: { ...opts.scenario.options, peers: opts.peers, nice: opts.nice },
        result,
        unavailable: [...unavailable, ...result.dropped],
        targets: execTargets(result),
        profile,
        notInstrumented,
      };
    }
  } catch (err) {
    failure = err;
  }
  say('cleaning up…');
  const errors = await cleanup.run(say);
  untrap();
  if (!body) {
    if (leaks.length || errors.length) say(`cleanup left: ${[...errors, ...leaks].join('; ')}`);
    throw failure;
  }
  const report = {
    ...body,
    startedAt,
    finishedAt: new Date().toISOString(),
    host,
    loadAverage1mAtEnd: Math.round((loadavg()[0] ?? 0) * 100) / 100,
    cleanup: { errors, leaks },
  } as BenchReport;
  const files = writeResults(opts.outDir, report);
  return { report, files };
}
