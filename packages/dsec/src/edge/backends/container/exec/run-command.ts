import { DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_MAX_OUTPUT_BYTES, type ExecRequest, type ExecResult } from '@dsec/sdk/schema';
import { sandboxOomKills } from '../../../../host/cgroups.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { iterateOutput } from '../../shared/output-stream.js';
import { SandboxProcess } from './sandbox-process.js';
import { prepareExecStandby, takeExecStandby } from './exec-standby.js';
import { processFigures, type ProcessExit } from '../../shared/command-process.js';
import type { ExecEvent } from '../../../protocol/exec-event.js';

/**
 * Starts an exec's command: in the sandbox's process made ahead where one fits (exec-standby.ts),
 * else a process of its own. `standbyAllowed`: whether the next one may be made ahead now (not
 * while the sandbox is paused or held for a move). The next one is made once this command has
 * ended, after its answer: made while it runs, it took the CPU this command needed (2 cores), and
 * a caller sending commands back to back gained nothing from it (dsec bench exec: 0.84× raw crun
 * exec, against 0.72× without standbys).
 */
export function startCommand(
  target: ExecTarget,
  req: ExecRequest,
  standbyAllowed: () => boolean = () => false,
): { proc: SandboxProcess; prepareNext: () => void } {
  const spec = processSpecFor(target, req.cmd, { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths });
  const opts = {
    input: req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8'),
    maxOutputBytes: req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
    timeoutMs: req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
  };
  const proc = takeExecStandby(target, spec, opts) ?? new SandboxProcess(target, spec, opts);
  return { proc, prepareNext: () => setImmediate(() => prepareExecStandby(target, spec, standbyAllowed())) };
}

/** Kills the command when the caller goes away (an aborted signal: e.g. the HTTP client hung up). */
function killOnAbort(proc: SandboxProcess, signal: AbortSignal | undefined): void {
  if (!signal) return;
  if (signal.aborted) proc.kill();
  else {
    signal.addEventListener('abort', () => proc.kill(), { once: true });
  }
}

/** Runs a command to completion and returns its (capped) output. */
/** The exit status of a finished command, without its output. */
function exitStatus(
  proc: SandboxProcess,
  exit: ProcessExit,
  req: ExecRequest,
  oomKilled: boolean,
  received: number,
): Omit<ExecResult, 'stdout' | 'stderr'> {
  return {
    exitCode: exit.exitCode,
    encoding: req.encoding ?? 'utf8',
    truncated: proc.stdout.truncated || proc.stderr.truncated,
    stdoutBytes: proc.stdout.total,
    stderrBytes: proc.stderr.total,
    timedOut: exit.timedOut,
    oomKilled,
    durationMs: exit.durationMs,
    queuedMs: round2(proc.spawnedAt - received),
    ...processFigures(exit),
  };
}

const round2 = (ms: number): number => Math.round(ms * 100) / 100;

export async function runCommand(
  target: ExecTarget,
  req: ExecRequest,
  signal?: AbortSignal,
  standbyAllowed?: () => boolean,
): Promise<ExecResult> {
  const received = performance.now();
  const oomBefore = sandboxOomKills(target.id);
  const { proc, prepareNext } = startCommand(target, req, standbyAllowed);
  killOnAbort(proc, signal);
  const exit = await proc.done;
  prepareNext();
  const status = exitStatus(proc, exit, req, sandboxOomKills(target.id) > oomBefore, received);
  return { ...status, stdout: proc.stdout.encode(status.encoding), stderr: proc.stderr.encode(status.encoding) };
}

/**
 * Runs a command and yields its output as it comes (within the cap, or all of it when the request
 * says `uncapped`), then its exit.
 */
export async function* streamCommand(
  target: ExecTarget,
  req: ExecRequest,
  signal?: AbortSignal,
  standbyAllowed?: () => boolean,
): AsyncGenerator<ExecEvent> {
  const received = performance.now();
  const oomBefore = sandboxOomKills(target.id);
  const { proc, prepareNext } = startCommand(target, req, standbyAllowed);
  killOnAbort(proc, signal);
  for await (const { stream, data } of iterateOutput(proc, req.uncapped ? 'raw' : 'kept')) yield { type: stream, data };
  const exit = await proc.done;
  prepareNext();
  const status = exitStatus(proc, exit, req, sandboxOomKills(target.id) > oomBefore, received);
  yield { type: 'exit', result: req.uncapped ? { ...status, truncated: false } : status };
}
