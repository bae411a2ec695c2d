import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { CHUNK_FUSE_BINARY } from '../../../host/native-helpers.js';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import { tryUnmount } from '../layer-mounts.js';
import { abortFuseConnection, ensureFusectl, fuseConnectionOf } from './fuse-connection.js';

export interface ChunkSource {
  url: string;
  token?: string;
}

export interface ChunkDaemonOptions {
  /** `<nodeDir>/lazy`: the FUSE mount point (`mnt`), the chunk cache (`chunks`), pid and log files. */
  dir: string;
  /**
   * The blob store (`GET {url}/v1/blobs/{digest}` with Range) and its bearer token, written to
   * `chunks/source` (mode 0600) for the daemon at each start and adoption: the daemon rereads it
   * when it changes, so one adopted after an edge restart follows a store that moved.
   */
  source: () => ChunkSource;
  /** Attempts per chunk before the reader gets EIO. */
  retries: number;
  /** Cap on one attempt (connect + transfer of one chunk). */
  attemptTimeoutMs: number;
  connectTimeoutMs: number;
  /** The daemon died (or was found dead) while the edge relied on it; `reason` says how. */
  onDeath: (reason: string) => void;
  log?: Logger;
  binary?: string;
}

/** How often an adopted daemon (not our child: no exit event) is checked for life. */
const ADOPTED_POLL_MS = 500;
const MOUNT_WAIT_MS = 10_000;

/**
 * The node's one dsec-chunk-fuse process. It runs in its own session, so it outlives an edge
 * restart (the sandboxes on its layers keep reading); a restarted edge adopts it by its pid file.
 * When it dies the edge is told at once (exit event, or a poll for an adopted one); the FUSE
 * connection is aborted so nothing waits on it, and the edge fails the sandboxes that read from it.
 */
export class ChunkDaemon {
  readonly mountPoint: string;
  readonly cacheDir: string;
  readonly #pidFile: string;
  readonly #logFile: string;
  #pid: number | undefined;
  #child: ChildProcess | undefined;
  #poll: NodeJS.Timeout | undefined;
  #stopping = false;
  #starting: Promise<void> | undefined;

  constructor(private readonly opts: ChunkDaemonOptions) {
    this.mountPoint = join(opts.dir, 'mnt');
    this.cacheDir = join(opts.dir, 'chunks');
    this.#pidFile = join(opts.dir, 'daemon.pid');
    this.#logFile = join(opts.dir, 'daemon.log');
    mkdirSync(this.mountPoint, { recursive: true });
    mkdirSync(this.cacheDir, { recursive: true });
  }

  get pid(): number | undefined {
    return this.#pid;
  }

  get running(): boolean {
    return this.#pid !== undefined;
  }

