import { createHash } from 'node:crypto';
import { existsSync, writeFileSync } from 'node:fs';
import { runToolOrThrow, runTool } from '../host/run-tool.js';
import type { Link } from './address-pool.js';

/** Host-side veth name for a sandbox: short (IFNAMSIZ is 16) and recognisable by the host guard. */
export function hostVeth(sandboxId: string): string {
  return `dsh${createHash('sha256').update(sandboxId).digest('hex').slice(0, 10)}`;
}

function peerVeth(sandboxId: string): string {
  return `dsp${createHash('sha256').update(sandboxId).digest('hex').slice(0, 10)}`;
}

/** Runs a tool inside the network namespace of `pid` (the sandbox's init). */
function inNetns(pid: number, tool: string, args: string[], input?: string): Promise<unknown> {
  return runToolOrThrow('nsenter', [`--target=${pid}`, '--net', '--', tool, ...args], input === undefined ? {} : { input });
}

/**
 * Gives a sandbox a link to the host: a veth pair whose sandbox end becomes eth0 with a
 * link-local address and a default route via the host end. Created only when a policy other
 * than none is applied; a sandbox with policy none has loopback only.
 */
export async function attachLink(sandboxId: string, pid: number, link: Link): Promise<void> {
  const h = hostVeth(sandboxId);
  const p = peerVeth(sandboxId);
  await detachLink(sandboxId); // a leftover from a crash
  await runToolOrThrow('ip', ['-batch', '-'], {
    input: [`link add ${h} type veth peer name ${p}`, `link set ${p} netns ${pid}`, `addr add ${link.host}/30 dev ${h}`, ''].join('\n'),
  });
  // No IPv6 on the host end: a sandbox must not be able to install routes with router adverts.
  try {
    writeFileSync(`/proc/sys/net/ipv6/conf/${h}/disable_ipv6`, '1');
  } catch {
    // IPv6 disabled host-wide
  }
  await runToolOrThrow('ip', ['link', 'set', h, 'up']);
  await inNetns(pid, 'ip', ['-batch', '-'], [`link set ${p} name eth0`, `addr add ${link.sandbox}/30 dev eth0`, 'link set eth0 up', `route add default via ${link.host}`, ''].join('\n'));
}

/** Removes the link (deleting one end of a veth deletes both). */
export async function detachLink(sandboxId: string): Promise<void> {
  const h = hostVeth(sandboxId);
  if (existsSync(`/sys/class/net/${h}`)) await runTool('ip', ['link', 'del', h]);
}
