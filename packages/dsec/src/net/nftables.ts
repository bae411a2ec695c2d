import { NFT_HELPER_BINARY } from '../host/native-helpers.js';
import { ResidentHelper, type DecodedAnswer } from '../host/resident-helper.js';

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
 * dies). Requests are answered in order, one at a time. It keeps one libnftables context per
 * network namespace: freeing one right after a transaction that deleted anything (every switch
 * replaces the table) waits 10-15 ms in the kernel, so a context made and freed per request made
 * back-to-back switches cost that each (see nft-helper.c); `forget` drops a sandbox's.
 */
export class NftError extends Error {
  override readonly name = 'NftError';
}

/** A helper's answer: `ok` with nft's output, or `err` with why. */
interface NftAnswer {
  ok: boolean;
  text: string;
}

export class Nftables {
  readonly #helper: ResidentHelper<NftAnswer>;

  constructor(binary = NFT_HELPER_BINARY) {
    this.#helper = new ResidentHelper(binary, { name: 'dsec-nft', error: (m) => new NftError(m), decode: decodeAnswer });
  }

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
    if (
      !/^[\w.-]{1,15}$/.test(hostName) ||
      !Number.isInteger(prefix) ||
      [hostAddress, sandboxAddress].some((a) => !/^\d{1,3}(\.\d{1,3}){3}$/.test(a))
    )
      return Promise.reject(new NftError(`malformed link: ${hostName} ${hostAddress} ${sandboxAddress}/${prefix}`));
    return this.#send(`link ${hostName}`, `link ${pid} ${hostName} ${hostAddress} ${sandboxAddress} ${prefix}\n`).then(() => undefined);
  }

  /**
   * The sandbox whose netns holds process `pid` is going: the helper drops the nftables context
   * it keeps for that netns (whose socket holds the netns, and with it the veth, alive). Asked
   * before the sandbox's processes die; one it is not told about goes at the helper's next
   * request after its process is gone.
   */
  async forget(pid: number): Promise<void> {
    if (!Number.isInteger(pid) || pid <= 0) return;
    await this.#send('forget', `forget ${pid}\n`);
  }

  /** Stops the helper (it exits when its stdin closes). */
  close(): Promise<void> {
    return this.#helper.close();
  }

  #request(pid: number, commands: string): Promise<string> {
    const body = Buffer.from(commands);
    return this.#send('nft', `${pid} ${body.length}\n`, body);
  }

  /** `what` prefixes the helper's error text: `nft` or `link <host end>`. */
  async #send(what: string, header: string, body?: Buffer): Promise<string> {
    const answer = await this.#helper.request(() => (body ? [header, body] : [header]));
    if (!answer.ok) throw new NftError(`${what}: ${answer.text.trim() || 'failed'}`);
    return answer.text;
  }
}

/** Answers are `ok|err <length>\n<bytes>`, in request order. */
function decodeAnswer(buf: Buffer): DecodedAnswer<NftAnswer> | 'incomplete' | 'garbled' {
  const nl = buf.indexOf(10);
  if (nl < 0) return 'incomplete';
  const m = /^(ok|err) (\d+)$/.exec(buf.subarray(0, nl).toString('latin1'));
  if (!m) return 'garbled';
  const len = Number(m[2]);
  if (buf.length < nl + 1 + len) return 'incomplete';
  return { size: nl + 1 + len, answer: { ok: m[1] === 'ok', text: buf.subarray(nl + 1, nl + 1 + len).toString('utf8') } };
}
