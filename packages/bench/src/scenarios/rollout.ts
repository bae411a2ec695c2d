import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureE2bBaseImage } from 'dsec/runtime';
import { BENCH_IMAGE } from '../fixture.js';
import { summarizeLatency } from '../latency.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer } from '../peers/peer.js';
import { BENCH_LIMITS } from '../peers/setup.js';
import type { PeerResultBase } from '../result-types.js';
import { batchSizes, roundOrder } from '../rounds.js';
import { percentile, round } from '../stats.js';
import { E2bSdkClient, ExecPeerClient, TsSdkClient, type RolloutClient, type RolloutClientName } from './rollout-clients.js';
import { PythonSdkClient } from './rollout-python.js';
import { rolloutLines, rolloutTargets, renderRollout } from './rollout-report.js';
import type { RolloutOptions, RolloutResult, RolloutRun } from './rollout-result.js';
import { stepPlan, stepProblem, TEST_RUN_INDEX, type LoopsOutcome, type StepOutcome, type StepPlan } from './rollout-step.js';
import type { BenchScenarioDef, HeadlineMetric, ScenarioContext } from './scenario.js';

/** Wrong answers and failures kept verbatim per run. */
const MAX_PROBLEMS = 4;

/** The e2b package's version, from its package.json (its exports map does not expose it). */
function e2bVersion(): string {
  try {
    let dir = dirname(fileURLToPath(import.meta.resolve('e2b')));
    while (dir !== dirname(dir)) {
      const pkg = join(dir, 'package.json');
      if (existsSync(pkg)) {
        const { name, version } = JSON.parse(readFileSync(pkg, 'utf8')) as { name?: string; version?: string };
        if (name === 'e2b') return `e2b ${version}`;
      }
      dir = dirname(dir);
    }
  } catch {
    // not resolvable: the name alone
  }
  return 'e2b';
}

/** An E2B key on the run's server (`POST /v1/e2b/keys`), for E2B's SDK. */
async function mintE2bKey(conn: { url: string; apiKey: string }): Promise<string> {
  const res = await fetch(`${conn.url}/v1/e2b/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${conn.apiKey}`, 'content-type': 'application/json' },
    body: '{}',
  });
  if (res.status !== 200 && res.status !== 201) throw new Error(`POST /v1/e2b/keys answered ${res.status}: ${await res.text()}`);
  return ((await res.json()) as { key: string }).key;
}

/** Steps `from`…`from + count − 1` of each of `sandboxes` sandboxes for `client`. */
function plansFor(client: RolloutClient, sandboxes: number, from: number, count: number): StepPlan[][] {
  return Array.from({ length: sandboxes }, (_, i) => Array.from({ length: count }, (_, k) => stepPlan(client.name, i, from + k)));
}

/** What a client's timed runs at one size add up to. */
class RunTally {
  wallMs = 0;
  /** Undefined once a run did not report it (a client in the bench's own process). */
  cpuMs: number | undefined = 0;
  readonly done: { plan: StepPlan; outcome: StepOutcome }[] = [];
  failed = 0;
  readonly problems: string[] = [];

  add(plans: StepPlan[][], o: LoopsOutcome): void {
    this.wallMs += o.wallMs;
    this.cpuMs = this.cpuMs !== undefined && o.clientCpuMs !== undefined ? this.cpuMs + o.clientCpuMs : undefined;
    plans.forEach((steps, i) =>
      steps.forEach((plan, k) => {
        const outcome = o.outcomes[i]?.[k];
        if (!outcome || 'error' in outcome) {
          this.failed++;
          this.#problem(`sandbox ${i}: ${outcome ? outcome.error : 'no outcome'}`);
        } else this.done.push({ plan, outcome });
      }),
    );
  }

