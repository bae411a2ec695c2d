import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_MAX_OUTPUT_BYTES, type ExecRequest, type ExecResult, type ImageConfig } from '@dsec/sdk/schema';
import { signalNumber } from '../host/run-tool.js';
import type { Crun } from './crun.js';
import { mergeEnv, parseUser, processBlock } from './oci-config.js';
import { killTree } from './process-tree.js';

/** Collects up to `cap` bytes of a stream and counts the rest. */
class CappedBuffer {
  readonly #chunks: Buffer[] = [];
  #kept = 0;
  total = 0;
  constructor(private readonly cap: number) {}
  push(chunk: Buffer): void {
    this.total += chunk.length;
    if (this.#kept >= this.cap) return;
    const take = chunk.subarray(0, this.cap - this.#kept);
    this.#chunks.push(take);
    this.#kept += take.length;
  }
  get truncated(): boolean {
    return this.total > this.#kept;
  }
  text(): string {
    return Buffer.concat(this.#chunks).toString('utf8');
  }
}

export interface ExecContext {
  crun: Crun;
  id: string;
  /** Scratch directory for the process spec and pid file. */
  dir: string;
  config: ImageConfig;
  env: Record<string, string>;
}

/**
 * Runs one command in a sandbox from outside, with `crun exec`: nothing of the platform runs in
 * the sandbox before or after. The process spec (argv, env, cwd, user, capabilities) goes in a
 * file so nothing is inherited by accident. A timeout kills the command's whole process tree
 * (found through /proc from the pid crun reports), never the sandbox.
 */
export async function execInSandbox(ctx: ExecContext, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
  const started = performance.now();
  const tag = randomBytes(6).toString('hex');
  const specFile = join(ctx.dir, `exec-${tag}.json`);
  const pidFile = join(ctx.dir, `exec-${tag}.pid`);
  const args = typeof req.cmd === 'string' ? ['/bin/sh', '-c', req.cmd] : req.cmd;
  writeFileSync(
    specFile,
    JSON.stringify(
      processBlock({
        args,
        env: mergeEnv(ctx.config.env, ctx.env, req.env ?? {}),
        cwd: req.cwd ?? ctx.config.cwd,
        user: parseUser(ctx.config.user),
      }),
    ),
  );
  const cap = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  const stdout = new CappedBuffer(cap);
  const stderr = new CappedBuffer(cap);
  let timedOut = false;
  try {
    const code = await new Promise<number>((resolve) => {
      const child = spawn('crun', [...ctx.crun.globalArgs(), 'exec', '--process', specFile, '--pid-file', pidFile, ctx.id], {
        stdio: [req.stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
      });
      const killCommand = (): void => {
        try {
          killTree(Number(readFileSync(pidFile, 'utf8')));
        } catch {
          // crun has not written the pid yet: killing crun exec ends the command with it
        }
        child.kill('SIGKILL');
      };
      const timer = setTimeout(() => {
        timedOut = true;
        killCommand();
      }, req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS);
      const onAbort = (): void => killCommand();
      signal?.addEventListener('abort', onAbort, { once: true });
      child.stdout!.on('data', (d: Buffer) => stdout.push(d));
      child.stderr!.on('data', (d: Buffer) => stderr.push(d));
      child.stdin?.on('error', () => {}); // the command may exit without reading its stdin
      child.stdin?.end(req.stdin);
      let exitCode: number | undefined;
      const finish = (): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        resolve(exitCode ?? 1);
      };
      child.on('error', (err) => {
        stderr.push(Buffer.from(`cannot start crun exec: ${err.message}\n`));
        exitCode = 127;
        finish();
      });
      child.on('exit', (c, s) => {
        exitCode = c ?? 128 + signalNumber(s);
        // A background child of the command may hold the pipes open; don't wait on it for long.
        const grace = setTimeout(() => {
          child.stdout!.destroy();
          child.stderr!.destroy();
          finish();
        }, 100);
        child.on('close', () => {
          clearTimeout(grace);
          finish();
        });
      });
    });
    return {
      exitCode: timedOut ? 137 : code,
      stdout: stdout.text(),
      stderr: stderr.text(),
      truncated: stdout.truncated || stderr.truncated,
      stdoutBytes: stdout.total,
      stderrBytes: stderr.total,
      timedOut,
      durationMs: Math.round((performance.now() - started) * 100) / 100,
    };
  } finally {
    rmSync(specFile, { force: true });
    rmSync(pidFile, { force: true });
  }
}
