import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { RunningDsec } from 'dsec/runtime';

/**
 * Time spent in named steps of the in-process server, grouped by the phase the benchmark is in
 * ("sequential create", "exec" …). Only the phase's own operations run while it is set, so
 * dividing a step's total by the number of operations gives its share of one operation.
 */
export class Spans {
  phase: string | undefined;
  readonly #byPhase = new Map<string, Map<string, number[]>>();

  record(step: string, ms: number): void {
    if (this.phase === undefined) return;
    let steps = this.#byPhase.get(this.phase);
    if (!steps) this.#byPhase.set(this.phase, (steps = new Map()));
    let list = steps.get(step);
    if (!list) steps.set(step, (list = []));
    list.push(ms);
  }

  /** Total ms of each step in `phase`, and how many times it ran. */
  totals(phase: string): Map<string, { ms: number; calls: number }> {
    const out = new Map<string, { ms: number; calls: number }>();
    for (const [step, list] of this.#byPhase.get(phase) ?? []) out.set(step, { ms: list.reduce((a, b) => a + b, 0), calls: list.length });
    return out;
  }
}

/** The phase name under which one peer's operations in a scenario phase are recorded. */
export function phaseKey(peer: string, phase: string): string {
  return `${peer}: ${phase}`;
}

/**
 * Wraps `obj[key]` (sync or async) so each call's duration is recorded as `step`. The wrapper is
 * an own property of that one instance: nothing else in the process changes.
 */
export function timeMethod(obj: object, key: string, step: string, spans: Spans): boolean {
  const target = obj as Record<string, unknown>;
  const original = target[key];
  // The server's code moves on; a step that no longer exists is left out of the profile, not fatal.
  if (typeof original !== 'function') return false;
  target[key] = function (this: unknown, ...args: unknown[]): unknown {
    const started = performance.now();
    const done = (): void => spans.record(step, performance.now() - started);
    let result: unknown;
    try {
      result = (original as (...a: unknown[]) => unknown).apply(obj, args);
    } catch (err) {
      done();
      throw err;
    }
    if (result instanceof Promise) return result.finally(done);
    done();
    return result;
  };
  return true;
}

/**
 * Wraps `obj[key]`, a call that returns a child process (dsec-spawn's enter), so each call is
 * recorded as `step` from the call until the child's 'close': its exit, and its pipes drained.
 */
function timeUntilClose(obj: object | undefined, key: string, step: string, spans: Spans): boolean {
  const target = obj as Record<string, unknown> | undefined;
  const original = target?.[key];
  if (!target || typeof original !== 'function') return false;
  target[key] = function (this: unknown, ...args: unknown[]): unknown {
    let started = performance.now();
    const child = (original as (...a: unknown[]) => unknown).apply(obj, args) as {
      once?: (ev: string, f: () => void) => void;
      stdio?: ({ end?: (...a: unknown[]) => unknown } | null)[];
    };
    // An exec's process made ahead (`--standby`, exec-standby.ts) waits for its command: its
    // time counts from when the command is sent on its last pipe, not from when it was made.
    const specPipe = Array.isArray(args[0]) && args[0].includes('--standby') ? child.stdio?.[child.stdio.length - 1] : undefined;
    if (specPipe?.end) {
      const end = specPipe.end.bind(specPipe);
      specPipe.end = (...a: unknown[]) => {
        started = performance.now();
        return end(...a);
      };
    }
    child.once?.('close', () => spans.record(step, performance.now() - started));
    return child;
  };
  return true;
}

/** Step names, outermost first; the markdown profile table follows this order. */
export const STEPS = {
  serverHttp: 'server: request in → response sent',
  controlCreate: 'control.create (after HTTP)',
  sqliteAuth: 'SQLite: API key lookup (auth hook)',
  sqliteWrite: 'SQLite: sandbox writes (insert, status, spec, touch)',
  sqliteRead: 'SQLite: sandbox lookup',
  trajectory: 'SQLite: trajectory log append',
  imageLookup: 'image store: resolve + manifest read',
  edgeCreate: 'edge.createSandbox',
  layerAcquire: 'layer mount acquire (refcount)',
  stateWrite: 'state.json writes (atomic)',
  crunRun: 'crun run -d',
  crunState: 'crun state',
  controlExec: 'control.exec (after HTTP)',
  edgeExec: 'edge.exec (after the control plane)',
  spawnEnter: "dsec-spawn's enter request: asked → command exited, its pipes closed",
  controlPause: 'control.pause + control.resume (after HTTP)',
  edgePause: 'edge.pauseSandbox + edge.resumeSandbox',
  rawOverlay: 'mkdir + overlay mount',
  rawConfig: 'config.json build + write',
  rawCrunRun: 'crun run -d',
} as const;

/**
 * Instruments the in-process server's own objects: control plane, its SQLite store, image store,
 * edge, the edge's crun wrapper, sandbox records and layer mounts. Returns the steps it could not
 * find (the profile then shows them inside their parent's remainder).
 */
export function instrumentDsec(dsec: RunningDsec, spans: Spans): string[] {
  const { control, edge, images, store } = dsec;
  // The control plane's services own each call after HTTP (control/service/*): the route calls
  // control.exec.exec, control.sandboxes.create, pause and resume.
  const targets: [object | undefined, string, string][] = [
    [control.sandboxes, 'create', STEPS.controlCreate],
    [control.exec, 'exec', STEPS.controlExec],
    [store.keys, 'byHash', STEPS.sqliteAuth],
    [store.sandboxes, 'insert', STEPS.sqliteWrite],
    [store.sandboxes, 'setStatus', STEPS.sqliteWrite],
    [store.sandboxes, 'saveSpec', STEPS.sqliteWrite],
    [store.sandboxes, 'touch', STEPS.sqliteWrite],
    [store.sandboxes, 'get', STEPS.sqliteRead],
    [control.trajectory, 'append', STEPS.trajectory],
    [images, 'resolve', STEPS.imageLookup],
    [images, 'get', STEPS.imageLookup],
    [edge, 'createSandbox', STEPS.edgeCreate],
    [edge, 'exec', STEPS.edgeExec],
    [control.sandboxes, 'pause', STEPS.controlPause],
    [control.sandboxes, 'resume', STEPS.controlPause],
    [edge, 'pauseSandbox', STEPS.edgePause],
    [edge, 'resumeSandbox', STEPS.edgePause],
    [edge.layerMounts, 'acquire', STEPS.layerAcquire],
    [edge.records, 'save', STEPS.stateWrite],
    [edge.crun, 'run', STEPS.crunRun],
    [edge.crun, 'state', STEPS.crunState],
  ];
  const missing: string[] = [];
  for (const [obj, key, step] of targets) if (!obj || !timeMethod(obj, key, step, spans)) missing.push(`${step} (${key})`);
  if (!timeUntilClose(edge.crun.spawner, 'enter', STEPS.spawnEnter, spans)) missing.push(`${STEPS.spawnEnter} (enter)`);
  // A second 'request' listener beside Fastify's: from parsed headers to the last byte written.
  const server = dsec.app.server as Server;
  server.prependListener('request', (_req: IncomingMessage, res: ServerResponse) => {
    const started = performance.now();
    res.once('finish', () => spans.record(STEPS.serverHttp, performance.now() - started));
  });
  return missing;
}
