import type { Duplex } from 'node:stream';
import type { NetworkPolicyRequest, NetworkPolicyResult, NetworkPolicyState, PortWaitResult } from '@dsec/sdk/schema';
import type { Link } from '../../net/address-pool.js';
import type { NetworkPolicy } from '../../net/policy.js';
import { waitForPort } from '../ports/port-wait.js';
import { checkPolicy } from './sandbox-spec.js';
import type { TrajectoryLog } from '../trajectory-log.js';
import type { Caller } from './callers.js';
import type { SandboxLookup } from './sandbox-lookup.js';

/** A sandbox's network: its egress policy (a task's phase switch) and connections to its ports. */
export class NetworkService {
  constructor(private readonly deps: { lookup: SandboxLookup; trajectory: TrajectoryLog }) {}

  /** The egress policy a sandbox has now, as a request (resolved addresses, not the names given). */
  async currentPolicy(caller: Caller, id: string): Promise<NetworkPolicyRequest | undefined> {
    const s = await this.deps.lookup.get(caller, id);
    if (s.status !== 'running' && s.status !== 'paused') return undefined;
    const r = await this.deps.lookup.edgeOf(s).getNetwork(id);
    const allow = r.policy.allow.map((a) => (a.port === undefined ? a.cidr : `${a.cidr}:${a.port}`));
    return r.policy.mode === 'allow' ? { mode: 'allow', allow } : { mode: r.policy.mode };
  }

  /** Replaces a running sandbox's egress policy. */
  async setPolicy(caller: Caller, id: string, req: NetworkPolicyRequest): Promise<NetworkPolicyResult> {
    const r = await (await this.deps.lookup.runningOn(caller, id)).setNetwork(id, checkPolicy(req));
    const result = { ...networkState(r), appliedMs: r.appliedMs };
    // The request as given (names, not the addresses they resolved to): a replay resolves again.
    await this.deps.trajectory.append(id, { kind: 'network.set', request: { ...req }, result: { mode: result.mode, allow: result.allow } });
    return result;
  }

  /** A read of the policy the edge keeps: a paused sandbox has one too (it stays in force across the pause). */
  async getPolicy(caller: Caller, id: string): Promise<NetworkPolicyState> {
    const s = await this.deps.lookup.get(caller, id);
    if (s.status === 'paused') return networkState(await this.deps.lookup.edgeOf(s).getNetwork(id));
    return networkState(await (await this.deps.lookup.runningOn(caller, id)).getNetwork(id));
  }

  /**
   * A TCP connection to `port` on a running sandbox's loopback, as a byte stream (the port proxy
   * and tunnel); counts as activity for the idle timeout. Not logged in the trajectory: traffic
   * to a port is the sandbox's own, like its outbound traffic.
   */
  async openPort(caller: Caller, id: string, port: number): Promise<Duplex> {
    return (await this.deps.lookup.runningOn(caller, id)).openPort(id, port);
  }

  /**
   * Waits until the sandbox's port accepts (ports/port-wait.ts). The sandbox is looked up (and
   * its activity stamped) once; the tries go to its edge alone, not through the store.
   */
  async waitForPort(caller: Caller, id: string, port: number, timeoutMs: number, signal: AbortSignal): Promise<PortWaitResult> {
    const edge = await this.deps.lookup.runningOn(caller, id);
    return waitForPort((p) => edge.openPort(id, p), port, timeoutMs, signal);
  }
}

function networkState(r: { policy: NetworkPolicy; link?: Link }): NetworkPolicyState {
  const out: NetworkPolicyState = { mode: r.policy.mode, allow: r.policy.allow };
  if (r.link) {
    out.address = r.link.sandbox;
    out.gateway = r.link.host;
  }
  return out;
}
