import { HelperChild, planWord, type FdPlan } from './helper-child.js';
import { SPAWN_HELPER_BINARY } from './native-helpers.js';
import { defaultNullDevice } from './private-null.js';
import { ResidentHelper, type DecodedAnswer } from './resident-helper.js';
import type { ToolResult } from './run-tool.js';

/** A streamed tool's first word: started, its pid, and where the helper holds each planned fd's pipe. */
interface Started {
  started: { pid: number; fds: number[] };
}

/**
 * The longest request body dsec-spawn takes (MAX_REQUEST in native/spawn-helper.c): one longer
 * ends the helper, and every tool in flight with it, so it is refused here instead.
 */
export const SPAWN_MAX_REQUEST = 4 << 20;

/**
 * The bytes `fields` take as NUL-ended strings, as a start request's body carries them (and an exec
 * standby's spec pipe: exec-standby.ts holds a command to the same limit as a start).
 */
export function spawnFieldsBytes(fields: Iterable<string>): number {
  let n = 0;
  for (const s of fields) n += Buffer.byteLength(s) + 1;
  return n;
}

/**
 * How long a `release` may wait for a request to ride with (ResidentHelper.notifyLater): the
 * helper meanwhile keeps two pipe ends and a table entry of a command, nothing the command waits on.
 */
const RELEASE_DELAY_MS = 20;

/** How a tool's stdio is set up: all /dev/null, or stdout and stderr collected. */
export type SpawnStdio = 'ignore' | 'pipe';

export class SpawnHelperError extends Error {
  override readonly name = 'SpawnHelperError';
}

/**
 * Host tools started by dsec-spawn (native/spawn-helper.c), a small resident process of the
 * edge's own that posix_spawn()s them, so the edge's large Node process does not fork() for each
 * call (a fork copies its page tables and leaves copy-on-write faults that slow its next
 * request). Calls may be in flight at once; each is answered when its tool has exited and its
 * pipes closed, with the exit status as runTool reports it (128 + the signal's number).
 *
 * A helper that dies fails the calls in flight (the tools themselves run on: a detached
 * container that `crun run -d` made is not the helper's, so no running sandbox is touched) and
 * the next call starts a new one. Gone when its stdin closes (also when the edge dies).
 */
export class SpawnHelper {
  readonly #helper: ResidentHelper<ToolResult | Started>;

  /** Told once why a carried run fell back to a plain one (the first time; later ones are alike). */
  readonly #onCarryFailed: ((why: string) => void) | undefined;
  #carryFailedSaid = false;

  /**
   * `template`: the helper makes its template mount namespace at its start (runCarried), without
   * the mounts below these dirs (the node's sandboxes and layers).
   */
  /**
   * `nullDevice`: the node the helper opens where a tool's stdio is "null" (host/private-null.ts:
   * not the host's /dev/null, which crun would chown to a sandbox's root). Default: that private
   * node where this process can have it (the bench's own helpers too), else /dev/null.
   */
  constructor(
    binary = SPAWN_HELPER_BINARY,
    opts: { template?: readonly string[]; onCarryFailed?: (why: string) => void; nullDevice?: string } = {},
  ) {
    const nullDevice = opts.nullDevice ?? defaultNullDevice();
    const args = [...(nullDevice ? ['--null', nullDevice] : []), ...(opts.template ? ['--template', ...opts.template] : [])];
    this.#helper = new ResidentHelper(binary, { name: 'dsec-spawn', error: (m) => new SpawnHelperError(m), decode: decodeAnswer }, args);
    this.#onCarryFailed = opts.onCarryFailed;
  }

