import type { Link } from '../../../net/address-pool.js';
import type { NodeLinks } from '../../../net/node-links.js';
import { sandboxRuleset, type NetworkPolicy } from '../../../net/policy.js';
import { resolvePolicy } from '../../node/network-request.js';
import type { EdgeNetworkRequest } from '../../protocol/edge-api.js';
import type { LiveSandbox } from './live-sandbox.js';
import type { SandboxRecord, SandboxRecords } from './sandbox-record.js';

/** Replaces the egress policy of a running sandbox; takes effect in one nft transaction. */
export async function setNetwork(
  l: LiveSandbox,
  req: EdgeNetworkRequest,
  node: { links: NodeLinks; records: SandboxRecords },
): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
  const policy = await resolvePolicy(req);
  const t0 = performance.now();
  await applyNetwork(node.links, l.record, policy);
  node.records.save(l.record);
  const out: { policy: NetworkPolicy; link?: Link; appliedMs: number } = {
    policy,
    appliedMs: Math.round((performance.now() - t0) * 100) / 100,
  };
  if (l.record.network?.link) out.link = l.record.network.link;
  return out;
}

export function getNetwork(l: LiveSandbox): { policy: NetworkPolicy; link?: Link } {
  const { network } = l.record;
  const out: { policy: NetworkPolicy; link?: Link } = { policy: network?.policy ?? { mode: 'none', allow: [] } };
  if (network?.link) out.link = network.link;
  return out;
}

/** See NodeLinks.apply: the link on first use, then one nft transaction per switch. */
export async function applyNetwork(links: NodeLinks, record: SandboxRecord, policy: NetworkPolicy): Promise<void> {
  record.network = await links.apply(record.id, record.pid ?? 0, record.network, policy, sandboxRuleset);
}
