import type { SandboxSide } from './rpc-router.js';
import type { ControlPlane } from '../control-plane.js';
import { ApiError } from '../../api-error.js';
import { ConnectError } from './connect-protocol.js';
import { PtySession } from './pty-session.js';
import type { CallContext, Message, RpcService } from './rpc-router.js';
import { asUser, resolvePath, userEnv, type SandboxUsers } from './sandbox-users.js';

/** Kept output per stream of an E2B command; past it bytes are counted, not streamed. */
export const E2B_MAX_OUTPUT_BYTES = 16 << 20;
/** Poll interval bounds while following a process's output (it wakes at once on exit). */
const MIN_TICK_MS = 5;
const MAX_TICK_MS = 200;
/**
 * A client that goes away this close to its call's deadline is one whose own timer fired: E2B's
 * SDK times a call with the same timeoutMs it sends as Connect-Timeout-Ms, and its clock started
 * earlier than this server's by the request's trip. Its command is killed then, not this much later.
 */
const DEADLINE_SLACK_MS = 1000;
/** Finished processes a sandbox's table remembers for Connect after the fact. */
const KEEP_EXITED = 64;

interface ProcessConfig {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

/** One process as E2B sees it: a numeric pid over a dsec background process or a PTY. */
interface Tracked {
  pid: number;
  tag: string | undefined;
  config: ProcessConfig;
  /** dsec's process handle (p-…) for a plain process. */
  handle?: string;
  pty?: PtySession;
  exited: boolean;
  /**
   * This layer SIGKILLed it (its call's deadline, or SendSignal SIGKILL): it is over for E2B at
   * once. The edge lists it as running a moment longer, until its starter has reaped it and its
   * pipes closed (up to a second: sandbox-process.ts), and List must not show it meanwhile.
   */
  killed: boolean;
}

const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

function str(v: unknown, field: string): string {
  if (typeof v !== 'string') throw new ConnectError('invalid_argument', `${field} must be a string`);
  return v;
}

function parseConfig(v: unknown): ProcessConfig {
  if (typeof v !== 'object' || v === null) throw new ConnectError('invalid_argument', 'process is required: {cmd, args, envs, cwd}');
  const p = v as Record<string, unknown>;
  const cmd = str(p['cmd'], 'process.cmd');
  if (!cmd) throw new ConnectError('invalid_argument', 'process.cmd is empty');
  const args = p['args'] === undefined ? [] : p['args'];
  if (!Array.isArray(args) || !args.every((a) => typeof a === 'string'))
    throw new ConnectError('invalid_argument', 'process.args must be a list of strings');
  const envs: Record<string, string> = {};
  const rawEnvs = p['envs'] ?? {};
  if (typeof rawEnvs !== 'object' || rawEnvs === null) throw new ConnectError('invalid_argument', 'process.envs must be a map of strings');
  for (const [k, val] of Object.entries(rawEnvs)) {
    if (!ENV_KEY.test(k))
      throw new ConnectError(
        'invalid_argument',
        `environment variable name ${JSON.stringify(k)} is not valid (letters, digits, _; not starting with a digit)`,
      );
    envs[k] = str(val, `process.envs.${k}`);
  }
  const out: ProcessConfig = { cmd, args: args as string[], envs };
  if (p['cwd'] !== undefined && p['cwd'] !== '') out.cwd = str(p['cwd'], 'process.cwd');
  return out;
}

function ptySize(v: unknown): { cols: number; rows: number } | undefined {
  if (typeof v !== 'object' || v === null) return undefined;
  const size = (v as Record<string, unknown>)['size'] as Record<string, unknown> | undefined;
  const cols = Number(size?.['cols'] ?? 80);
  const rows = Number(size?.['rows'] ?? 24);
  if (!Number.isInteger(cols) || !Number.isInteger(rows) || cols < 1 || rows < 1)
    throw new ConnectError('invalid_argument', 'pty.size needs positive integer cols and rows');
  return { cols, rows };
}

const SIGNALS: Record<string, NodeJS.Signals> = { SIGNAL_SIGKILL: 'SIGKILL', SIGNAL_SIGTERM: 'SIGTERM', '9': 'SIGKILL', '15': 'SIGTERM' };

/** Whether a call that ended did so for its deadline (its own, or the client's: DEADLINE_SLACK_MS). */
function deadlineDue(ctx: CallContext): boolean {
  if (!ctx.signal.aborted || ctx.deadlineAt === undefined) return false;
  return ctx.signal.reason === 'deadline' || ctx.deadlineAt - Date.now() <= DEADLINE_SLACK_MS;
}

function endEvent(exitCode: number): Message {
  const status = `exit status ${exitCode}`;
  return { event: { end: { exitCode, exited: true, status, ...(exitCode !== 0 ? { error: status } : {}) } } };
}

/**
 * E2B's process service (start, connect, list, input, stdin close, signals, PTY resize) over
 * dsec's background processes and PTYs: processes outlive the stream that started them, so a
 * client may disconnect and Connect again by pid; a call's deadline kills what it started.
 */
export class ProcessService {
  readonly #tables = new Map<string, Map<number, Tracked>>();
  #nextPid = 1000;