  /**
   * As run(), in a mount namespace of the tool's own made from the helper's small template (a
   * copy of the edge's namespace at the helper's start, without the sandboxes' mounts) into which
   * each of `carry` (a dir and every mount below it) is brought from the edge's namespace at the
   * same path. For `crun run -d`: crun clones the namespace it runs in, so in the edge's own a
   * create costs O(mounts the node holds); here O(the template's + the sandbox's). When the
   * helper cannot (an old kernel, no template, a path the template cannot reach), the tool is
   * run as run() does, and why is told once.
   */
  async runCarried(tool: string, args: readonly string[], carry: readonly string[], opts: { stdio: SpawnStdio }): Promise<ToolResult> {
    const fields = [opts.stdio, String(carry.length), ...carry, tool, ...args];
    if (fields.some((a) => a.includes('\0'))) throw new SpawnHelperError(`an argument of ${tool} contains a NUL byte`);
    const body = Buffer.from(fields.map((a) => `${a}\0`).join(''));
    const r = (await this.#helper.request((id) => [`${id} carry ${body.length}\n`, body])) as ToolResult;
    // A helper built before `carry` (scripts/setup not run since) takes the body for an argv and
    // answers that it cannot start `ignore` or `pipe`: that is a helper that cannot carry too.
    const cannot =
      r.code === 127 && (r.stderr.startsWith('dsec-spawn: cannot carry') || r.stderr.startsWith(`cannot start ${opts.stdio}:`));
    if (!cannot) return r;
    if (!this.#carryFailedSaid) {
      this.#carryFailedSaid = true;
      this.#onCarryFailed?.(r.stderr);
    }
    return this.run(tool, args, opts);
  }

  /** Runs `tool` (looked up in PATH) with `args`; never rejects on a non-zero exit, only when the helper fails. */
  run(tool: string, args: readonly string[], opts: { stdio: SpawnStdio }): Promise<ToolResult> {
    const argv = [tool, ...args];
    if (argv.some((a) => a.includes('\0'))) return Promise.reject(new SpawnHelperError(`an argument of ${tool} contains a NUL byte`));
    const body = Buffer.from(argv.map((a) => `${a}\0`).join(''));
    // Only a streamed tool's request gets a `started` word; these are answered with the result alone.
    return this.#helper.request((id) => [`${id} ${opts.stdio} ${body.length}\n`, body]) as Promise<ToolResult>;
  }

  /**
   * Starts `tool` with its fds as `plan` says (fd 0, 1, 2, then 3…) and its pipes streamed to
   * the edge, as a ChildProcess would have them (`crun exec`: a command's output as it comes,
   * its stdin, a session's fd 3), without a fork of the edge. The helper makes the pipes; the
   * edge opens its ends through /proc/<helper>/fd (Node cannot receive fds over a socket).
   * `oomScoreAdj`: the tool's (and what it starts) from its first instruction, which it cannot lower.
   */
  stream(tool: string, args: readonly string[], plan: readonly FdPlan[], opts: { oomScoreAdj?: number | undefined } = {}): HelperChild {
    return this.#streamed('stream', plan, opts, [tool, ...args], tool);
  }

  /**
   * Starts a command in a running container sandbox with no tool at all: a fork of the helper
   * does what dsec-enter does (native/spawn-enter.c, enter-core.c) and the command's own exec is
   * the only one. `options` are dsec-enter's (without --spec); `args` and `env` travel in the
   * helper's pipe, never on a command line or in a file. Its fds, answers and kill are a stream
   * tool's; its pid is the command's starter's.
   */
  enter(
    options: readonly string[],
    command: { args: readonly string[]; env: readonly string[] },
    plan: readonly FdPlan[],
    opts: { oomScoreAdj?: number | undefined } = {},
  ): HelperChild {
    const { args, env } = command;
    const request = [...options, '--', String(args.length), ...args, String(env.length), ...env];
    return this.#streamed('enter', plan, opts, request, args[0] ?? 'the command');
  }

  #streamed(
    kind: 'stream' | 'enter',
    plan: readonly FdPlan[],
    opts: { oomScoreAdj?: number | undefined },
    rest: readonly string[],
    what: string,
  ): HelperChild {
    const fields = [
      String(plan.length),
      ...plan.map(planWord),
      opts.oomScoreAdj === undefined ? '-' : String(Math.trunc(opts.oomScoreAdj)),
      ...rest,
    ];
    let id = 0;
    let helperPid: number | undefined;
    // The helper holds each pipe's ends until `release` (so no output is lost before the edge has
    // them open): it may ride with the next request, but not where the helper holds the write
    // end of the command's stdin, whose end of file waits for it.
    const withStdin = plan.includes('in');
    const control = {
      release: (i: number) =>
        withStdin
          ? this.#helper.notify(helperPid, [`${i} release 0\n`])
          : this.#helper.notifyLater(helperPid, [`${i} release 0\n`], RELEASE_DELAY_MS),
      kill: (i: number, sig: number) => this.#helper.notify(helperPid, [`${i} kill ${String(sig).length}\n${sig}`]),
    };
    const refuse = (why: string): HelperChild => {
      const refused = new HelperChild(0, plan, control);
      queueMicrotask(() => refused.failed(new SpawnHelperError(why)));
      return refused;
    };
    if (fields.some((a) => a.includes('\0'))) return refuse(`an argument of ${what} contains a NUL byte`);
    const body = Buffer.from(fields.map((a) => `${a}\0`).join(''));
    if (body.length > SPAWN_MAX_REQUEST) {
      return refuse(`${what}: its arguments and environment take ${body.length} bytes, more than the ${SPAWN_MAX_REQUEST} a start takes`);
    }
    // Answers come only after this call returns (from the helper's pipe), when `child` is set.
    const done = this.#helper.request(
      (i) => {
        id = i;
        helperPid = this.#helper.pid;
        return [`${i} ${kind} ${body.length}\n`, body];
      },
      (word) => {
        if ('started' in word && helperPid !== undefined) child.started(word.started.pid, helperPid, word.started.fds);
      },
    );
    const child = new HelperChild(id, plan, control);
    const c = child;
    done.then(
      (answer) => {
        if ('started' in answer) return;
        if (c.wasStarted) c.exited(answer.code);
        else c.failed(new SpawnHelperError(answer.stderr || `dsec-spawn could not start ${what} (${answer.code})`));
      },
      (err: Error) => c.failed(err),
    );
    return child;
  }

  /** Stops the helper (it exits when its stdin closes; tools still running finish on their own). */
  close(): Promise<void> {
    return this.#helper.close();
  }

  /** The helper's pid while it runs (tests kill it to see a restart). */
  get pid(): number | undefined {
    return this.#helper.pid;
  }
}

