import { DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_MAX_OUTPUT_BYTES, type ExecRequest, type ExecResult } from '@dsec/sdk/schema';
import { sandboxOomKills } from '../../../../host/cgroups.js';
import { processSpecFor, type ExecTarget } from './exec-target.js';
import { iterateOutput } from '../../shared/output-stream.js';
import { SandboxProcess } from './sandbox-process.js';
import { processFigures, type ProcessExit } from '../../shared/command-process.js';
import type { ExecEvent } from '../../../protocol/exec-event.js';

export function startCommand(target: ExecTarget, req: ExecRequest): SandboxProcess {
  return new SandboxProcess(target, processSpecFor(target, req.cmd, { cwd: req.cwd, env: req.env, writablePaths: req.writablePaths }), {
    input: req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8'),
    maxOutputBytes: req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
    timeoutMs: req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
  });
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

export async function runCommand(target: ExecTarget, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
  const received = performance.now();
  const oomBefore = sandboxOomKills(target.id);
  const proc = startCommand(target, req);
  killOnAbort(proc, signal);
  const exit = await proc.done;
  const status = exitStatus(proc, exit, req, sandboxOomKills(target.id) > oomBefore, received);
  return { ...status, stdout: proc.stdout.encode(status.encoding), stderr: proc.stderr.encode(status.encoding) };
}

/**
 * Runs a command and yields its output as it comes (within the cap, or all of it when the request
 * says `uncapped`), then its exit.
 */
export async function* streamCommand(target: ExecTarget, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
  const received = performance.now();
  const oomBefore = sandboxOomKills(target.id);
  const proc = startCommand(target, req);
  killOnAbort(proc, signal);
  for await (const { stream, data } of iterateOutput(proc, req.uncapped ? 'raw' : 'kept')) yield { type: stream, data };
  const exit = await proc.done;
  const status = exitStatus(proc, exit, req, sandboxOomKills(target.id) > oomBefore, received);
  yield { type: 'exit', result: req.uncapped ? { ...status, truncated: false } : status };
}
