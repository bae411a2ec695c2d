import { openSync } from 'node:fs';
import { parentPort } from 'node:worker_threads';
import koffi from 'koffi';
import type { NetnsConnectReply, NetnsConnectRequest } from './netns-connect.js';

/**
 * The body of the netns-connect thread: for each request, setns(2) this thread into the sandbox's
 * network namespace, make a TCP socket there and connect it to the port on loopback, then setns
 * back. A socket belongs to the namespace it was made in for its whole life, so the fd, used by
 * the edge's main thread afterwards, still reaches the sandbox's loopback. setns of a network
 * namespace changes only the calling thread, so the main thread never leaves the host's.
 */
const libc = koffi.load('libc.so.6');
const setns = libc.func('int setns(int fd, int nstype)');
const socket = libc.func('int socket(int domain, int type, int protocol)');
const connect = libc.func('int connect(int fd, const uint8_t *addr, uint32_t len)');
const setsockopt = libc.func('int setsockopt(int fd, int level, int name, const uint8_t *val, uint32_t len)');
const close = libc.func('int close(int fd)');

const CLONE_NEWNET = 0x40000000;
const AF_INET = 2;
const AF_INET6 = 10;
const SOCK_STREAM_CLOEXEC = 1 | 0o2000000;
const SOL_SOCKET = 1;
const SO_SNDTIMEO = 21;
const ECONNREFUSED = 111;

const home = openSync('/proc/thread-self/ns/net', 'r');

function sockaddr(family: number, port: number): Buffer {
  if (family === AF_INET) {
    const a = Buffer.alloc(16);
    a.writeUInt16LE(AF_INET, 0);
    a.writeUInt16BE(port, 2);
    a.set([127, 0, 0, 1], 4);
    return a;
  }
  const a = Buffer.alloc(28);
  a.writeUInt16LE(AF_INET6, 0);
  a.writeUInt16BE(port, 2);
  a[23] = 1; // ::1
  return a;
}

/** One connect attempt in the current namespace: the connected fd, or -errno. */
function tryConnect(family: number, port: number, timeoutMs: number): number {
  const fd = socket(family, SOCK_STREAM_CLOEXEC, 0) as number;
  if (fd < 0) return -koffi.errno();
  // Bounds a connect whose SYN goes unanswered (a full listen backlog): loopback answers at once otherwise.
  const tv = Buffer.alloc(16);
  tv.writeBigInt64LE(BigInt(Math.floor(timeoutMs / 1000)), 0);
  tv.writeBigInt64LE(BigInt((timeoutMs % 1000) * 1000), 8);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, tv, 16);
  const addr = sockaddr(family, port);
  if ((connect(fd, addr, addr.length) as number) === 0) return fd;
  const errno = koffi.errno();
  close(fd);
  return -errno;
}

function handle(req: NetnsConnectRequest): NetnsConnectReply {
  if ((setns(req.nsFd, CLONE_NEWNET) as number) !== 0) return { seq: req.seq, errno: koffi.errno(), step: 'setns' };
  try {
    // 127.0.0.1 first; a server listening on ::1 only is found on the second try.
    let r = tryConnect(AF_INET, req.port, req.timeoutMs);
    if (r === -ECONNREFUSED) {
      const r6 = tryConnect(AF_INET6, req.port, req.timeoutMs);
      if (r6 >= 0) r = r6;
    }
    return r >= 0 ? { seq: req.seq, fd: r } : { seq: req.seq, errno: -r, step: 'connect' };
  } finally {
    // Never leave this thread in a sandbox's namespace: if going home fails, the thread must die.
    if ((setns(home, CLONE_NEWNET) as number) !== 0) {
      process.exit(70);
    }
  }
}

parentPort!.on('message', (req: NetnsConnectRequest) => parentPort!.postMessage(handle(req)));
