/** `dsec bench hardening`'s options and result: shared by the run (hardening.ts) and its rendering (hardening-report.ts). */
import type { LatencySummary } from '../latency.js';
import type { PeerResultBase, ScenarioResult } from '../result-types.js';

/**
 * What dsec's defences cost (issue 5): create and exec with and without them, and how long a
 * network policy switch takes. Seccomp, masked paths and the rest are measured on the raw crun
 * floor, built from dsec's own OCI config with defences stripped, because that is where their
 * cost lands (crun compiles and loads the seccomp filter, mounts the masks) and dsec adds nothing
 * to it; the network policy and Landlock are measured through dsec's API, where they are applied.
 * User namespaces (issue 10, DSEC_USERNS, the edge's default) are measured on both: raw crun with
 * the same config in a namespace dsec-idmap made, and a second in-process dsec with the opt-out
 * (`userns: false`, sandboxes as host root) beside the run's default one.
 */
export interface HardeningOptions {
  /** Timed creates and execs per arm. @default 60 */
  count: number;
  /** Rounds, arms alternating. @default 6 */
  rounds: number;
  /** Untimed creates and execs per arm first. @default 3 */
  warmup: number;
  /** Timed policy switches (none ⇄ allow, alternating). @default 100 */
  switches: number;
  /** Fresh sandboxes whose first switch away from none (adding the link) is timed. @default 10 */
  attaches: number;
}

export interface ArmResult {
  label: string;
  what: string;
  latency: LatencySummary;
  errors: string[];
}

export interface SwitchResult {
  /** PUT /network none ⇄ allow on a sandbox that has its link, as the caller waits for it. */
  put: LatencySummary;
  /** The edge's own time for the same switches (appliedMs). */
  applied: LatencySummary;
  /** The previous implementation on the same sandbox: `nsenter --net nft -f -` with the same rulesets (blocks of 10 alternating with the PUTs). */
  nsenterNft: LatencySummary;
  /** First switch away from none (veth + address + route, then the ruleset), as the caller waits. */
  firstAttach: LatencySummary;
  /** After the last switch to none, a TCP connect from inside: what it got, and how fast. */
  enforcement: string;
}

export interface HardeningResult extends ScenarioResult {
  peers: PeerResultBase[];
  create: ArmResult[];
  exec: ArmResult[];
  switch: SwitchResult;
}
