import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { runTool } from '../host/run-tool.js';
import type { Link } from './address-pool.js';
import type { Nftables } from './nftables.js';

/** Host-side veth name for a sandbox: short (IFNAMSIZ is 16) and recognisable by the host guard. */
export function hostVeth(sandboxId: string): string {
  return `dsh${createHash('sha256').update(sandboxId).digest('hex').slice(0, 10)}`;
}

/** Each link is a /30 (address-pool.ts): the host end and the sandbox end. */
const LINK_PREFIX = 30;

/**
 * Gives a sandbox a link to the host: a veth pair whose sandbox end is eth0 with a link-local
 * address and a default route via the host end. Created only when a policy other than none is
 * applied; a sandbox with policy none has loopback only. Made over rtnetlink by the edge's
 * resident dsec-nft (one request, no process spawned: `ip` + `nsenter` took 4 spawns, 55–140 ms
 * on this host), all or nothing.
 */
export async function attachLink(nft: Nftables, sandboxId: string, pid: number, link: Link): Promise<void> {
  await detachLink(sandboxId); // a leftover from a crash
  await nft.addLink(pid, hostVeth(sandboxId), link.host, link.sandbox, LINK_PREFIX);
}

/** Removes the link (deleting one end of a veth deletes both). */
export async function detachLink(sandboxId: string): Promise<void> {
  const h = hostVeth(sandboxId);
  if (existsSync(`/sys/class/net/${h}`)) await runTool('ip', ['link', 'del', h]);
}