  /** Starts the daemon, or adopts the one a previous edge left running; concurrent callers share one start. */
  ensure(): Promise<void> {
    if (this.#pid !== undefined) return Promise.resolve();
    this.#starting ??= this.#start().finally(() => (this.#starting = undefined));
    return this.#starting;
  }

  /**
   * At edge start: adopts a live daemon that still serves its mount; otherwise clears what a dead
   * one left (its connection is aborted and its mount detached). True when one was adopted.
   */
  adopt(): boolean {
    if (this.#pid !== undefined) return true;
    const pid = liveDaemonPid(this.opts.dir);
    if (pid !== undefined) {
      this.writeSource();
      this.#pid = pid;
      this.#watchAdopted();
      this.opts.log?.info({ pid }, 'adopted the running lazy layer daemon');
      return true;
    }
    this.clearMount();
    return false;
  }

  /** Names the blob store for the daemon (DIR/chunks/source: URL, then token; mode 0600). */
  writeSource(): ChunkSource {
    const src = this.opts.source();
    writeFileAtomic(join(this.cacheDir, 'source'), `${src.url}\n${src.token ?? ''}\n`, 0o600);
    return src;
  }

  /** Whether a dead daemon left its mount behind (so layers mounted from it are unreadable). */
  get mounted(): boolean {
    return fuseConnectionOf(this.mountPoint) !== undefined;
  }

  /** Stops the daemon (callers unmount every layer on it first) and removes its mount. */
  async stop(): Promise<void> {
    const pid = this.#pid;
    this.#stopping = true;
    try {
      if (pid !== undefined) {
        try {
          process.kill(pid, 'SIGTERM'); // libfuse leaves its loop and unmounts
        } catch {
          // already gone
        }
        const deadline = Date.now() + 3_000;
        while (isLiveProcess(pid) && Date.now() < deadline) await sleep(20);
        if (isLiveProcess(pid)) process.kill(pid, 'SIGKILL');
      }
      this.#forget();
      this.clearMount();
    } finally {
      this.#stopping = false;
    }
  }

  /**
   * Leaves the daemon running for the next edge to adopt (sandboxes still read from it), and stops
   * watching it: what happens to it from now on is that edge's to handle.
   */
  detach(): void {
    if (this.#poll) clearInterval(this.#poll);
    this.#poll = undefined;
    this.#child = undefined;
    this.#pid = undefined;
  }

  /** The last lines the daemon logged: what a failure report quotes. */
  logTail(lines = 5): string {
    try {
      return readFileSync(this.#logFile, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
    } catch {
      return '';
    }
  }

  async #start(): Promise<void> {
    this.clearMount();
    ensureFusectl();
    const { url } = this.writeSource();
    const log = openSync(this.#logFile, 'a');
    const args = [
      '--cache',
      this.cacheDir,
      '--retries',
      String(this.opts.retries),
      '--attempt-timeout-ms',
      String(this.opts.attemptTimeoutMs),
      '--connect-timeout-ms',
      String(this.opts.connectTimeoutMs),
      this.mountPoint,
    ];
    let child: ChildProcess;
    try {
      child = spawn(this.opts.binary ?? CHUNK_FUSE_BINARY, args, {
        detached: true, // its own session: an edge restart (or a ^C to `dsec up`) leaves it serving
        stdio: ['ignore', log, log],
        env: { PATH: process.env['PATH'] ?? '/usr/bin:/bin' },
      });
    } finally {
      closeSync(log);
    }
    const spawned = new Promise<void>((res, rej) => {
      child.once('spawn', res);
      child.once('error', rej);
    });
    await spawned;
    child.unref();
    const pid = child.pid!;
    let exited: string | undefined;
    child.once('exit', (code, signal) => {
      exited = signal ? `killed by ${signal}` : `exited with code ${code}`;
      if (this.#child === child) this.#died(exited);
    });
    const deadline = Date.now() + MOUNT_WAIT_MS;
    while (fuseConnectionOf(this.mountPoint) === undefined) {
      if (exited) throw new Error(`dsec-chunk-fuse ${exited} before mounting ${this.mountPoint}: ${this.logTail()}`);
      if (Date.now() > deadline) {
        child.kill('SIGKILL');
        throw new Error(`dsec-chunk-fuse did not mount ${this.mountPoint} within ${MOUNT_WAIT_MS} ms: ${this.logTail()}`);
      }
      await sleep(5);
    }
    this.#child = child;
    this.#pid = pid;
    writeFileSync(this.#pidFile, String(pid));
    this.opts.log?.info({ pid, mount: this.mountPoint, url }, 'lazy layer daemon started');
  }

  #watchAdopted(): void {
    this.#poll = setInterval(() => {
      if (this.#pid !== undefined && !isLiveProcess(this.#pid)) this.#died('found dead (adopted after an edge restart)');
    }, ADOPTED_POLL_MS);
    this.#poll.unref();
  }

  #died(how: string): void {
    if (this.#stopping) return;
    const pid = this.#pid;
    this.#forget();
    // Abort first: a reader blocked on the dead connection gets ENOTCONN now, not never.
    abortFuseConnection(this.mountPoint);
    const reason = `the lazy layer daemon dsec-chunk-fuse (pid ${pid}) ${how}`;
    this.opts.log?.error({ pid, log: this.logTail() }, reason);
    this.opts.onDeath(reason);
  }

  #forget(): void {
    if (this.#poll) clearInterval(this.#poll);
    this.#poll = undefined;
    this.#child = undefined;
    this.#pid = undefined;
    rmSync(this.#pidFile, { force: true });
  }

  /** Aborts and detaches whatever FUSE mount sits on the mount point (a dead daemon's). */
  clearMount(): void {
    clearDeadDaemonMount(this.opts.dir);
    try {
      mkdirSync(this.mountPoint, { recursive: true });
    } catch {
      // exists; an aborted mount may answer ENOTCONN until detached
    }
  }

  /** Removes the daemon's directories once nothing is mounted (the data dir is going away). */
  removeAll(): void {
    rmSync(this.opts.dir, { recursive: true, force: true });
    try {
      rmdirSync(this.mountPoint);
    } catch {
      // gone with the directory
    }
  }
}

/** The pid of a live daemon serving the lazy mount under `dir` (`<nodeDir>/lazy`), if there is one. */
export function liveDaemonPid(dir: string): number | undefined {
  const pid = readPid(join(dir, 'daemon.pid'));
  return pid !== undefined && isLiveProcess(pid) && fuseConnectionOf(join(dir, 'mnt')) !== undefined ? pid : undefined;
}

/** Aborts and detaches a dead daemon's mount under `dir` (for an edge that no longer runs lazily). */
export function clearDeadDaemonMount(dir: string): void {
  const mnt = join(dir, 'mnt');
  while (fuseConnectionOf(mnt) !== undefined) {
    abortFuseConnection(mnt);
    tryUnmount(mnt);
  }
}

function readPid(file: string): number | undefined {
  try {
    const pid = Number(readFileSync(file, 'utf8'));
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** Alive and not a zombie (an orphan here may be reparented to a PID 1 that never reaps). */
function isLiveProcess(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    if (state === 'Z' || state === 'X') return false;
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim().startsWith('dsec-chunk-fuse'.slice(0, 15));
  } catch {
    return false;
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
