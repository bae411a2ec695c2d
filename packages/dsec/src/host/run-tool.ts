import { spawn } from 'node:child_process';
import { constants } from 'node:os';
import { nullStdio } from './private-null.js';

/** The outcome of running a host tool (crun, mkfs.erofs, mount, apt-get…). */
export interface ToolResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A host tool failed; carries its stderr, which is the user's only clue. */
export class ToolError extends Error {
  override readonly name = 'ToolError';
  constructor(
    readonly tool: string,
    readonly args: readonly string[],
    readonly result: ToolResult,
  ) {
    super(`${tool} ${args.join(' ')} exited ${result.code}: ${result.stderr.trim() || result.stdout.trim() || '(no output)'}`);
  }
}

export interface RunToolOptions {
  input?: string | Buffer;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** Keep at most this many bytes of each stream. @default 1 MiB */
  maxOutput?: number;
  /** Stream stderr lines to this callback as they arrive (progress). */
  onStderr?: (chunk: string) => void;
  onStdout?: (chunk: string) => void;
  /** Kills the tool (SIGKILL) when aborted; runToolOrThrow then throws the signal's reason. */
  signal?: AbortSignal;
}

/** Starts tools for runTool without a fork of this process: an edge's dsec-spawn (host/spawn-helper.ts). */
export interface ToolStarter {
  run(tool: string, args: readonly string[], opts: { stdio: 'pipe' }): Promise<ToolResult>;
}

/** Registered starters, newest last (a process may hold several edges: tests, benchmarks). */
const starters: ToolStarter[] = [];

/**
 * Routes this process's plain runTool calls (no stdin, environment, cwd, streamed output or abort
 * signal: mount, mkfs.ext4, mkfs.erofs, ip, du, cp, crun state …) through `starter` until the
 * returned function is called. A fork of a large Node process (an edge, or `dsec up` with its
 * control plane) copies its page tables on the event loop and leaves copy-on-write faults that
 * slow its next requests; the resident helper posix_spawn()s from a tiny address space instead.
 */
export function startToolsThrough(starter: ToolStarter): () => void {
  starters.push(starter);
  return () => {
    const i = starters.lastIndexOf(starter);
    if (i >= 0) starters.splice(i, 1);
  };
}

function isPlain(opts: RunToolOptions): boolean {
  return opts.input === undefined && opts.env === undefined && opts.cwd === undefined && !opts.onStderr && !opts.onStdout && !opts.signal;
}

/** Runs a tool to completion; never rejects on a non-zero exit (see runToolOrThrow). */
export function runTool(tool: string, args: readonly string[], opts: RunToolOptions = {}): Promise<ToolResult> {
  const max = opts.maxOutput ?? 1 << 20;
  const starter = starters.at(-1);
  if (starter && isPlain(opts)) {
    return starter.run(tool, args, { stdio: 'pipe' }).then(
      (r) => ({ code: r.code, stdout: r.stdout.slice(0, max), stderr: r.stderr.slice(0, max) }),
      // The helper died under the call: whether the tool ran is unknown, so it is not run again.
      (err: Error) => ({ code: 127, stdout: '', stderr: `${tool}: its starter failed: ${err.message}` }),
    );
  }
  return new Promise((resolve) => {
    const child = spawn(tool, args, {
      cwd: opts.cwd,
      env: opts.env ?? process.env,
      stdio: [opts.input === undefined ? nullStdio() : 'pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout!.setEncoding('utf8').on('data', (d: string) => {
      opts.onStdout?.(d);
      if (stdout.length < max) stdout += d.slice(0, max - stdout.length);
    });
    child.stderr!.setEncoding('utf8').on('data', (d: string) => {
      opts.onStderr?.(d);
      if (stderr.length < max) stderr += d.slice(0, max - stderr.length);
    });
    const stop = (): void => {
      child.kill('SIGKILL');
    };
    if (opts.signal?.aborted) stop();
    opts.signal?.addEventListener('abort', stop, { once: true });
    child.on('error', (err) => resolve({ code: 127, stdout, stderr: `${stderr}${err.message}` }));
    child.on('close', (code, signal) => {
      opts.signal?.removeEventListener('abort', stop);
      resolve({ code: code ?? 128 + signalNumber(signal), stdout, stderr });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
  });
}

export async function runToolOrThrow(tool: string, args: readonly string[], opts: RunToolOptions = {}): Promise<ToolResult> {
  const result = await runTool(tool, args, opts);
  if (opts.signal?.aborted) throw opts.signal.reason;
  if (result.code !== 0) throw new ToolError(tool, args, result);
  return result;
}

/** The signal's number (the shell's exit status is 128 + it); every signal Node knows, from os.constants. */
export function signalNumber(signal: NodeJS.Signals | null): number {
  return signal === null ? 0 : (constants.signals[signal] ?? 0);
}
