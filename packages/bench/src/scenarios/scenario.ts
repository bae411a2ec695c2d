import type { BenchFixture } from '../fixture.js';
import type { Peer, PeerName, PeerUnavailable } from '../peers/peer.js';
import type { Spans } from '../profile.js';
import type { RunNames } from '../run-names.js';
import type { BenchReport, PeerResultBase, ProfileSection, ScenarioResult } from '../result-types.js';
import type { TargetCheck } from '../targets.js';

export interface ScenarioContext {
  signal: AbortSignal;
  /** The run's names: its temp dir (everything a scenario makes on disk goes under it) and ids. */
  names: RunNames;
  spans: Spans;
  say: (m: string) => void;
  /** Peers asked for (or run wherever installed) that could not run, with why: set per scenario. */
  unavailable?: PeerUnavailable[];
  /** The run's in-process dsec and temp dir (the lazy scenario builds its image there and starts cold edges beside it). */
  fixture?: BenchFixture;
}

/** One integer option of a scenario (or a list of them): its CLI flag, its default, the key of the options it sets. */
export interface ScenarioFlag {
  key: string;
  /** Long flag name without dashes, e.g. `count`; `short` is a one-letter alias. */
  long: string;
  short?: string;
  description: string;
  /** A list for a `list` flag, a string for a `text` flag. */
  default: number | readonly number[] | string;
  /** The least value (of each, for a list; unused for text). */
  min: number;
  /** A comma-separated list of integers, e.g. `--sandboxes 1,32`. */
  list?: boolean;
  /** A string taken as given, e.g. `--store postgres://…`. */
  text?: boolean;
}

/** One headline figure of a scenario for `dsec bench all`'s combined table: a value per peer. */
export interface HeadlineMetric {
  metric: string;
  better: 'lower' | 'higher';
  values: Partial<Record<PeerName, number>>;
}

/**
 * A benchmark scenario, whole: its options, its run, what it judges and how it renders. Adding a
 * scenario is a module exporting one of these and a line in scenarios/index.ts; the CLI, `all`,
 * the result files and `render` pick it up from there.
 *
 * Members are methods (bivariant), so a scenario with its own option and result types fits the
 * registry's `BenchScenarioDef` without casts at the call sites.
 */
export interface BenchScenarioDef<O extends object = object, R extends ScenarioResult = ScenarioResult> {
  readonly name: string;
  /** One line for `dsec bench --help`. */
  readonly summary: string;
  readonly flags: readonly ScenarioFlag[];
  /**
   * Peers this scenario runs beside dsec wherever the host has them installed, whether `--peers`
   * names them or not; they are never installed for it (one that is not is reported with why).
   */
  readonly installedPeers?: readonly PeerName[];
  /** Sandboxes the in-process dsec must admit at once. */
  maxSandboxes(opts: O): number;
  /** Throws, with what does not fit, when the host cannot hold the run (before anything is set up). */
  preflight?(opts: O, peers: PeerName[]): void;
  run(peers: Peer[], opts: O, ctx: ScenarioContext): Promise<R>;
  /** Where dsec's time goes, from the in-process server's spans. */
  profile?(result: R, spans: Spans): ProfileSection[];
  targets(result: R): TargetCheck[];
  render(report: BenchReport<R>, svgName: string): { markdown: string; svg: string };
  /** A few lines for the terminal, one per peer. */
  lines(result: R): string[];
  headline(result: R): HeadlineMetric[];
}

/** Options from flags, each at its default unless given. */
export function defaultOptions<O extends object>(
  def: BenchScenarioDef<O, ScenarioResult>,
  given: Partial<Record<string, number | readonly number[] | string>> = {},
): O {
  return Object.fromEntries(def.flags.map((f) => [f.key, given[f.key] ?? f.default])) as O;
}

/** `{ dsec: 12, crun: 10 }` from the peers of a result. */
export function valuesOf<P extends PeerResultBase>(peers: P[], get: (p: P) => number): Partial<Record<PeerName, number>> {
  return Object.fromEntries(peers.map((p) => [p.name, get(p)]));
}
