import { lookup } from 'node:dns/promises';
import { isIPv4 } from 'node:net';
import { VM_TAP } from './vm-network.js';

/** A sandbox's egress policy: none (loopback only), allow (a list), or open. */
export type NetworkMode = 'none' | 'allow' | 'open';

export interface AllowRule {
  /** IPv4 address or CIDR. */
  cidr: string;
  port?: number;
}

export interface NetworkPolicy {
  mode: NetworkMode;
  allow: AllowRule[];
}

/** Never reachable from a sandbox, whatever its policy: cloud metadata services. */
export const ALWAYS_DENIED = ['169.254.169.254/32'];

export class PolicyError extends Error {
  override readonly name = 'PolicyError';
}

/** `10.0.0.0/8`, `1.2.3.4:443`, `mirror.example:80`, `pypi.org` → rules (host names resolved now, on the host). */
export async function parseAllowList(entries: string[], resolve: (host: string) => Promise<string[]> = resolveHost): Promise<AllowRule[]> {
  const rules: AllowRule[] = [];
  for (const raw of entries) {
    const bad = allowEntryError(raw);
    if (bad) throw new PolicyError(bad);
    const m = /^(?<host>[^:/]+)(?:\/(?<bits>\d{1,2}))?(?::(?<port>\d{1,5}))?$/.exec(raw.trim());
    if (!m?.groups) throw new PolicyError(`cannot parse allow entry ${JSON.stringify(raw)}`);
    const { host, bits, port } = m.groups as { host: string; bits?: string; port?: string };
    const portNum = port === undefined ? undefined : Number(port);
    if (portNum !== undefined && (portNum < 1 || portNum > 65535)) throw new PolicyError(`port out of range in ${JSON.stringify(raw)}`);
    if (bits !== undefined && (Number(bits) > 32 || !isIPv4(host))) throw new PolicyError(`bad CIDR ${JSON.stringify(raw)}`);
    const addrs = isIPv4(host) ? [host] : await resolve(host);
    if (addrs.length === 0) throw new PolicyError(`host ${host} resolved to no IPv4 address`);
    for (const a of addrs) {
      const rule: AllowRule = { cidr: `${a}/${bits ?? 32}` };
      if (portNum !== undefined) rule.port = portNum;
      rules.push(rule);
    }
  }
  return rules;
}

/** A host name as DNS allows it (RFC 1123 labels), so nothing else reaches a resolver or a ruleset. */
const HOST_NAME = /^(?=.{1,253}$)([a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*\.?$/i;

/**
 * What is wrong with an allow entry's syntax (undefined when nothing is), without resolving it:
 * the control plane checks syntax, the edge that enforces the rules resolves host names.
 */
export function allowEntryError(raw: string): string | undefined {
  const m = /^(?<host>[^:/]+)(?:\/(?<bits>\d{1,2}))?(?::(?<port>\d{1,5}))?$/.exec(raw.trim());
  if (!m?.groups) return `cannot parse allow entry ${JSON.stringify(raw)}: use CIDR, CIDR:port, host or host:port`;
  const { host, bits, port } = m.groups as { host: string; bits?: string; port?: string };
  if (!isIPv4(host) && !HOST_NAME.test(host))
    return `allow entry ${JSON.stringify(raw)}: ${JSON.stringify(host)} is neither an IPv4 address nor a host name`;
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) return `port out of range in ${JSON.stringify(raw)}`;
  if (bits !== undefined && (Number(bits) > 32 || !isIPv4(host))) return `bad CIDR ${JSON.stringify(raw)}`;
  return undefined;
}

async function resolveHost(host: string): Promise<string[]> {
  try {
    return (await lookup(host, { all: true, family: 4 })).map((a) => a.address);
  } catch (err) {
    throw new PolicyError(`cannot resolve ${host}: ${(err as Error).message}`);
  }
}

/**
 * The nftables ruleset inside a sandbox's network namespace. One atomic `nft -f` replaces it,
 * so a phase switch takes effect in one step. Only the output hook is filtered: replies to
 * allowed connections come back in; a connection to a destination no longer allowed is cut,
 * while allowed ones continue untouched. A new connection the policy forbids is refused (TCP
 * reset, "Connection refused"; other protocols an ICMP admin-prohibited).
 */
export function sandboxRuleset(policy: NetworkPolicy, gateway: string | undefined): string {
  return [
    'table inet dsec',
    'delete table inet dsec',
    'table inet dsec {',
    '  chain output {',
    `    type filter hook output priority 0; policy ${policy.mode === 'open' ? 'accept' : 'drop'};`,
    '    oif "lo" accept',
    ...egressRules(policy, gateway),
    '  }',
    '}',
    '',
  ].join('\n');
}

/**
 * The ruleset inside a VM's network namespace, where QEMU's tap (the guest's eth0) and the
 * sandbox link's eth0 meet. The guest's packets are forwarded, so the same egress rules as a
 * container's output chain filter the forward hook, for what arrives from the tap only (replies
 * go back untouched, as a container's input is). The guest reaches nothing in the netns itself,
 * and what it sends out is masqueraded to the link's sandbox address, so outside the netns a VM
 * looks exactly like a container (the host guard matches it the same way). The guest's own
 * kernel cannot loosen any of this: the rules live outside the VM.
 */
export function vmRuleset(policy: NetworkPolicy, gateway: string | undefined): string {
  const tap = `"${VM_TAP.name}"`;
  return [
    'table inet dsec',
    'delete table inet dsec',
    'table inet dsec {',
    '  chain input {',
    '    type filter hook input priority 0; policy accept;',
    `    iifname ${tap} drop`,
    '  }',
    '  chain forward {',
    `    type filter hook forward priority 0; policy ${policy.mode === 'open' ? 'accept' : 'drop'};`,
    `    iifname != ${tap} oifname ${tap} accept`,
    `    iifname != ${tap} drop`,
    ...egressRules(policy, gateway),
    '  }',
    '  chain postrouting {',
    '    type nat hook postrouting priority 100; policy accept;',
    `    iifname ${tap} oifname "eth0" masquerade`,
    '  }',
    '}',
    '',
  ].join('\n');
}

/** The egress rules of a chain whose default is drop (accept under open): the policy's allow list, then refusals. */
function egressRules(policy: NetworkPolicy, gateway: string | undefined): string[] {
  const never = [...ALWAYS_DENIED, ...(gateway ? [`${gateway}/32`] : [])];
  const lines = [`    ip daddr { ${never.join(', ')} } drop`, '    meta nfproto ipv6 drop'];
  if (policy.mode === 'allow') {
    for (const r of policy.allow) {
      if (r.port === undefined) lines.push(`    ip daddr ${r.cidr} accept`);
      else lines.push(`    ip daddr ${r.cidr} tcp dport ${r.port} accept`, `    ip daddr ${r.cidr} udp dport ${r.port} accept`);
    }
  }
  // Whatever is left is refused at once rather than dropped, so that an agent whose phase
  // forbids the network fails fast instead of waiting out a connect timeout.
  if (policy.mode !== 'open') lines.push('    meta l4proto tcp reject with tcp reset', '    reject with icmpx type admin-prohibited');
  return lines;
}
