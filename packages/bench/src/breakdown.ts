import { round } from './stats.js';
import { STEPS, type Spans } from './profile.js';

/** One line of a time breakdown: mean ms per operation, nested by depth. */
export interface ProfileRow {
  step: string;
  depth: number;
  msPerOp: number;
  /** Share of the whole operation as the caller saw it, in %. */
  percent: number;
}

function rowsFrom(parts: [string, number, number | undefined][], whole: number): ProfileRow[] {
  return parts
    .filter((p): p is [string, number, number] => p[2] !== undefined)
    .map(([step, depth, ms]) => ({ step, depth, msPerOp: round(ms, 2), percent: round((100 * ms) / whole, 1) }));
}

/** The control plane's SQLite steps that ran in `phase` (per op), as rows at `depth`. */
function sqliteRows(spans: Spans, phase: string, ops: number, depth: number): [string, number, number][] {
  const t = spans.totals(phase);
  return [STEPS.sqliteWrite, STEPS.sqliteRead, STEPS.trajectory]
    .filter((step) => (t.get(step)?.calls ?? 0) > 0)
    .map((step) => [step, depth, (t.get(step)?.ms ?? 0) / ops]);
}

const CLIENT_SIDE = 'client side: SDK, fetch (undici), loopback TCP, event-loop waits';
const FASTIFY = 'Fastify: routing, body parse + schema validation, reply serialization';

/**
 * Where one dsec create goes, as means per create over a phase: the SDK's round trip split into
 * HTTP (client, Fastify, JSON, auth), the control plane (SQLite, image lookup) and the edge
 * (crun run -d, crun state, state.json, and what is left: mkdir, overlay mount, config.json).
 */
export function createBreakdown(spans: Spans, phase: string, ops: number, clientMeanMs: number): ProfileRow[] {
  const t = spans.totals(phase);
  const per = (step: string): number => (t.get(step)?.ms ?? 0) / ops;
  const server = per(STEPS.serverHttp);
  const control = per(STEPS.controlCreate);
  const auth = per(STEPS.sqliteAuth);
  const edge = per(STEPS.edgeCreate);
  const image = per(STEPS.imageLookup);
  const db = sqliteRows(spans, phase, ops, 3);
  const dbTotal = db.reduce((a, r) => a + r[2], 0);
  const run = per(STEPS.crunRun);
  // Newer edges take the pid from --pid-file and call no `crun state`: the row is then left out.
  const state = per(STEPS.crunState);
  const stateCalled = (t.get(STEPS.crunState)?.calls ?? 0) > 0;
  const records = per(STEPS.stateWrite);
  const acquire = per(STEPS.layerAcquire);
  return rowsFrom(
    [
      ['SDK round trip (what the caller waits)', 0, clientMeanMs],
      [CLIENT_SIDE, 1, clientMeanMs - server],
      [STEPS.serverHttp, 1, server],
      [FASTIFY, 2, server - control - auth],
      [STEPS.sqliteAuth, 2, auth],
      [STEPS.controlCreate, 2, control],
      ...db,
      [STEPS.imageLookup, 3, image],
      ['control plane, other (placement, ids)', 3, control - dbTotal - image - edge],
      [STEPS.edgeCreate, 3, edge],
      [STEPS.crunRun, 4, run],
      [STEPS.crunState, 4, stateCalled ? state : undefined],
      [STEPS.stateWrite, 4, records],
      [STEPS.layerAcquire, 4, acquire],
      ['mkdir x3 + overlay mount + config.json write', 4, edge - run - state - records - acquire],
    ],
    clientMeanMs,
  );
}

/**
 * Where one dsec API call goes: HTTP (client, Fastify, auth), the control plane (SQLite, other)
 * and the edge step, split further into `edgeParts` (steps timed inside it) and `edgeRest`.
 */
function apiCallBreakdown(
  spans: Spans,
  phase: string,
  ops: number,
  clientMeanMs: number,
  steps: { control: string; edge: string; edgeParts?: string[]; edgeRest?: string },
): ProfileRow[] {
  const t = spans.totals(phase);
  const per = (step: string): number => (t.get(step)?.ms ?? 0) / ops;
  const server = per(STEPS.serverHttp);
  const control = per(steps.control);
  const auth = per(STEPS.sqliteAuth);
  const edge = per(steps.edge);
  const db = sqliteRows(spans, phase, ops, 3);
  const dbTotal = db.reduce((a, r) => a + r[2], 0);
  const parts: [string, number, number][] = (steps.edgeParts ?? []).map((s) => [s, 4, per(s)]);
  const rest: [string, number, number][] = steps.edgeRest ? [[steps.edgeRest, 4, edge - parts.reduce((a, p) => a + p[2], 0)]] : [];
  return rowsFrom(
    [
      ['SDK round trip (what the caller waits)', 0, clientMeanMs],
      [CLIENT_SIDE, 1, clientMeanMs - server],
      [STEPS.serverHttp, 1, server],
      [FASTIFY, 2, server - control - auth],
      [STEPS.sqliteAuth, 2, auth],
      [steps.control, 2, control],
      ...db,
      [steps.edge, 3, edge],
      ...parts,
      ...rest,
      ['control plane, other', 3, control - dbTotal - edge],
    ],
    clientMeanMs,
  );
}

/**
 * Where one dsec exec goes: HTTP, the control plane (its lookup, the trajectory entry), the edge:
 * dsec-spawn's enter request (the command's whole start, run and exit) and the edge's own work
 * around it (the spec, the command's cgroup, its memory and OOM figures, the pipes' output).
 */
export function execBreakdown(spans: Spans, phase: string, ops: number, clientMeanMs: number): ProfileRow[] {
  return apiCallBreakdown(spans, phase, ops, clientMeanMs, {
    control: STEPS.controlExec,
    edge: STEPS.edgeExec,
    edgeParts: [STEPS.spawnEnter],
    edgeRest: "the edge's own work: spec, command cgroup, memory and OOM figures, output",
  });
}

/** Where one dsec pause + resume pair goes: HTTP twice, SQLite status writes, the edge's freezer and state.json. */
export function pauseBreakdown(spans: Spans, phase: string, ops: number, clientMeanMs: number): ProfileRow[] {
  return apiCallBreakdown(spans, phase, ops, clientMeanMs, {
    control: STEPS.controlPause,
    edge: STEPS.edgePause,
    edgeParts: [STEPS.stateWrite],
    edgeRest: 'cgroup freezer: write FROZEN / THAWED, wait until it holds',
  });
}

/** The floor's own split: the same steps dsec's edge takes, with nothing around them. */
export function floorBreakdown(spans: Spans, phase: string, ops: number, clientMeanMs: number): ProfileRow[] {
  const t = spans.totals(phase);
  const per = (step: string): number => (t.get(step)?.ms ?? 0) / ops;
  const overlay = per(STEPS.rawOverlay);
  const config = per(STEPS.rawConfig);
  const run = per(STEPS.rawCrunRun);
  return rowsFrom(
    [
      ['raw create (what the benchmark waits)', 0, clientMeanMs],
      [STEPS.rawOverlay, 1, overlay],
      [STEPS.rawConfig, 1, config],
      [STEPS.rawCrunRun, 1, run],
      ['other (bookkeeping)', 1, clientMeanMs - overlay - config - run],
    ],
    clientMeanMs,
  );
}
