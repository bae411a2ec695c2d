import { summarizeLatency } from '../latency.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import { CrunRawPeer } from '../peers/crun-raw.js';
import { ExecFloorPeer } from '../peers/exec-floor.js';
import { phaseKey, type Spans } from '../profile.js';
import type { ProfileSection } from '../result-types.js';
import { execBreakdown } from '../breakdown.js';
import { execTargets, renderExecReport } from './exec-report.js';
import { msOf, oneSandboxRounds } from './one-sandbox-rounds.js';
import { valuesOf, type BenchScenarioDef, type ScenarioContext } from './scenario.js';
import { PHASE_EXEC, type ExecScenarioOptions, type ExecScenarioResult } from './exec-result.js';

/**
 * `true` run to completion in one idle sandbox per peer, one at a time, peers alternating; with
 * raw crun, the kernel's floor too (setns + fork + exec on a raw crun container: exec-floor.ts).
 */
export async function runExecScenario(peers: Peer[], opts: ExecScenarioOptions, ctx: ScenarioContext): Promise<ExecScenarioResult> {
  const withFloor = [...peers];
  const noFloor: PeerUnavailable[] = [];
  const crun = peers.find((p): p is CrunRawPeer => p instanceof CrunRawPeer);
  if (crun) {
    try {
      withFloor.push(await ExecFloorPeer.build(crun, ctx.names.dir));
    } catch (err) {
      noFloor.push({ name: 'floor', reason: (err as Error).message });
    }
  }
  const { states, dropped } = await oneSandboxRounds(
    withFloor,
    ['exec'],
    { ...opts, phase: PHASE_EXEC, what: 'exec' },
    ctx,
    async (peer, id) => ({
      exec: await msOf(() => peer.exec(id)),
    }),
  );
  return {
    peers: states.map((s) => ({
      name: s.peer.name,
      description: s.peer.execDescription,
      version: s.peer.version,
      exec: summarizeLatency(s.timings.exec),
      errors: s.errors,
    })),
    dropped: [...noFloor, ...dropped],
    ops: Object.fromEntries(states.map((s) => [s.peer.name, s.timings.exec.length])),
  };
}

function execProfile(result: ExecScenarioResult, spans: Spans): ProfileSection[] {
  const dsec = result.peers.find((p) => p.name === 'dsec');
  const ops = result.ops['dsec'];
  if (!dsec || !ops) return [];
  return [
    { title: "Where dsec's exec time goes (mean per exec)", rows: execBreakdown(spans, phaseKey('dsec', PHASE_EXEC), ops, dsec.exec.mean) },
  ];
}

export const execScenario: BenchScenarioDef<ExecScenarioOptions, ExecScenarioResult> = {
  name: 'exec',
  summary: 'exec round trip (`true`) through the API vs raw `crun exec`, the kernel floor (setns + fork + exec) and podman/docker exec',
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'execs per peer', default: 200, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'alternating rounds', default: 10, min: 1 },
    { key: 'warmup', long: 'warmup', description: 'untimed execs per peer first', default: 10, min: 0 },
  ],
  maxSandboxes: () => 8,
  run: runExecScenario,
  profile: execProfile,
  targets: execTargets,
  render: renderExecReport,
  lines: (r) => r.peers.map((p) => `${p.name.padEnd(7)} exec p50 ${p.exec.p50} ms  p99 ${p.exec.p99} ms`),
  headline: (r) => [{ metric: 'exec `true` p50 (ms)', better: 'lower', values: valuesOf(r.peers, (p) => p.exec.p50) }],
};
