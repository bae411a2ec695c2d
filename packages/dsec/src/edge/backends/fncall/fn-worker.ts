import { randomBytes } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FnRunRequest, FnRunResult } from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { SandboxProcess } from '../container/exec/sandbox-process.js';
import { CGROUP_PARENT, cgroupPids, sandboxUsage } from '../../../host/cgroups.js';
import type { EdgeFnRequest } from '../../protocol/edge-api.js';
import type { ContainerBackend } from '../container/container-backend.js';
import { LANDLOCK_PATH } from '../container/oci-config.js';
import { parseUser } from '../shared/user-env.js';

/** The fork server's source (native/fn-zygote.py), passed as `python3 -c`: nothing of dsec is written into the worker. */
const ZYGOTE_SOURCE = readFileSync(new URL('../../../../../native/fn-zygote.py', import.meta.url), 'utf8')
  .split('\n')
  .filter((l) => !/^\s*#/.test(l)) // comments stay in the file: `ps` in the worker shows a shorter command line
  .join('\n');
/** The worker's only writable tree besides /dev/shm and /dev/mqueue (dsec-landlock --rw); wiped after every call. */
export const FN_SCRATCH = '/tmp';
/** How long a new worker's fork server may take to say it is ready (python3 importing its stdlib on a node under load: 30 s was seen too short at load 20 on 2 cores). */
const READY_MS = 120_000;
/** Beyond the call's own timeout (which the fork server enforces), how long the edge waits before it gives the worker up. */
const ANSWER_GRACE_MS = 5_000;
/** A call's killed processes are reaped by the sandbox's init at once; a check waits this many 2 ms rounds for that before it calls one a leftover. */
const SETTLE_TRIES = 50;

/** A worker sandbox id: `sb-<edge>-fn` + 20 base36 characters. Ordinary sandbox ids (sandbox-ids.ts) never begin with `fn` after the edge, so the two never meet. */
export function newWorkerId(edge: string): string {
  let s = '';
  while (s.length < 20) s += randomBytes(8).readBigUInt64BE().toString(36);
  return `sb-${edge}-fn${s.slice(0, 20)}`;
}

export function isWorkerId(id: string): boolean {
  return /^sb-[a-z0-9]{1,32}-fn[a-z0-9]{20}$/.test(id);
}

/** What a call answers from inside, and the fork server's report once the call is cleaned up. */
interface ResultFrame {
  type: 'result';
  error?: string;
  exitCode: number;
  timedOut: boolean;
  stdout: string;
  stderr: string;
  stdoutBytes: number;
  stderrBytes: number;
  runMs: number;
}
interface DoneFrame {
  type: 'done';
  clean: boolean;
  leader: number;
  /** What the call left that the fork server could not put back (SysV IPC objects, /dev or scratch-root metadata). */
  damage?: string;
}
type Frame = ResultFrame | DoneFrame | { type: 'ready'; pid: number };

/**
 * One warm worker: a container sandbox (created through the node's Edge, never known to the
 * control plane) with the fork server running in it. One call at a time. After each call it says
 * whether it is still fit for the next (`damage`): a worker a call damaged is killed, never reused.
 */
export class FnWorker {
  readonly #frames: Frame[] = [];
  #wake: (() => void) | undefined;
  #buf = '';
  /** Host pids of the processes a worker at rest has: its init and the fork server. */
  #resting = new Set<number>();
  /** The sandbox's overlay upper dir on the host, and its entries at rest (upperState). */
  #upper = '';
  #upperAtRest = new Map<string, string>();
  #dead: string | undefined;
  calls = 0;
  lastUsed = Date.now();

  private constructor(
    readonly id: string,
    readonly key: string,
    private readonly edge: ContainerBackend,
    private zygote: SandboxProcess | undefined,
  ) {}

  /** Creates the worker's sandbox and starts its fork server; undoes the sandbox when that fails. */
  static async start(edge: ContainerBackend, key: string, req: EdgeFnRequest): Promise<FnWorker> {
    const call = req.call;
    const id = newWorkerId(edge.id);
    const sandbox = await edge.createSandbox({
      id,
      layers: req.layers,
      config: req.config,
      env: {},
      limits: { cpu: 1, memoryMiB: call.memoryMiB!, pids: 256, diskMiB: call.diskMiB! },
      backend: 'container',
      ...(call.network ? { network: { mode: 'open', allow: [] } } : {}),
    });
    const worker = new FnWorker(id, key, edge, undefined);
    try {
      await edge.makeDir(id, FN_SCRATCH, true);
      const target = edge.execTarget(id);
      worker.zygote = new SandboxProcess(
        target,
        {
          args: [LANDLOCK_PATH, '--rw', FN_SCRATCH, '--', 'python3', '-I', '-c', ZYGOTE_SOURCE, FN_SCRATCH],
          env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'LANG=C.UTF-8', 'PYTHONDONTWRITEBYTECODE=1'],
          cwd: '/',
          user: parseUser(req.config.user),
        },
        { stdin: true, maxOutputBytes: 64 << 10, fd3MaxBytes: 0, onFd3: (d) => worker.#onData(d) },
      );
      void worker.zygote.done.then(() =>
        worker.#died(`the fork server exited: ${worker.zygote!.stderr.encode('utf8').trim().slice(-2000) || 'no message'}`),
      );
      const ready = await worker.#next(READY_MS);
      if (ready.type !== 'ready') throw new Error(`the fork server said ${ready.type} before ready`);
      worker.#resting = new Set([sandbox.pid, worker.zygote.hostPid ?? -1]);
      worker.#upper = edge.records.paths(id, edge.records.load(id)).upper;
      worker.#upperAtRest = upperState(worker.#upper);
      return worker;
    } catch (err) {
      await worker.kill();
      const why = (err as Error).message;
      throw new ApiError(
        'SANDBOX_CREATE_FAILED',
        `could not start an fn worker from image ${req.imageId}: ${why} (the image needs python3; build one with \`dsec image build fn-runtime\`)`,
        {
          image: req.imageId,
        },
      );
    }
  }

  /**
   * Runs one call. Returns its result and, when the call left the worker unfit for another,
   * why (`damage`): the caller then kills this worker and starts a fresh one for the next call.
   */
  async run(
    call: FnRunRequest,
  ): Promise<{ result: Omit<FnRunResult, 'coldStart' | 'durationMs'> & { durationMs: number }; damage?: string }> {
    this.calls++;
    const started = performance.now();
    const oomBefore = sandboxUsage(this.id).oomKills;
    const body = Buffer.from(
      JSON.stringify({
        runtime: call.runtime,
        code: call.code,
        stdin: call.stdin === undefined ? '' : Buffer.from(call.stdin, call.stdinEncoding ?? 'utf8').toString('base64'),
        files: Object.fromEntries(
          Object.entries(call.files ?? {}).map(([k, v]) => [k, Buffer.from(v, call.filesEncoding ?? 'utf8').toString('base64')]),
        ),
        args: call.args ?? [],
        env: call.env ?? {},
        timeoutMs: call.timeoutMs,
        maxOutputBytes: call.maxOutputBytes,
      }),
    );
    const enc = call.encoding ?? 'utf8';
    const fail = (why: string): { result: Omit<FnRunResult, 'coldStart' | 'durationMs'> & { durationMs: number }; damage: string } => {
      const oom = sandboxUsage(this.id).oomKills > oomBefore;
      const msg = Buffer.from(`dsec fn: ${oom ? 'the call ran out of memory and took its worker with it' : why}\n`);
      return {
        result: {
          exitCode: 137,
          stdout: '',
          stderr: msg.toString(enc),
          encoding: enc,
          truncated: false,
          stdoutBytes: 0,
          stderrBytes: msg.length,
          timedOut: false,
          oomKilled: oom,
          durationMs: round(performance.now() - started),
          runMs: 0,
          worker: this.id,
          workerReplaced: true,
          replacedBecause: why,
        },
        damage: why,
      };
    };
    if (this.#dead) return fail(this.#dead);
    if (!this.zygote!.writeStdin(Buffer.concat([Buffer.from(`${body.length}\n`), body]))) return fail('the fork server stopped reading');
    let frame: Frame;
    try {
      frame = await this.#next(call.timeoutMs! + ANSWER_GRACE_MS);
    } catch (err) {
      return fail((err as Error).message);
    }
    if (frame.type !== 'result') return fail(`the fork server answered ${frame.type} instead of a result`);
    let done: Frame;
    try {
      done = await this.#next(ANSWER_GRACE_MS);
    } catch (err) {
      return fail((err as Error).message);
    }
    const out = Buffer.from(frame.stdout ?? '', 'base64');
    const errOut = Buffer.concat([
      Buffer.from(frame.stderr ?? '', 'base64'),
      frame.error ? Buffer.from(`dsec fn: ${frame.error}\n`) : Buffer.alloc(0),
    ]);
    const oomKilled = sandboxUsage(this.id).oomKills > oomBefore;
    const damage = await this.#damage(done, oomKilled);
    const result = {
      exitCode: frame.error ? 126 : frame.exitCode,
      stdout: out.toString(enc),
      stderr: errOut.toString(enc),
      encoding: enc,
      truncated: (frame.stdoutBytes ?? 0) > out.length || (frame.stderrBytes ?? 0) > Buffer.from(frame.stderr ?? '', 'base64').length,
      stdoutBytes: frame.stdoutBytes ?? 0,
      stderrBytes: frame.stderrBytes ?? errOut.length,
      timedOut: frame.timedOut ?? false,
      oomKilled,
      durationMs: round(performance.now() - started),
      runMs: frame.runMs ?? 0,
      worker: this.id,
      workerReplaced: damage !== undefined,
      ...(damage !== undefined ? { replacedBecause: damage } : {}),
    };
    this.lastUsed = Date.now();
    return damage === undefined ? { result } : { result, damage };
  }

  /** Why the worker must not take another call, or undefined when it is as it was before the call. */
  async #damage(done: Frame, oomKilled: boolean): Promise<string | undefined> {
    if (this.#dead) return this.#dead;
    if (done.type !== 'done') return `the fork server answered ${done.type} instead of done`;
    if (oomKilled) return 'the call hit the memory limit (OOM)';
    if (!done.clean) return 'the scratch dirs could not be wiped';
    if (done.leader !== 0) return `the call's leader exited ${done.leader}`;
    if (done.damage) return done.damage;
    // Processes the call started outside its session (a double fork, setsid) outlive it. The
    // init reaps killed ones at once, so only a process that is still alive is a leftover.
    let left: number[] = [];
    for (let i = 0; i < SETTLE_TRIES; i++) {
      // The fork server's one child is the leader it has already forked for the next call.
      left = cgroupPids(`${CGROUP_PARENT}/${this.id}`).filter((pid) => !this.#resting.has(pid) && !this.#isNextLeader(pid) && alive(pid));
      if (left.length === 0) break;
      await new Promise((r) => setTimeout(r, 2));
    }
    if (left.length) return `the call left ${left.length} process(es) running (${left.map(commandOf).join(', ')})`;
    // Landlock keeps writes outside the scratch dirs out, but not chmod, chown, utimes or xattrs:
    // overlayfs copies a changed file up (a new upper entry) or changes the one already there
    // (its ctime moves), so the upper as it was at rest says whether anything outside changed.
    const changed = upperChanges(this.#upper, this.#upperAtRest);
    if (changed.length) return `the call changed the mode, owner, times or xattrs of ${changed.join(', ')}`;
    return undefined;
  }

  #isNextLeader(pid: number): boolean {
    const zygote = this.zygote?.hostPid;
    return zygote !== undefined && parentOf(pid) === zygote;
  }

  get dead(): boolean {
    return this.#dead !== undefined;
  }

  /** Kills the worker's sandbox (and with it the fork server and anything a call left). */
  async kill(): Promise<void> {
    this.#died('killed');
    this.zygote?.endStdin();
    await this.edge.killSandbox(this.id).catch((err: unknown) => {
      if (!(err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND')) throw err;
    });
  }

  #died(why: string): void {
    this.#dead ??= why;
    this.#wake?.();
  }

  #onData(d: Buffer): void {
    this.#buf += d.toString('utf8');
    let nl: number;
    while ((nl = this.#buf.indexOf('\n')) >= 0) {
      const line = this.#buf.slice(0, nl);
      this.#buf = this.#buf.slice(nl + 1);
      try {
        this.#frames.push(JSON.parse(line) as Frame);
      } catch {
        this.#died('the fork server sent a line that is not JSON');
      }
    }
    this.#wake?.();
  }

  /** The next frame from the fork server, or an error when it dies or says nothing for `ms`. */
  async #next(ms: number): Promise<Frame> {
    const deadline = Date.now() + ms;
    for (;;) {
      const f = this.#frames.shift();
      if (f) return f;
      if (this.#dead) throw new Error(this.#dead);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`the fork server said nothing for ${ms} ms`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.#wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.#wake = undefined;
    }
  }
}

/** The fields of /proc/PID/stat after the command name: state, ppid, … (undefined once it is gone). */
function statFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

/**
 * Not exited: a process is gone when every one of its threads is (a zombie waits for the init to
 * reap it). Its main thread's state alone is not enough: a leader that leaves with the raw exit
 * syscall while another thread runs shows Z, and that process lived on into later calls (red
 * team, round three, second pass).
 */
function alive(pid: number): boolean {
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return false;
  }
  for (const tid of tids) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
      if (state !== 'Z' && state !== 'X') return true;
    } catch {
      // that thread is gone
    }
  }
  return false;
}

function parentOf(pid: number): number | undefined {
  const f = statFields(pid);
  return f === undefined ? undefined : Number(f[1]);
}

function commandOf(pid: number): string {
  try {
    return `${pid} ${readFileSync(`/proc/${pid}/comm`, 'utf8').trim()}`;
  } catch {
    return String(pid);
  }
}

/**
 * The worker's overlay upper dir (host side) but the scratch dir beneath it, entry by entry: what
 * any change of a file's mode, owner, times or xattrs moves (a change of a lower file copies it up:
 * a new entry; of an upper one: its ctime). At rest it holds the root and the scratch dir only.
 * Stops after `max` entries: a call that changed thousands of files does not hold the edge up.
 */
function upperState(upper: string, max = Infinity): Map<string, string> {
  const out = new Map<string, string>();
  const walk = (rel: string): void => {
    if (out.size >= max) return;
    const st = lstatSync(join(upper, rel), { bigint: true });
    out.set(rel || '/', `${st.mode}:${st.uid}:${st.gid}:${st.size}:${st.ino}:${st.mtimeNs}:${st.ctimeNs}`);
    if (!st.isDirectory()) return;
    for (const name of readdirSync(join(upper, rel))) if (`${rel}/${name}` !== FN_SCRATCH) walk(`${rel}/${name}`);
  };
  walk('');
  return out;
}

/** The paths (as seen inside, a few) whose upper entries differ from `atRest`: added, changed or gone. */
function upperChanges(upper: string, atRest: Map<string, string>): string[] {
  const SHOWN = 5;
  let now: Map<string, string>;
  try {
    now = upperState(upper, atRest.size + SHOWN + 1);
  } catch (err) {
    return [`the upper dir (unreadable: ${(err as Error).message})`];
  }
  const changed = [...now].filter(([p, v]) => atRest.get(p) !== v).map(([p]) => p);
  changed.push(...[...atRest.keys()].filter((p) => !now.has(p)));
  return changed.length > SHOWN ? [...changed.slice(0, SHOWN), 'more'] : changed;
}

function round(ms: number): number {
  return Math.round(ms * 100) / 100;
}
