import { claimLinkBlock, releaseLinkBlock } from '../host/host-claims.js';
import { AddressPool, type Link } from './address-pool.js';
import { HostGuard } from './host-guard.js';
import { Nftables } from './nftables.js';
import type { NetworkPolicy } from './policy.js';
import { attachLink, detachLink } from './sandbox-network.js';

/** A sandbox's network as its record keeps it: the policy in force and its link, once it has one. */
export interface SandboxNetwork {
  policy: NetworkPolicy;
  link?: Link;
}

/** The ruleset text for a sandbox's netns under a policy (containers and VMs filter different hooks). */
export type RulesetFor = (policy: NetworkPolicy, gateway: string | undefined) => string;

/**
 * One node's sandbox links, shared by every backend on it (containers and VMs): the edge's one
 * address pool (two pools of one edge would hand out the same subnets), its host guard table and
 * its dsec-nft helper. The guard is in place while any sandbox of any backend has a link.
 */
export class NodeLinks {
  readonly nft = new Nftables();
  readonly #guard: HostGuard;
  readonly #pool: AddressPool;
  /** Link indices in use, by every backend. */
  readonly #held = new Set<number>();

  constructor(edgeId: string) {
    this.#guard = new HostGuard(edgeId, this.nft);
    this.#pool = new AddressPool(edgeId, { claim: claimLinkBlock, release: releaseLinkBlock });
  }

  /** Records the link of an adopted sandbox; false when another edge now claims its block. */
  adopt(link: Link): boolean {
    this.#held.add(link.index);
    return this.#pool.claim(link.index);
  }

  release(link: Link | undefined): void {
    if (!link || !this.#held.delete(link.index)) return;
    this.#pool.release(link.index);
  }

  get anyHeld(): boolean {
    return this.#held.size > 0;
  }

  /** After adoption: the guard is installed when some sandbox has a link, else this edge's table (left by a crash) is removed. */
  async settleGuard(): Promise<void> {
    if (this.anyHeld) await this.#guard.ensure();
    else await this.#guard.remove();
  }

  /**
   * Before a sandbox whose netns holds process `pid` is torn down: dsec-nft drops the context it
   * keeps for that netns (which holds the netns, its veth included). Never fails the teardown:
   * a context left goes at the helper's next request once the process is gone.
   */
  async forget(pid: number | undefined): Promise<void> {
    if (!pid) return;
    await this.nft.forget(pid).catch(() => undefined);
  }

  /** At shutdown: the guard goes unless sandboxes that outlive the edge still have links. */
  async close(): Promise<void> {
    if (!this.anyHeld) await this.#guard.remove();
    await this.nft.close();
  }

  /**
   * Applies a policy to the sandbox whose netns holds process `pid`. The sandbox gets its link
   * (veth, address, route: one rtnetlink request to dsec-nft) the first time a policy other than none is
   * applied, and keeps it until it ends: a later switch, in either direction, is then one nft
   * transaction through dsec-nft (about a millisecond). Under none the ruleset refuses everything
   * but loopback, so a kept link carries nothing. A link made for a ruleset that then fails is
   * taken down again.
   */
  async apply(
    id: string,
    pid: number,
    current: SandboxNetwork | undefined,
    policy: NetworkPolicy,
    ruleset: RulesetFor,
  ): Promise<SandboxNetwork> {
    let link = current?.link;
    let fresh: Link | undefined;
    if (!link && policy.mode !== 'none') {
      await this.#guard.ensure();
      link = fresh = this.#pool.take();
      this.#held.add(fresh.index);
    }
    try {
      if (fresh) await attachLink(this.nft, id, pid, fresh);
      await this.nft.runInNetns(pid, ruleset(policy, link?.host));
    } catch (err) {
      if (fresh) {
        await detachLink(id);
        this.release(fresh);
      }
      throw err;
    }
    return link ? { policy, link } : { policy };
  }
}
