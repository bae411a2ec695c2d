import { spawn } from 'node:child_process';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ApiError } from '../api-error.js';
import { stagingPrefix } from '../image/staging.js';

/** The dsec CLI of this installation: image jobs run as `dsec image …` in a process of their own. */
const CLI = resolve(dirname(fileURLToPath(import.meta.url)), '../cli/main.js');

/** A debootstrap build takes about a minute here; a stuck one is stopped well after that. */
const JOB_TIMEOUT_MS = 30 * 60_000;

/**
 * Runs an image build or import as a builder process (`dsec image build|import --data-dir D`),
 * not inside the control plane's HTTP handler: its tar walks, file copies and hashing never hold
 * the control plane's event loop, a crash of the job is not a crash of the control plane, and
 * builds can move to a builder node unchanged. The job writes into the same image store (atomic
 * renames), so the control plane reads the result from disk and then imports it into the store's
image records (ImageStore.refresh). `userError` recognises the job's
 * message for a caller's mistake (a 400) from a failure of the job itself (a 500).
 */
export function runImageJob(
  dataDir: string,
  args: string[],
  opts: { log?: (line: string) => void; userError?: RegExp; signal?: AbortSignal; layerDir?: string } = {},
): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(process.execPath, [CLI, 'image', ...args, '--data-dir', dataDir], {
      stdio: ['ignore', 'pipe', 'pipe'],
      // The job writes layers where the control plane keeps them (a shared --layer-dir, say).
      env: { ...process.env, DSEC_DATA_DIR: dataDir, ...(opts.layerDir ? { DSEC_LAYER_DIR: opts.layerDir } : {}) },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr.on('data', (d: Buffer) => {
      stderr += d.toString();
      for (const line of d.toString().split('\n')) if (line.trim()) opts.log?.(line);
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), JOB_TIMEOUT_MS);
    const onAbort = (): void => void child.kill('SIGKILL');
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    child.on('error', (err) => reject(new ApiError('INTERNAL', `could not start the image job: ${err.message}`)));
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      if (code === 0) return resolvePromise(stdout);
      const last = stderr
        .trim()
        .split('\n')
        .filter(Boolean)
        .slice(-5)
        .join('\n')
        .replace(/^dsec: /, '');
      const why = signal ? `the image job was stopped (${signal})` : last || `the image job exited with ${code}`;
      if (opts.userError?.test(stderr)) reject(new ApiError('INVALID_REQUEST', why, { job: args[0] }));
      else reject(new ApiError('INTERNAL', `image ${args[0]} failed: ${why}`, { job: args[0], stderr: stderr.slice(-4000) }));
    });
  });
}

/** Where an uploaded archive waits for its import job (inside the data dir: same filesystem as the store). */
export function uploadPath(dataDir: string, tag: string): string {
  // Owned by this process (image/staging.ts): one killed mid-upload leaves nothing for long.
  return join(dataDir, 'tmp', `${stagingPrefix('upload')}${tag}.archive`);
}
