import type {
  Encoding,
  ExecRequest,
  ExecResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
} from '@dsec/sdk/schema';
import { MAX_STDIN_BYTES } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';
import type { EdgeApi, TerminalChannel, TerminalRequest } from '../../edge/protocol/edge-api.js';
import type { ExecEvent } from '../../edge/protocol/exec-event.js';
import type { Logger } from 'pino';
import type { Metrics } from '../metrics.js';
import { MAX_LOGGED_OUTPUT, type TrajectoryLog } from '../trajectory-log.js';
import type { Caller } from './callers.js';
import { holdAnswer, jsonBodyBytes, withOutputReserved, type Hold, type OutputBudget } from '../../output-budget.js';
import type { SandboxLookup } from './sandbox-lookup.js';

/**
 * Commands in a sandbox: one-shot exec (buffered or streamed), background processes, shell
 * sessions and terminals. Everything that changes the sandbox is written to its trajectory so a
 * replay can run it again; reads (process lists, output, waits) are not.
 */
export class ExecService {
  constructor(
    private readonly deps: { lookup: SandboxLookup; trajectory: TrajectoryLog; metrics: Metrics; log: Logger; outputBudget: OutputBudget },
  ) {}

  #edge(caller: Caller, id: string): Promise<EdgeApi> {
    return this.deps.lookup.runningOn(caller, id);
  }

  /** The sandbox's edge and how long finding it took: taken before the command runs, it is part of queuedMs. */
  async #edgeTimed(caller: Caller, id: string): Promise<{ edge: EdgeApi; lookupMs: number }> {
    const accepted = performance.now();
    const edge = await this.#edge(caller, id);
    return { edge, lookupMs: performance.now() - accepted };
  }

  /** A buffered command of the caller's project under the output budget (withOutputReserved). */
  #buffered<R extends ExecResult>(
    caller: Caller,
    maxOutputBytes: number | undefined,
    run: () => Promise<R>,
    hold: Hold | undefined,
  ): Promise<R> {
    return withOutputReserved(this.deps.outputBudget, caller.project, maxOutputBytes ?? 0, run, hold);
  }

  /**
   * `hold` takes the result's output reservation, to give back once its answer is sent
   * (releaseWhenSent): a client that does not read its answer holds the budget, not only memory.
   */
  async exec(caller: Caller, id: string, req: ExecRequest, signal?: AbortSignal, hold?: Hold): Promise<ExecResult> {
    checkCommand(req);
    if (req.uncapped) {
      throw new ApiError(
        'INVALID_REQUEST',
        'uncapped applies to streamed exec (Accept: application/x-ndjson); a buffered result is capped at maxOutputBytes (at most 64 MiB)',
        { field: 'uncapped' },
      );
    }
    return this.#buffered(
      caller,
      req.maxOutputBytes,
      async () => {
        const { edge, lookupMs } = await this.#edgeTimed(caller, id);
        const result = withQueue(await edge.exec(id, req, signal), lookupMs);
        this.deps.metrics.observeExec('exec', result.durationMs);
        await this.deps.trajectory.append(id, {
          kind: 'exec',
          request: withoutStdin(req),
          result,
          durationMs: result.durationMs,
          exitCode: result.exitCode,
          payload: stdinPayload(req),
        });
        return result;
      },
      hold,
    );
  }

  /** Streams a command's output; the log gets the exit and the output that passed through (capped). */
  async execStream(caller: Caller, id: string, req: ExecRequest, signal?: AbortSignal): Promise<AsyncGenerator<ExecEvent>> {
    // Checked now, not at the first next(): a bad request fails before any response is streamed.
    checkCommand(req);
    const { edge, lookupMs } = await this.#edgeTimed(caller, id);
    return this.#logStream(id, edge, req, lookupMs, signal);
  }

  async *#logStream(id: string, edge: EdgeApi, req: ExecRequest, lookupMs: number, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
    const kept = { stdout: [] as Buffer[], stderr: [] as Buffer[] };
    const enc = req.encoding ?? 'utf8';
    let keptBytes = 0;
    let logged = false;
    const started = performance.now();
    try {
      for await (let ev of edge.execStream(id, req, signal)) {
        if (ev.type === 'exit') {
          ev = { type: 'exit', result: withQueue(ev.result, lookupMs) };
          this.deps.metrics.observeExec('stream', ev.result.durationMs);
          const result = {
            ...ev.result,
            stdout: Buffer.concat(kept.stdout).toString(enc),
            stderr: Buffer.concat(kept.stderr).toString(enc),
          };
          await this.deps.trajectory.append(id, {
            kind: 'exec',
            request: withoutStdin(req),
            result,
            durationMs: ev.result.durationMs,
            exitCode: ev.result.exitCode,
            payload: stdinPayload(req),
          });
          logged = true;
        } else if (keptBytes < 2 * MAX_LOGGED_OUTPUT) {
          kept[ev.type].push(ev.data);
          keptBytes += ev.data.length;
        }
        yield ev;
      }
    } finally {
      // The client went away mid-stream: the command was killed, but what it did so far happened.
      if (!logged) {
        const result = {
          disconnected: true,
          stdout: Buffer.concat(kept.stdout).toString(enc),
          stderr: Buffer.concat(kept.stderr).toString(enc),
        };
        await this.deps.trajectory.append(id, {
          kind: 'exec',
          request: withoutStdin(req),
          result,
          durationMs: performance.now() - started,
          payload: stdinPayload(req),
        });
      }
    }
  }

  // --- background processes ---------------------------------------------------------------------

  /** Background processes change state too: logged so a replay starts them again. */
  async startProcess(caller: Caller, id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    checkCommand({ cmd: req.cmd });
    const info = await (await this.#edge(caller, id)).startProcess(id, req);
    await this.deps.trajectory.append(id, { kind: 'process.start', request: { ...req }, result: { processId: info.id } });
    return info;
  }

  async listProcesses(caller: Caller, id: string): Promise<ProcessInfo[]> {
    return (await this.#edge(caller, id)).listProcesses(id);
  }

  async processOutput(
    caller: Caller,
    id: string,
    pid: string,
    offsets: { stdout: number; stderr: number },
    encoding: Encoding,
    hold?: Hold,
  ): Promise<ProcessOutput> {
    const out = await (await this.#edge(caller, id)).processOutput(id, pid, offsets, encoding);
    holdAnswer(
      this.deps.outputBudget,
      caller.project,
      jsonBodyBytes(out.stdout) + jsonBodyBytes(out.stderr),
      `process ${pid}'s output from these offsets`,
      hold,
    );
    return out;
  }

  /**
   * Output and waits for one follower of a sandbox's processes: the edge is looked up (and the
   * sandbox's activity stamped) once, so polling does not count as activity at every tick.
   */
  async processFollower(
    caller: Caller,
    id: string,
  ): Promise<{
    output: (pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding) => Promise<ProcessOutput>;
    wait: (pid: string, timeoutMs: number) => Promise<ProcessInfo>;
  }> {
    const edge = await this.#edge(caller, id);
    return {
      output: (pid, offsets, encoding) => edge.processOutput(id, pid, offsets, encoding),
      wait: (pid, ms) => edge.waitProcess(id, pid, ms),
    };
  }

  async waitProcess(caller: Caller, id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return (await this.#edge(caller, id)).waitProcess(id, pid, timeoutMs);
  }

  /** A signal (SIGKILL: the process's kill) changes the sandbox: logged so a replay sends it too. */
  async signalProcess(caller: Caller, id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const info = await (await this.#edge(caller, id)).signalProcess(id, pid, signal);
    await this.deps.trajectory.append(id, { kind: 'process.signal', request: { processId: pid, signal } });
    return info;
  }

  /** Bytes written to a process's stdin are kept (up to MAX_PAYLOAD) so a replay writes them again. */
  async writeProcessStdin(caller: Caller, id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    await (await this.#edge(caller, id)).writeProcessStdin(id, pid, data, eof);
    await this.deps.trajectory.append(id, { kind: 'process.stdin', request: { processId: pid, bytes: data.length, eof }, payload: data });
  }

  // --- shell sessions ----------------------------------------------------------------------------

  async openSession(caller: Caller, id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const info = await (await this.#edge(caller, id)).openSession(id, req);
    await this.deps.trajectory.append(id, { kind: 'session.open', request: { ...req }, result: { sessionId: info.id, shell: info.shell } });
    return info;
  }

  async listSessions(caller: Caller, id: string): Promise<SessionInfo[]> {
    return (await this.#edge(caller, id)).listSessions(id);
  }

  async sessionExec(
    caller: Caller,
    id: string,
    sid: string,
    req: SessionExecRequest,
    signal?: AbortSignal,
    hold?: Hold,
  ): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#buffered(
      caller,
      req.maxOutputBytes,
      async () => {
        const { edge, lookupMs } = await this.#edgeTimed(caller, id);
        const result = withQueue(await edge.sessionExec(id, sid, req, signal), lookupMs);
        this.deps.metrics.observeExec('session', result.durationMs);
        await this.deps.trajectory.append(id, {
          kind: 'session.exec',
          request: { sessionId: sid, ...req },
          result,
          durationMs: result.durationMs,
          exitCode: result.exitCode,
        });
        return result;
      },
      hold,
    );
  }

  /** Idempotent like kill: closing a session that is already closed (or gone) succeeds. */
  async closeSession(caller: Caller, id: string, sid: string): Promise<void> {
    try {
      await (await this.#edge(caller, id)).closeSession(id, sid);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'SESSION_NOT_FOUND') return;
      throw err;
    }
    await this.deps.trajectory.append(id, { kind: 'session.close', request: { sessionId: sid } });
  }

  // --- terminals ---------------------------------------------------------------------------------

  /**
   * Opens a terminal; its step is written once it exits (`logged`: the request as the log keeps
   * it). Nobody awaits that write (the terminal's socket may be long gone), so a store that fails
   * then (PostgreSQL restarting) is logged here, not left an unhandled rejection.
   */
  async openTerminal(caller: Caller, id: string, req: TerminalRequest, logged: Record<string, unknown>): Promise<TerminalChannel> {
    const started = performance.now();
    const term = await (await this.#edge(caller, id)).openPty(id, req);
    term.exit
      .then((exitCode) =>
        this.deps.trajectory.append(id, {
          kind: 'pty',
          request: logged,
          exitCode,
          durationMs: performance.now() - started,
          replayable: false,
        }),
      )
      .catch((err: unknown) => this.deps.log.error({ err, sandbox: id }, 'logging a terminal step failed'));
    return term;
  }
}

/**
 * Checks the schema cannot express: an argv's program is not empty (a body `cmd: ""` can arrive
 * as `[""]`), and stdin decodes to at most MAX_STDIN_BYTES.
 */
export function checkCommand(req: {
  cmd: string | string[];
  stdin?: string | undefined;
  stdinEncoding?: 'utf8' | 'base64' | undefined;
}): void {
  const program = Array.isArray(req.cmd) ? req.cmd[0] : req.cmd;
  if (!program)
    throw new ApiError('INVALID_REQUEST', 'cmd is empty: give a shell command line or an argv whose first item is the program', {
      field: 'cmd',
    });
  if (req.stdin !== undefined && Buffer.byteLength(req.stdin, req.stdinEncoding ?? 'utf8') > MAX_STDIN_BYTES) {
    throw new ApiError(
      'PAYLOAD_TOO_LARGE',
      `stdin is over ${MAX_STDIN_BYTES} bytes; stream larger input to a background process (POST …/processes/{pid}/stdin)`,
      { field: 'stdin', limit: MAX_STDIN_BYTES },
    );
  }
}

/** The log keeps stdin as a payload (bytes), not inside the JSON request. */
function withoutStdin(req: ExecRequest): Record<string, unknown> {
  const { stdin, ...rest } = req;
  return stdin === undefined ? { ...rest } : { ...rest, stdinBytes: Buffer.byteLength(stdin, req.stdinEncoding ?? 'utf8') };
}

function stdinPayload(req: ExecRequest): Buffer | undefined {
  return req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8');
}

/**
 * Adds the control plane's part of a command's wait (its lookup of the sandbox and edge, `lookupMs`,
 * measured up to the call to the edge) to the edge's (from its receipt to the command's start).
 */
function withQueue<R extends Pick<ExecResult, 'queuedMs'>>(result: R, lookupMs: number): R {
  if (result.queuedMs === undefined) return result; // an edge that does not measure its part
  return { ...result, queuedMs: Math.round((result.queuedMs + lookupMs) * 100) / 100 };
}