/**
 * Answers are `<id> <status> <stdout length> <stderr length>\n<stdout><stderr>`, in the order
 * tools finish, and for a streamed tool first `<id> started <pid> <helper fd>...` (progress).
 */
function decodeAnswer(buf: Buffer): DecodedAnswer<ToolResult | Started> | 'incomplete' | 'garbled' {
  const nl = buf.indexOf(10);
  if (nl < 0) return 'incomplete';
  const line = buf.subarray(0, nl).toString('latin1');
  const started = /^(\d+) started (\d+)((?: -?\d+)*)$/.exec(line);
  if (started) {
    const fds = started[3]!.trim().split(' ').filter(Boolean).map(Number);
    return { size: nl + 1, id: Number(started[1]), answer: { started: { pid: Number(started[2]), fds } }, progress: true };
  }
  const m = /^(\d+) (\d+) (\d+) (\d+)$/.exec(line);
  if (!m) return 'garbled';
  const [outLen, errLen] = [Number(m[3]), Number(m[4])];
  if (buf.length < nl + 1 + outLen + errLen) return 'incomplete';
  const stdout = buf.subarray(nl + 1, nl + 1 + outLen).toString('utf8');
  const stderr = buf.subarray(nl + 1 + outLen, nl + 1 + outLen + errLen).toString('utf8');
  return { size: nl + 1 + outLen + errLen, id: Number(m[1]), answer: { code: Number(m[2]), stdout, stderr } };
}