  #problem(p: string): void {
    if (this.problems.length < MAX_PROBLEMS) this.problems.push(p);
  }

  summary(client: RolloutClient, sandboxes: number, stepsPerSandbox: number): RolloutRun {
    let wrong = 0;
    for (const { plan, outcome } of this.done) {
      const p = stepProblem(plan, outcome);
      if (p) {
        wrong++;
        this.#problem(`${plan.writePath}: ${p}`);
      }
    }
    const p50 = (xs: number[]): number => round(percentile(xs, 50), 2);
    const outs = this.done.map((d) => d.outcome);
    const seconds = this.wallMs / 1000;
    return {
      client: client.name,
      sandboxes,
      stepsPerSandbox,
      steps: outs.length,
      verified: outs.length - wrong,
      wrong,
      failed: this.failed,
      seconds: round(seconds, 2),
      stepsPerSecond: seconds > 0 ? round(outs.length / seconds, 1) : NaN,
      clientCpuMsPerStep: this.cpuMs !== undefined && outs.length ? round(this.cpuMs / outs.length, 2) : null,
      step: summarizeLatency(outs.map((o) => o.ms)),
      partsP50: {
        write: p50(outs.map((o) => o.writeMs)),
        command: p50(outs.flatMap((o) => o.commandMs.filter((_, i) => i !== TEST_RUN_INDEX))),
        testRun: p50(outs.map((o) => o.commandMs[TEST_RUN_INDEX] ?? NaN)),
        read: p50(outs.map((o) => o.readMs)),
      },
      problems: this.problems,
    };
  }
}

/**
 * N sandboxes per client, each running the agent step loop, every sandbox at once; for each N of
 * `--sandboxes`, the clients in alternating rounds on sandboxes of their own (the Python SDK on
 * the TS SDK's: both are dsec's API). Sandboxes are made before and removed after the timed runs.
 */
export async function runRollout(peers: Peer[], opts: RolloutOptions, ctx: ScenarioContext): Promise<RolloutResult> {
  const dsec = peers.find((p): p is DsecApiPeer => p instanceof DsecApiPeer);
  if (!dsec || !ctx.fixture) throw new Error("the rollout scenario needs the dsec peer and the run's in-process dsec");
  const { say } = ctx;
  const skipped: RolloutResult['skipped'] = [];
  const ts = new TsSdkClient(dsec.conn, BENCH_IMAGE, BENCH_LIMITS, { bench: 'rollout' }, dsec.version);
  const clients: RolloutClient[] = [ts];
  const noPython = PythonSdkClient.unavailableReason();
  if (noPython) skipped.push({ client: 'python-sdk', reason: noPython });
  else clients.push(new PythonSdkClient(dsec.conn, () => ts.sandboxes.map((s) => s.id), BENCH_IMAGE));
  try {
    try {
      import.meta.resolve('e2b');
    } catch (err) {
      throw new Error(
        `the e2b package is not installed (a dev dependency of @dsec/bench: npm ci without --omit=dev): ${(err as Error).message}`,
      );
    }
    say("E2B's base template (bash, for E2B's SDK): from the host's cache, or built with debootstrap (about a minute)…");
    await ensureE2bBaseImage(ctx.fixture.dsec.images, { progress: (m) => say(`  ${m}`) }).catch((err: Error) => {
      throw new Error(`E2B's base template could not be had: ${err.message}`);
    });
    clients.push(new E2bSdkClient({ url: dsec.conn.url, e2bKey: await mintE2bKey(dsec.conn) }, e2bVersion()));
    clients.push(new TsSdkClient(dsec.conn, 'base', BENCH_LIMITS, { bench: 'rollout' }, dsec.version, true));
  } catch (err) {
    skipped.push({ client: 'e2b-sdk', reason: (err as Error).message });
    skipped.push({ client: 'ts-sdk bash -l', reason: `its attribution is e2b-sdk's, which cannot run: ${(err as Error).message}` });
  }
  for (const p of peers) if (p.name !== 'dsec') clients.push(new ExecPeerClient(p));
  // A runtime that could not run is a client that did not (the report's common part lists it too).
  for (const u of ctx.unavailable ?? [])
    if (u.name !== 'dsec') skipped.push({ client: `${u.name} exec` as RolloutClientName, reason: u.reason });

  const runs: RolloutRun[] = [];
  for (const n of opts.sandboxes) {
    const perSandbox = Math.max(opts.steps, Math.ceil(opts.minSteps / n));
    const live: RolloutClient[] = [];
    try {
      for (const c of clients) {
        ctx.signal.throwIfAborted();
        if (c instanceof PythonSdkClient && !live.includes(ts)) {
          skipped.push({ client: c.name, sandboxes: n, reason: "it drives the ts-sdk's sandboxes, which could not be made" });
          continue;
        }
        say(`${n} sandbox${n === 1 ? '' : 'es'}: ${c.name} opening…`);
        try {
          await c.open(n);
          live.push(c);
        } catch (err) {
          skipped.push({ client: c.name, sandboxes: n, reason: `could not make or reach its sandboxes: ${(err as Error).message}` });
          await c.close().catch(() => undefined);
        }
      }
      for (const c of live) await c.run(plansFor(c, n, 0, 1)); // warm-up: connections, caches, the first exec
      const tallies = new Map(live.map((c) => [c, new RunTally()]));
      let next = 1;
      const batches = batchSizes(perSandbox, opts.rounds);
      for (const [r, count] of batches.entries()) {
        for (const c of roundOrder(live, r)) {
          ctx.signal.throwIfAborted();
          const plans = plansFor(c, n, next, count);
          tallies.get(c)!.add(plans, await c.run(plans));
        }
        next += count;
        say(`  ${n} sandboxes: round ${r + 1}/${batches.length} done`);
      }
      for (const c of live) {
        const run = tallies.get(c)!.summary(c, n, perSandbox);
        runs.push(run);
        say(`  ${c.name}: ${run.stepsPerSecond} steps/s, step p50 ${run.step.p50} ms, verified ${run.verified}/${run.steps}`);
      }
    } finally {
      for (const c of [...live].reverse()) await c.close().catch(() => undefined);
    }
  }

  const info = clients.map((c) => ({ client: c.name, description: c.description, version: c.version, image: c.image }));
  const dsecClients = info.filter((c) => !c.client.endsWith(' exec'));
  const peerResults: PeerResultBase[] = [
    { name: 'dsec', description: dsecClients.map((c) => `${c.client}: ${c.description}`).join('; '), version: dsec.version, errors: [] },
    ...peers
      .filter((p) => p.name !== 'dsec')
      .map((p) => ({
        name: p.name,
        description: info.find((c) => c.client === `${p.name} exec`)!.description,
        version: p.version,
        errors: [],
      })),
  ];
  return { peers: peerResults, dropped: [], clients: info, runs, skipped };
}

