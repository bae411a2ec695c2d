import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { NFT_HELPER_BINARY } from '../host/native-helpers.js';

/**
 * nftables (and sandbox links, addLink) for one edge without a process spawn per change: commands go to dsec-nft
 * (native/nft-helper.c), a small resident helper that runs them through libnftables (nftables'
 * own library) in the host's or a sandbox's network namespace, one atomic transaction each —
 * exactly what `nft -f` does, minus a fork+exec of nsenter and nft (100–300 ms on a loaded host).
 *
 * Why a helper process and not libnftables inside the edge (tried first): the kernel makes a
 * transaction committed by a process that has just forked wait 10–40 ms, and the edge forks for
 * every crun call; the helper never forks, so a commit costs about a millisecond. One helper per
 * edge (not per sandbox), started on first use, gone when its stdin closes (also when the edge
 * dies). Requests are answered in order, one at a time.
 */
export class NftError extends Error {
  override readonly name = 'NftError';
}

interface Pending {
  /** What an error is prefixed with: `nft` or `link <host end>`. */
  what: string;
  resolve: (output: string) => void;
  reject: (err: Error) => void;
}

export class Nftables {
  #child: ChildProcessWithoutNullStreams | undefined;
  #pending: Pending[] = [];
  #buf = Buffer.alloc(0);
  #stderr = '';

  constructor(private readonly binary = NFT_HELPER_BINARY) {}

  /** Runs nft commands (ruleset text as `nft -f` reads it) in the host's network namespace; resolves to nft's output. */
  run(commands: string): Promise<string> {
    return this.#request(0, commands);
  }

  /** Runs nft commands inside the network namespace of process `pid` (a sandbox's init). */
  runInNetns(pid: number, commands: string): Promise<string> {
    if (!Number.isInteger(pid) || pid <= 0) return Promise.reject(new NftError(`no such process: ${pid}`));
    return this.#request(pid, commands);
  }

  /**
   * Gives the sandbox whose netns holds process `pid` its link over rtnetlink, in the helper (no
   * `ip`/`nsenter` spawns): a veth pair whose host end `hostName` gets `hostAddress`/`prefix` (IPv6
   * off) and whose other end is born in the sandbox's netns as eth0 with `sandboxAddress`/`prefix`
   * and a default route via `hostAddress`. All or nothing: on failure the pair is gone again.
   */
  addLink(pid: number, hostName: string, hostAddress: string, sandboxAddress: string, prefix: number): Promise<void> {
    if (!Number.isInteger(pid) || pid <= 0) return Promise.reject(new NftError(`no such process: ${pid}`));
    if (!/^[\w.-]{1,15}$/.test(hostName) || !Number.isInteger(prefix) || [hostAddress, sandboxAddress].some((a) => !/^\d{1,3}(\.\d{1,3}){3}$/.test(a)))
      return Promise.reject(new NftError(`malformed link: ${hostName} ${hostAddress} ${sandboxAddress}/${prefix}`));
    return this.#send(`link ${hostName}`, `link ${pid} ${hostName} ${hostAddress} ${sandboxAddress} ${prefix}\n`).then(() => undefined);
  }

  /** Stops the helper (it exits when its stdin closes). */
  async close(): Promise<void> {
    const child = this.#child;
    if (!child) return;
    const exited = new Promise<void>((res) => child.once('exit', () => res()));
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  }

  #request(pid: number, commands: string): Promise<string> {
    const body = Buffer.from(commands);
    return this.#send('nft', `${pid} ${body.length}\n`, body);
  }

  #send(what: string, header: string, body?: Buffer): Promise<string> {
    const child = this.#ensure();
    return new Promise<string>((resolve, reject) => {
      if (this.#pending.length === 0) this.#hold(child, true);
      this.#pending.push({ what, resolve, reject });
      child.stdin.write(header);
      if (body) child.stdin.write(body);
    });
  }

  #ensure(): ChildProcessWithoutNullStreams {
    if (this.#child) return this.#child;
    const child = spawn(this.binary, [], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.#child = child;
    this.#buf = Buffer.alloc(0);
    this.#stderr = '';
    child.stdout.on('data', (chunk: Buffer) => {
      this.#buf = Buffer.concat([this.#buf, chunk]);
      this.#drain();
    });
    child.stderr.setEncoding('utf8').on('data', (d: string) => (this.#stderr = (this.#stderr + d).slice(-4096)));
    const fail = (why: string): void => {
      if (this.#child !== child) return;
      this.#child = undefined;
      const err = new NftError(`dsec-nft ${why}${this.#stderr ? `: ${this.#stderr.trim()}` : ''}`);
      for (const p of this.#pending.splice(0)) p.reject(err);
    };
    child.on('error', (err) => fail(`could not run (${err.message}; run scripts/setup to build it)`));
    child.on('exit', (code, signal) => fail(`exited (${signal ?? code})`));
    child.stdin.on('error', () => undefined); // a dead helper: reported by 'exit'
    // An idle helper must not keep the edge's process alive; one with answers due must.
    child.unref();
    this.#hold(child, false);
    return child;
  }

  #hold(child: ChildProcessWithoutNullStreams, on: boolean): void {
    // The process handle too: when the helper dies its pipes close first, and with only they
    // held, the loop could end before the exit that fails the calls in flight is seen.
    if (on) child.ref();
    else child.unref();
    for (const s of [child.stdin, child.stdout, child.stderr]) {
      const h = s as unknown as { ref?: () => void; unref?: () => void };
      if (on) h.ref?.();
      else h.unref?.();
    }
  }

  /** Answers are `ok|err <length>\n<bytes>`, in request order. */
  #drain(): void {
    for (;;) {
      const nl = this.#buf.indexOf(10);
      if (nl < 0) return;
      const m = /^(ok|err) (\d+)$/.exec(this.#buf.subarray(0, nl).toString('latin1'));
      if (!m) {
        this.#child?.kill('SIGKILL');
        return;
      }
      const len = Number(m[2]);
      if (this.#buf.length < nl + 1 + len) return;
      const text = this.#buf.subarray(nl + 1, nl + 1 + len).toString('utf8');
      this.#buf = this.#buf.subarray(nl + 1 + len);
      const p = this.#pending.shift();
      if (this.#pending.length === 0 && this.#child) this.#hold(this.#child, false);
      if (m[1] === 'ok') p?.resolve(text);
      else p?.reject(new NftError(`${p.what}: ${text.trim() || 'failed'}`));
    }
  }
}
