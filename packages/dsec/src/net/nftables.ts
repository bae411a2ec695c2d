import { closeSync, openSync } from 'node:fs';
import koffi from 'koffi';
import { CLONE_NEWNET, setns } from '../host/syscalls.js';

/**
 * nftables without spawning nft: libnftables (the library the nft tool is itself a thin shell
 * over, installed with it) called in-process through koffi. A ruleset goes in as the same text
 * `nft -f` reads and is committed as one netlink transaction, so it is atomic exactly as before;
 * what goes away is a fork+exec of nsenter and nft per change, which on a loaded host cost
 * 100–300 ms and now costs well under a millisecond once warm.
 *
 * A ruleset for a sandbox goes into the sandbox's network namespace by moving this thread there
 * with setns(2) for the duration of one synchronous call: libnftables opens its netlink socket
 * when the context is created, in the thread's namespace at that moment, so the context is made
 * and freed inside the window. No JavaScript runs on this thread meanwhile, and libuv's worker
 * threads keep their own namespaces, so nothing else can open a socket in the sandbox's netns.
 */

const NFT_CTX_DEFAULT = 0;

interface Lib {
  ctxNew: (flags: number) => unknown;
  ctxFree: (ctx: unknown) => void;
  bufferOutput: (ctx: unknown) => number;
  bufferError: (ctx: unknown) => number;
  outputBuffer: (ctx: unknown) => string | null;
  errorBuffer: (ctx: unknown) => string | null;
  runFromBuffer: (ctx: unknown, buf: string) => number;
}

let lib: Lib | undefined;

function load(): Lib {
  if (lib) return lib;
  let so: ReturnType<typeof koffi.load>;
  try {
    so = koffi.load('libnftables.so.1');
  } catch (err) {
    throw new Error(`libnftables.so.1 cannot be loaded (install the nftables package): ${(err as Error).message}`);
  }
  lib = {
    ctxNew: so.func('void *nft_ctx_new(uint32_t flags)'),
    ctxFree: so.func('void nft_ctx_free(void *ctx)'),
    bufferOutput: so.func('int nft_ctx_buffer_output(void *ctx)'),
    bufferError: so.func('int nft_ctx_buffer_error(void *ctx)'),
    outputBuffer: so.func('const char *nft_ctx_get_output_buffer(void *ctx)'),
    errorBuffer: so.func('const char *nft_ctx_get_error_buffer(void *ctx)'),
    runFromBuffer: so.func('int nft_run_cmd_from_buffer(void *ctx, const char *buf)'),
  };
  return lib;
}

export class NftError extends Error {
  override readonly name = 'NftError';
}

/** Runs nft commands (ruleset text, as `nft -f -` reads it) in this thread's current netns; returns nft's output. */
function runHere(l: Lib, commands: string): string {
  const ctx = l.ctxNew(NFT_CTX_DEFAULT);
  if (!ctx) throw new NftError('nft_ctx_new failed');
  try {
    l.bufferOutput(ctx);
    l.bufferError(ctx);
    if (l.runFromBuffer(ctx, commands) !== 0) throw new NftError(`nft: ${(l.errorBuffer(ctx) ?? '').trim() || 'failed'}`);
    return l.outputBuffer(ctx) ?? '';
  } finally {
    l.ctxFree(ctx);
  }
}

/** Runs nft commands in the host's (this process's) network namespace. */
export function nft(commands: string): string {
  return runHere(load(), commands);
}

/** Runs nft commands inside the network namespace of process `pid` (a sandbox's init). */
export function nftInNetns(pid: number, commands: string): string {
  const l = load();
  const target = openSync(`/proc/${pid}/ns/net`, 'r');
  let home: number | undefined;
  try {
    home = openSync('/proc/thread-self/ns/net', 'r');
    setns(target, CLONE_NEWNET);
    try {
      return runHere(l, commands);
    } finally {
      returnHome(home);
    }
  } finally {
    closeSync(target);
    if (home !== undefined) closeSync(home);
  }
}

/**
 * Back to our own netns. If that ever failed, this thread would go on opening sockets inside a
 * sandbox (its API clients, DNS lookups): the process stops instead, and a restarted edge adopts
 * its sandboxes.
 */
function returnHome(home: number): void {
  try {
    setns(home, CLONE_NEWNET);
  } catch (err) {
    process.stderr.write(`dsec: cannot return to the host network namespace (${(err as Error).message}); stopping\n`);
    process.abort();
  }
}
