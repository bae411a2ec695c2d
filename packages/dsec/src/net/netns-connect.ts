import { closeSync, openSync, readFileSync } from 'node:fs';
import { Socket } from 'node:net';
import { Worker } from 'node:worker_threads';

export interface NetnsConnectRequest {
  seq: number;
  nsFd: number;
  port: number;
  timeoutMs: number;
}
export type NetnsConnectReply = { seq: number; fd: number } | { seq: number; errno: number; step: 'setns' | 'connect' };

/** Why a connect into a sandbox failed, by errno name: the caller turns it into an API error. */
export class NetnsConnectError extends Error {
  override readonly name = 'NetnsConnectError';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const ERRNO: Record<number, string> = {
  1: 'EPERM',
  2: 'ENOENT',
  22: 'EINVAL',
  101: 'ENETUNREACH',
  110: 'ETIMEDOUT',
  111: 'ECONNREFUSED',
  115: 'EINPROGRESS',
};

/** How long a connect may wait for the sandbox's kernel to answer a SYN (a full listen backlog). */
const CONNECT_TIMEOUT_MS = 3000;

/**
 * Connects to a TCP port on the loopback of a sandbox's network namespace, from the host: the
 * sandbox needs no link, so this works under network policy `none` too, and nothing of the
 * platform runs inside the sandbox. The socket is made inside the namespace by one thread of the
 * edge (netns-connect-worker.ts) and used from the main thread like any other.
 */
export class NetnsConnector {
  #worker: Worker | undefined;
  #seq = 0;
  readonly #waiting = new Map<number, (r: NetnsConnectReply) => void>();

  #thread(): Worker {
    if (this.#worker) return this.#worker;
    const w = new Worker(new URL('./netns-connect-worker.js', import.meta.url));
    w.on('message', (r: NetnsConnectReply) => {
      this.#waiting.get(r.seq)?.(r);
      this.#waiting.delete(r.seq);
      if (this.#waiting.size === 0) w.unref();
    });
    const fail = (why: string): void => {
      if (this.#worker === w) this.#worker = undefined;
      for (const [seq, done] of this.#waiting) done({ seq, errno: 0, step: why === 'exit' ? 'setns' : 'connect' });
      this.#waiting.clear();
    };
    w.on('error', () => fail('error'));
    w.on('exit', () => fail('exit'));
    w.unref();
    this.#worker = w;
    return w;
  }

  /**
   * A socket connected to `port` on the loopback (127.0.0.1, else ::1) of the network namespace
   * of `pid`, which must be a process in the cgroup `cgroup` (checked after the namespace is
   * opened, so a pid reused by another process is never entered).
   */
  async connect(pid: number, cgroup: string, port: number): Promise<Socket> {
    let nsFd: number;
    try {
      nsFd = openSync(`/proc/${pid}/ns/net`, 'r');
    } catch {
      throw new NetnsConnectError('ENOENT', `the sandbox's init process (pid ${pid}) is gone`);
    }
    try {
      if (!inCgroup(pid, cgroup)) throw new NetnsConnectError('ENOENT', `pid ${pid} is no longer the sandbox's (not in cgroup ${cgroup})`);
      const seq = ++this.#seq;
      const w = this.#thread();
      const reply = await new Promise<NetnsConnectReply>((resolve) => {
        this.#waiting.set(seq, resolve);
        w.ref();
        w.postMessage({ seq, nsFd, port, timeoutMs: CONNECT_TIMEOUT_MS } satisfies NetnsConnectRequest);
      });
      if ('fd' in reply) return new Socket({ fd: reply.fd, readable: true, writable: true, allowHalfOpen: true });
      const code = ERRNO[reply.errno] ?? (reply.errno ? `E${reply.errno}` : 'EIO');
      if (reply.step === 'setns') throw new NetnsConnectError(code, `could not enter the sandbox's network namespace (${code})`);
      if (code === 'ECONNREFUSED')
        throw new NetnsConnectError(code, `nothing listens on port ${port} in the sandbox (connection refused on 127.0.0.1 and ::1)`);
      if (code === 'EINPROGRESS' || code === 'ETIMEDOUT')
        throw new NetnsConnectError(
          'ETIMEDOUT',
          `port ${port} in the sandbox did not accept the connection within ${CONNECT_TIMEOUT_MS} ms (listen backlog full?)`,
        );
      throw new NetnsConnectError(code, `could not connect to port ${port} in the sandbox (${code})`);
    } finally {
      closeSync(nsFd);
    }
  }

  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = undefined;
    if (w) await w.terminate();
  }
}

function inCgroup(pid: number, cgroup: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/cgroup`, 'utf8')
      .split('\n')
      .some((l) => l.endsWith(`/${cgroup}`) || l.includes(`/${cgroup}/`));
  } catch {
    return false;
  }
}