  constructor(
    private readonly control: ControlPlane,
    private readonly users: SandboxUsers,
  ) {}

  forget(sandboxId: string): void {
    this.#tables.delete(sandboxId);
  }

  /** Sandboxes this service holds state for. */
  sandboxes(): string[] {
    return [...this.#tables.keys()];
  }

  #table(id: string): Map<number, Tracked> {
    let t = this.#tables.get(id);
    if (!t) this.#tables.set(id, (t = new Map()));
    return t;
  }

  #find(id: string, selector: unknown): Tracked {
    const sel = (typeof selector === 'object' && selector !== null ? selector : {}) as Record<string, unknown>;
    const table = this.#table(id);
    if (sel['pid'] !== undefined) {
      const t = table.get(Number(sel['pid']));
      if (t) return t;
      throw new ConnectError('not_found', `process with pid ${String(sel['pid'])} not found`);
    }
    if (typeof sel['tag'] === 'string') {
      for (const t of table.values()) if (t.tag === sel['tag']) return t;
      throw new ConnectError('not_found', `process with tag ${sel['tag']} not found`);
    }
    throw new ConnectError('invalid_argument', 'process selector needs a pid or a tag');
  }

  #prune(id: string): void {
    const table = this.#table(id);
    const exited = [...table.values()].filter((t) => t.exited);
    for (const t of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) table.delete(t.pid);
  }

  service(): RpcService {
    return {
      name: 'process.Process',
      keepalive: { event: { keepalive: {} } },
      unary: {
        List: (ctx) => this.#list(ctx),
        SendInput: (ctx, req) => this.#sendInput(ctx, req),
        CloseStdin: (ctx, req) => this.#closeStdin(ctx, req),
        SendSignal: (ctx, req) => this.#sendSignal(ctx, req),
        Update: (ctx, req) => this.#update(ctx, req),
      },
      stream: {
        Start: (ctx, req, emit) => this.#start(ctx, req, emit),
        Connect: (ctx, req, emit) => this.#connect(ctx, req, emit),
      },
    };
  }

  async #start(ctx: CallContext, req: Message, emit: (m: Message) => void): Promise<void> {
    const config = parseConfig(req['process']);
    const size = req['pty'] === undefined || req['pty'] === null ? undefined : ptySize(req['pty']);
    const tag = typeof req['tag'] === 'string' ? req['tag'] : undefined;
    const id = ctx.sandboxId;
    const user = await this.users.resolve(ctx, ctx.user);
    const cwd = resolvePath(config.cwd ?? user.home, user);
    const env = { ...userEnv(user), ...config.envs };
    const argv = asUser(user, [config.cmd, ...config.args]);
    const tracked: Tracked = { pid: this.#nextPid++, tag, config: { ...config, cwd }, exited: false, killed: false };
    if (size) {
      tracked.pty = await PtySession.open(this.control, ctx, { cmd: argv, cols: size.cols, rows: size.rows, cwd, env });
      void tracked.pty.exit.then(() => (tracked.exited = true));
    } else {
      const info = await this.control.exec.startProcess(ctx.caller, id, {
        cmd: argv,
        cwd,
        env,
        stdin: req['stdin'] === true,
        maxOutputBytes: E2B_MAX_OUTPUT_BYTES,
      });
      tracked.handle = info.id;
    }
    this.#table(id).set(tracked.pid, tracked);
    this.#prune(id);
    emit({ event: { start: { pid: tracked.pid } } });
    // The deadline kills at the moment the call ends for it, not when the follow loop next wakes
    // (up to MAX_TICK_MS later): a client whose own timer fired lists the processes right after.
    const onDeadline = (): void => {
      if (!tracked.exited && deadlineDue(ctx)) void this.#kill(ctx, tracked).catch(() => undefined);
    };
    ctx.signal.addEventListener('abort', onDeadline, { once: true });
    try {
      await this.#follow(ctx, tracked, emit, { stdout: 0, stderr: 0 });
    } finally {
      ctx.signal.removeEventListener('abort', onDeadline);
      // The call's deadline bounds what it started, whether or not the client is still there
      // (E2B's timeoutMs; 0 means none); a client that only went away leaves it running.
      if (!tracked.exited && !tracked.killed && ctx.deadlineAt !== undefined) {
        const left = ctx.deadlineAt - Date.now();
        if (left <= 0 || deadlineDue(ctx)) await this.#kill(ctx, tracked).catch(() => undefined);
        else setTimeout(() => void this.#kill(ctx, tracked).catch(() => undefined), left).unref();
      }
    }
  }

  async #connect(ctx: CallContext, req: Message, emit: (m: Message) => void): Promise<void> {
    const tracked = this.#find(ctx.sandboxId, (req['process'] as Message | undefined)?.['selector'] ?? req['process']);
    emit({ event: { start: { pid: tracked.pid } } });
    let from = { stdout: 0, stderr: 0 };
    if (tracked.handle) {
      // Output from now on: a reconnecting client has already seen what came before.
      const info = (await this.control.exec.listProcesses(ctx.caller, ctx.sandboxId)).find((p) => p.id === tracked.handle);
      if (info)
        from = { stdout: Math.min(info.stdoutBytes, E2B_MAX_OUTPUT_BYTES), stderr: Math.min(info.stderrBytes, E2B_MAX_OUTPUT_BYTES) };
    }
    await this.#follow(ctx, tracked, emit, from);
  }

  /** Streams a process's output from `from` until it exits or the call ends. */
  async #follow(ctx: CallContext, t: Tracked, emit: (m: Message) => void, from: { stdout: number; stderr: number }): Promise<void> {
    const id = ctx.sandboxId;
    if (t.pty) {
      const pty = t.pty;
      const stop = pty.listen((data) => emit({ event: { data: { pty: data.toString('base64') } } }));
      try {
        const aborted = new Promise<void>((resolve) => ctx.signal.addEventListener('abort', () => resolve(), { once: true }));
        await Promise.race([pty.exit, aborted]);
      } finally {
        stop();
      }
      if (pty.exitCode !== undefined && !ctx.signal.aborted) emit(endEvent(pty.exitCode));
      return;
    }
    // Looked up once: polling must not count as sandbox activity each tick.
    const follower = await this.control.exec.processFollower(ctx.caller, id);
    const handle = t.handle!;
    const offsets = { ...from };
    let tick = MIN_TICK_MS;
    while (!ctx.signal.aborted) {
      const out = await follower.output(handle, offsets, 'base64');
      let got = false;
      for (const stream of ['stdout', 'stderr'] as const) {
        const b64 = out[stream];
        if (!b64) continue;
        got = true;
        offsets[stream] += Buffer.byteLength(b64, 'base64');
        emit({ event: { data: { [stream]: b64 } } });
      }
      if (out.process.status === 'exited') {
        t.exited = true;
        emit(endEvent(out.process.exitCode ?? -1));
        return;
      }
      tick = got ? MIN_TICK_MS : Math.min(tick * 2, MAX_TICK_MS);
      await follower.wait(handle, tick);
    }
  }

  /** SIGKILL: the process leaves List at once (`killed`), unless the kill failed. */
  async #kill(side: SandboxSide, t: Tracked): Promise<void> {
    t.killed = true;
    if (t.pty) {
      t.pty.kill();
      return;
    }
    try {
      await this.control.exec.signalProcess(side.caller, side.sandboxId, t.handle!, 'SIGKILL');
    } catch (err) {
      // Ended already (the edge no longer has it): still over. Anything else: it may still run.
      if (!(err instanceof ApiError && err.code === 'PROCESS_NOT_FOUND')) t.killed = false;
      throw err;
    }
  }

  async #list(ctx: CallContext): Promise<Message> {
    const id = ctx.sandboxId;
    const running = new Set((await this.control.exec.listProcesses(ctx.caller, id)).filter((p) => p.status === 'running').map((p) => p.id));
    const processes: Message[] = [];
    for (const t of this.#table(id).values()) {
      const alive = !t.killed && (t.pty ? t.pty.exitCode === undefined : running.has(t.handle!));
      if (!alive) continue;
      processes.push({
        pid: t.pid,
        config: { cmd: t.config.cmd, args: t.config.args, envs: t.config.envs, ...(t.config.cwd ? { cwd: t.config.cwd } : {}) },
        ...(t.tag ? { tag: t.tag } : {}),
      });
    }
    return { processes };
  }

  async #sendInput(ctx: CallContext, req: Message): Promise<Message> {
    const t = this.#find(ctx.sandboxId, (req['process'] as Message | undefined)?.['selector'] ?? req['process']);
    const input = (req['input'] ?? {}) as Record<string, unknown>;
    if (typeof input['pty'] === 'string') {
      if (!t.pty) throw new ConnectError('invalid_argument', `process ${t.pid} has no PTY: send stdin instead`);
      t.pty.write(Buffer.from(input['pty'], 'base64'));
    } else if (typeof input['stdin'] === 'string') {
      const data = Buffer.from(input['stdin'], 'base64');
      if (t.pty) t.pty.write(data);
      else await this.#writeStdin(ctx, t, data, false);
    } else throw new ConnectError('invalid_argument', 'input needs stdin or pty bytes');
    return {};
  }

  async #writeStdin(side: SandboxSide, t: Tracked, data: Buffer, eof: boolean): Promise<void> {
    try {
      await this.control.exec.writeProcessStdin(side.caller, side.sandboxId, t.handle!, data, eof);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'PROCESS_NOT_RUNNING')
        throw new ConnectError('failed_precondition', `process ${t.pid}: ${err.message}`);
      throw err;
    }
  }

  async #closeStdin(ctx: CallContext, req: Message): Promise<Message> {
    const t = this.#find(ctx.sandboxId, (req['process'] as Message | undefined)?.['selector'] ?? req['process']);
    if (t.pty) throw new ConnectError('invalid_argument', `process ${t.pid} is a PTY: send Ctrl-D (0x04) as input instead`);
    await this.#writeStdin(ctx, t, Buffer.alloc(0), true);
    return {};
  }

  async #sendSignal(ctx: CallContext, req: Message): Promise<Message> {
    const t = this.#find(ctx.sandboxId, (req['process'] as Message | undefined)?.['selector'] ?? req['process']);
    const sig = SIGNALS[String(req['signal'])];
    if (!sig)
      throw new ConnectError(
        'invalid_argument',
        `signal ${JSON.stringify(req['signal'])} is not supported: send SIGNAL_SIGKILL or SIGNAL_SIGTERM`,
      );
    if (t.exited) throw new ConnectError('not_found', `process ${t.pid} has already exited`);
    if (sig === 'SIGKILL') {
      await this.#kill(ctx, t);
      return {};
    }
    if (t.pty) {
      t.pty.kill();
      return {};
    }
    await this.control.exec.signalProcess(ctx.caller, ctx.sandboxId, t.handle!, sig);
    return {};
  }

  async #update(ctx: CallContext, req: Message): Promise<Message> {
    const t = this.#find(ctx.sandboxId, (req['process'] as Message | undefined)?.['selector'] ?? req['process']);
    const size = ptySize(req['pty']);
    if (!t.pty || !size) throw new ConnectError('invalid_argument', `process ${t.pid} has no PTY to resize`);
    t.pty.resize(size.cols, size.rows);
    return {};
  }
}
