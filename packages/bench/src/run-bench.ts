import { randomBytes } from 'node:crypto';
import { mkdirSync } from 'node:fs';
import { loadavg, setPriority } from 'node:os';
import { fixDataDirFs } from 'dsec/host';
import { Cleanup, trapSignals } from './cleanup.js';
import { startFixture } from './fixture.js';
import { dsecVersion, hostInfo } from './host-info.js';
import type { Peer, PeerName, PeerUnavailable } from './peers/peer.js';
import { notInstalledReason, setupPeers } from './peers/setup.js';
import { instrumentDsec, Spans } from './profile.js';
import { writeAllSummary, type AllSummary } from './report-all.js';
import { writeResults, type WrittenFiles } from './report.js';
import { type BenchReport } from './result-types.js';
import { runNames } from './run-names.js';
import type { BenchScenarioDef, ScenarioContext } from './scenarios/scenario.js';
import { findBenchLeaks, sweep } from './sweep.js';

/** A scenario to run and its compiled options. */
export interface ScenarioRun {
  def: BenchScenarioDef;
  options: object;
}

export interface BenchRunOptions {
  /** One scenario, or every one (`dsec bench all`: `combined` is then written too). */
  scenarios: ScenarioRun[];
  combined: boolean;
  peers: PeerName[];
  outDir: string;
  commandLine: string;
  /** Nice value for this process and everything it starts (all peers alike); 0 leaves it as is. */
  nice: number;
  say: (m: string) => void;
  /** Called as each scenario starts: its index (0-based), their number, its name (for a progress bar). */
  onScenario?: (index: number, total: number, name: string) => void;
}

export interface BenchOutcome {
  reports: { report: BenchReport; files: WrittenFiles }[];
  /** Scenarios that failed outright (the others still ran), with why. */
  failed: { scenario: string; error: string }[];
  /** `dsec bench all`'s combined summary. */
  all?: { summary: AllSummary; files: { json: string; markdown: string; latest: string } };
}

type ReportBody = Omit<BenchReport, 'host' | 'cleanup'>;

/**
 * One benchmark run: a temp dir, an in-process dsec, the peers, the scenarios one after the
 * other on the same peers, the result files. Everything it makes is undone on the way out, also
 * on failure and Ctrl-C; each report says what (if anything) could not be.
 */
