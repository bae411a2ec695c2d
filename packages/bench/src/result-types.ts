/**
 * The shapes of a saved result, shared by the scenarios (which fill them) and the report writer
 * (which saves and renders them). Types only, so neither side imports the other.
 */
import type { ProfileRow } from './breakdown.js';
import type { HostInfo } from './host-info.js';
import type { PeerName, PeerUnavailable } from './peers/peer.js';
import type { TargetCheck } from './targets.js';

/** What every peer's part of a scenario result carries, whatever else it measured. */
export interface PeerResultBase {
  name: PeerName;
  /** What exactly is timed for this peer. */
  description: string;
  version: string;
  errors: string[];
}

export interface ScenarioResult {
  peers: PeerResultBase[];
  /** Peers that stopped working during the run, or for which the scenario does not apply, with why. */
  dropped: PeerUnavailable[];
}

export interface ProfileSection {
  title: string;
  rows: ProfileRow[];
}

interface ReportBase {
  startedAt: string;
  finishedAt: string;
  host: HostInfo;
  /** 1-minute load average when the run ended (see host.loadAverage1m for the start). */
  loadAverage1mAtEnd: number;
  options: Record<string, unknown>;
  /** Asked-for peers that could not run or stopped working, with why. */
  unavailable: PeerUnavailable[];
  targets: TargetCheck[];
  profile: ProfileSection[];
  /** Server steps the profiler could not find in this build of dsec. */
  notInstrumented: string[];
  cleanup: { errors: string[]; leaks: string[] };
}

/** One scenario's saved result: `scenario` names its entry in scenarios/index.ts. */
export type BenchReport<R extends ScenarioResult = ScenarioResult> = ReportBase & { scenario: string; result: R };

/** A scenario's rendering: markdown that links its chart by `svgName`, and the chart. */
export type RenderReport = (report: BenchReport, svgName: string) => { markdown: string; svg: string };