export const rolloutScenario: BenchScenarioDef<RolloutOptions, RolloutResult> = {
  name: 'rollout',
  summary:
    'RL rollout: N sandboxes each running agent steps (write, 10 commands with a test run, read) through the TS SDK, the Python SDK, E2B’s SDK, raw crun exec and docker/podman exec; steps/s and step p50/p99',
  flags: [
    {
      key: 'sandboxes',
      long: 'sandboxes',
      description: 'sandboxes per client, one run each (e.g. 1,32)',
      default: [1, 32, 256],
      min: 1,
      list: true,
    },
    { key: 'steps', long: 'steps', description: 'timed steps each sandbox runs, at least', default: 3, min: 1 },
    { key: 'minSteps', long: 'min-steps', description: 'timed steps per client and size, at least', default: 64, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'rounds per size, clients alternating', default: 2, min: 1 },
  ],
  installedPeers: ['docker', 'podman'],
  // The TS SDK's (busybox and base) and E2B's sandboxes are dsec's; raw crun, docker and podman make their own.
  maxSandboxes: (o) => 3 * Math.max(...o.sandboxes) + 8,
  run: runRollout,
  targets: rolloutTargets,
  render: renderRollout,
  lines: rolloutLines,
  headline: (r) =>
    [...new Set(r.runs.map((x) => x.sandboxes))].map((n) => {
      const clients = { dsec: 'ts-sdk', crun: 'crun exec', docker: 'docker exec', podman: 'podman exec' } as const;
      const values: HeadlineMetric['values'] = {};
      for (const [peer, client] of Object.entries(clients) as [keyof typeof clients, string][]) {
        const run = r.runs.find((x) => x.sandboxes === n && x.client === client);
        if (run) values[peer] = run.stepsPerSecond;
      }
      return { metric: `rollout steps/s at ${n} sandboxes (dsec: TS SDK)`, better: 'higher' as const, values };
    }),
};