export async function runBench(opts: BenchRunOptions): Promise<BenchOutcome> {
  const { say } = opts;
  if (process.getuid?.() !== 0) throw new Error('dsec bench needs root (mounts, namespaces, cgroups, apt-get)');
  // Before anything is set up: a run the host cannot hold is refused with what does not fit.
  for (const s of opts.scenarios) s.def.preflight?.(s.options, opts.peers);
  // Lower than others' nice value, the whole run (server, crun, podman, dockerd) is perturbed less by other
  // jobs on a shared host; every peer inherits it, so the comparison stays even.
  if (opts.nice !== 0) setPriority(opts.nice);
  const startedAt = new Date().toISOString();
  const host = await hostInfo(opts.commandLine);
  const names = runNames();
  const { dir } = names;
  mkdirSync(dir);
  // In a container (/var/tmp on overlayfs) the run's dir gets doctor's disk (a loop-mounted ext4
  // image, or a tmpfs): the peers' overlay uppers and EROFS blobs go there, and overlayfs takes
  // neither. The sweep unmounts it and removes the image.
  fixDataDirFs(dir);
  const cleanup = new Cleanup();
  const leaks: string[] = [];
  cleanup.add(`remove ${dir}`, () => sweep(names));
  cleanup.add('check for leftovers', async () => void leaks.push(...(await findBenchLeaks(names))));
  const abort = new AbortController();
  const untrap = trapSignals(abort, cleanup, say);
  const spans = new Spans();
  const bodies: ReportBody[] = [];
  const failed: BenchOutcome['failed'] = [];
  let failure: unknown;
  try {
    say(`temp dir ${dir}; starting dsec in this process…`);
    const maxSandboxes = Math.max(4000, ...opts.scenarios.map((s) => s.def.maxSandboxes(s.options) * 2));
    const fixture = await startFixture(names, maxSandboxes, cleanup, say);
    const notInstrumented = instrumentDsec(fixture.dsec, spans);
    // What a scenario runs wherever it is installed joins the asked-for peers; what is not installed is reported.
    const peerNames = [...opts.peers];
    const notInstalled: PeerUnavailable[] = [];
    for (const name of new Set(opts.scenarios.flatMap((s) => s.def.installedPeers ?? []))) {
      if (peerNames.includes(name)) continue;
      const reason = await notInstalledReason(name);
      if (reason) notInstalled.push({ name, reason });
      else peerNames.push(name);
    }
    const { peers, unavailable } = await setupPeers(peerNames, fixture, {
      cleanup,
      say,
      spans,
      dsecVersion: await dsecVersion(),
      runLabel: `bench-${randomBytes(3).toString('hex')}`,
    });
    if (!peers.some((p) => p.name === 'dsec'))
      throw new Error(`dsec itself could not run: ${unavailable.find((u) => u.name === 'dsec')?.reason}`);
    say(
      `peers: ${peers.map((p) => p.name).join(', ')}${unavailable.length || notInstalled.length ? `; not running: ${[...unavailable, ...notInstalled].map((u) => u.name).join(', ')}` : ''}`,
    );
    const ctx: ScenarioContext = { signal: abort.signal, names, spans, say, fixture };
    for (const [i, s] of opts.scenarios.entries()) {
      abort.signal.throwIfAborted();
      opts.onScenario?.(i, opts.scenarios.length, s.def.name);
      if (opts.scenarios.length > 1) say(`\n== ${s.def.name} ==`);
      // A scenario sees the peers asked for and those it runs wherever installed, no others.
      const own = (name: PeerName): boolean => name === 'dsec' || opts.peers.includes(name) || (s.def.installedPeers ?? []).includes(name);
      const ownUnavailable = [...unavailable, ...notInstalled].filter((u) => own(u.name));
      try {
        bodies.push(
          await runScenario(
            s,
            peers.filter((p) => own(p.name)),
            ownUnavailable,
            notInstrumented,
            { ...ctx, unavailable: ownUnavailable },
            opts,
          ),
        );
      } catch (err) {
        // In `all`, one scenario failing does not lose the others; alone, it is the run's failure.
        if (abort.signal.aborted || opts.scenarios.length === 1) throw err;
        failed.push({ scenario: s.def.name, error: (err as Error).message });
        say(`${s.def.name} failed: ${(err as Error).message}`);
      }
    }
  } catch (err) {
    failure = err;
  }
  say('cleaning up…');
  const errors = await cleanup.run(say);
  untrap();
  if (bodies.length === 0) {
    if (leaks.length || errors.length) say(`cleanup left: ${[...errors, ...leaks].join('; ')}`);
    throw failure;
  }
  if (failure) failed.push({ scenario: 'run', error: (failure as Error).message });
  const reports = bodies.map((body) => {
    const def = opts.scenarios.find((s) => s.def.name === body.scenario)!.def;
    const report = { ...body, host, cleanup: { errors, leaks } } as BenchReport;
    return { report, files: writeResults(opts.outDir, report, (r, svg) => def.render(r, svg)) };
  });
  const outcome: BenchOutcome = { reports, failed };
  if (opts.combined)
    outcome.all = writeAllSummary(opts.outDir, {
      startedAt,
      host,
      peers: opts.peers,
      nice: opts.nice,
      reports,
      failed,
      defs: opts.scenarios.map((s) => s.def),
    });
  return outcome;
}

async function runScenario(
  s: ScenarioRun,
  peers: Peer[],
  unavailable: PeerUnavailable[],
  notInstrumented: string[],
  ctx: ScenarioContext,
  opts: BenchRunOptions,
): Promise<ReportBody> {
  const startedAt = new Date().toISOString();
  const result = await s.def.run(peers, s.options, ctx);
  return {
    scenario: s.def.name,
    startedAt,
    finishedAt: new Date().toISOString(),
    loadAverage1mAtEnd: Math.round((loadavg()[0] ?? 0) * 100) / 100,
    options: { ...s.options, peers: opts.peers, nice: opts.nice },
    result,
    unavailable: [...unavailable, ...result.dropped],
    targets: s.def.targets(result),
    profile: s.def.profile?.(result, ctx.spans) ?? [],
    notInstrumented,
  };
}
