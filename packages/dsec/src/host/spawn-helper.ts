import { SPAWN_HELPER_BINARY } from './native-helpers.js';
import { ResidentHelper, type DecodedAnswer } from './resident-helper.js';
import type { ToolResult } from './run-tool.js';

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
  readonly #helper: ResidentHelper<ToolResult>;

  constructor(binary = SPAWN_HELPER_BINARY) {
    this.#helper = new ResidentHelper(binary, { name: 'dsec-spawn', error: (m) => new SpawnHelperError(m), decode: decodeAnswer });
  }

  /** Runs `tool` (looked up in PATH) with `args`; never rejects on a non-zero exit, only when the helper fails. */
  run(tool: string, args: readonly string[], opts: { stdio: SpawnStdio }): Promise<ToolResult> {
    const argv = [tool, ...args];
    if (argv.some((a) => a.includes('\0'))) return Promise.reject(new SpawnHelperError(`an argument of ${tool} contains a NUL byte`));
    const body = Buffer.from(argv.map((a) => `${a}\0`).join(''));
    return this.#helper.request((id) => [`${id} ${opts.stdio} ${body.length}\n`, body]);
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

/** Answers are `<id> <status> <stdout length> <stderr length>\n<stdout><stderr>`, in the order tools finish. */
function decodeAnswer(buf: Buffer): DecodedAnswer<ToolResult> | 'incomplete' | 'garbled' {
  const nl = buf.indexOf(10);
  if (nl < 0) return 'incomplete';
  const m = /^(\d+) (\d+) (\d+) (\d+)$/.exec(buf.subarray(0, nl).toString('latin1'));
  if (!m) return 'garbled';
  const [outLen, errLen] = [Number(m[3]), Number(m[4])];
  if (buf.length < nl + 1 + outLen + errLen) return 'incomplete';
  const stdout = buf.subarray(nl + 1, nl + 1 + outLen).toString('utf8');
  const stderr = buf.subarray(nl + 1 + outLen, nl + 1 + outLen + errLen).toString('utf8');
  return { size: nl + 1 + outLen + errLen, id: Number(m[1]), answer: { code: Number(m[2]), stdout, stderr } };
}
