import type { Logger } from 'pino';
import type { EdgeInfo } from './protocol/schemas.js';
import { LayerDeltaSender } from './protocol/layer-delta.js';

export interface JoinLoopOptions {
  /**
   * The control plane's URL; several, comma-separated, for control-plane replicas on one store:
   * the edge talks to one and moves to the next when it stops answering.
   */
  join: string;
  /** The cluster's join token. */
  token: string;
  /** This edge's id and the URL the control plane reaches it at. */
  id: string;
  url: string;
  pool: string;
  labels: Record<string, string>;
  cpuOvercommit: number;
  /** The edge's facts now: sent when it joins and with every heartbeat. */
  info: () => Promise<EdgeInfo>;
  log: Logger;
  /** Between heartbeats. @default 1000 */
  intervalMs?: number;
}

/** The cluster's registry, as the control plane names it at join (dsec control --registry). */
/** The control plane's answer to a join. */
interface JoinReply {
  state: string;
  registry?: JoinRegistryGrant;
  /** It takes cached layers as changes in heartbeats (edge/protocol/layer-delta.ts). */
  layerDeltas?: boolean;
}

export interface JoinRegistryGrant {
  repository: string;
  username?: string;
  password?: string;
}

export interface JoinedEdge {
  /** The cluster's registry, when the control plane that took the first join has one. */
  registry: JoinRegistryGrant | undefined;
  /** Resolves when the edge has left the cluster (drained and empty). */
  left: Promise<void>;
  /** Stops heartbeating (after the one in flight, if any). */
  stop(): Promise<void>;
}

/**
 * An edge's membership of a cluster, as every edge keeps it (`dsec edge`, and the benchmark's
 * simulated edge): join (POST /v1/cluster/edges), then a heartbeat with its facts every second
 * (PUT …/heartbeat), both under the cluster token. A 404 to a heartbeat (a control plane that
 * forgot it) makes it join again; a control plane that does not answer changes nothing here:
 * heartbeats keep trying. Once the control plane says `draining` and the edge is empty, it leaves
 * (DELETE …) and `left` resolves. The first join must work: it throws, since a wrong URL or token
 * is the operator's to fix now.
 */
export async function joinCluster(opts: JoinLoopOptions): Promise<JoinedEdge> {
  const { id, log } = opts;
  const joinUrls = opts.join
    .split(',')
    .map((u) => u.trim().replace(/\/$/, ''))
    .filter(Boolean);
  let current = 0;
  let joinUrl = joinUrls[0]!;
  /** The next replica, after one did not answer. */
  const failOver = (): void => {
    current = (current + 1) % joinUrls.length;
    joinUrl = joinUrls[current]!;
  };
  const auth = { authorization: `Bearer ${opts.token}`, 'content-type': 'application/json' };
  const registerAt = async (): Promise<JoinReply> => {
    const res = await fetch(`${joinUrl}/v1/cluster/edges`, {
      method: 'POST',
      headers: auth,
      body: JSON.stringify({
        id,
        url: opts.url,
        pool: opts.pool,
        labels: opts.labels,
        cpuOvercommit: opts.cpuOvercommit,
        info: await opts.info(),
      }),
      signal: AbortSignal.timeout(10_000),
    });
    if (!res.ok) throw new Error(`joining ${joinUrl} failed: HTTP ${res.status} ${await res.text()}`);
    return (await res.json()) as JoinReply;
  };
  /** Joins the current replica; the first join tries each replica once before it gives up. */
  const register = async (): Promise<JoinReply> => {
    for (let tried = 1; ; tried++) {
      try {
        return await registerAt();
      } catch (err) {
        if (tried >= joinUrls.length) throw err;
        failOver();
      }
    }
  };
  let first = await register();
  /** Cached layers as changes once the control plane says it takes them (layer-delta.ts). */
  const layers = new LayerDeltaSender();
  let deltas = first.layerDeltas === true;

  let stopped = false;
  let leave!: () => void;
  const left = new Promise<void>((r) => (leave = r));
  let warned = false;
  const beat = async (): Promise<void> => {
    const info = await opts.info();
    const sent = deltas ? layers.next(info.cachedLayers) : undefined;
    // With deltas the whole list goes only when the control plane holds no version of it.
    const body = sent ? { info: { ...info, cachedLayers: sent.cachedLayers }, layers: sent.layers } : { info };
    let res: Response;
    try {
      res = await fetch(`${joinUrl}/v1/cluster/edges/${id}/heartbeat`, {
        method: 'PUT',
        headers: auth,
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(5_000),
      });
    } catch (err) {
      layers.held(undefined); // whatever was agreed, the next heartbeat (maybe to another replica) sends the whole list
      throw err;
    }
    let state: string | undefined;
    if (res.status === 404) {
      first = await register();
      state = first.state;
      deltas = first.layerDeltas === true;
      layers.held(undefined); // a join brings the whole list; the next heartbeat agrees a version
    } else if (res.ok) {
      const reply = (await res.json()) as { state: string; layersVersion?: number };
      state = reply.state;
      layers.held(reply.layersVersion);
    } else {
      layers.held(undefined);
      throw new Error(`heartbeat: HTTP ${res.status}`);
    }
    if (state === 'draining' && info.sandboxes === 0) {
      const del = await fetch(`${joinUrl}/v1/cluster/edges/${id}`, {
        method: 'DELETE',
        headers: { authorization: auth.authorization },
        signal: AbortSignal.timeout(5_000),
      });
      if (del.status === 204) {
        log.info({ edge: id }, 'drained and empty: left the cluster');
        stopped = true;
        leave();
      }
    }
  };
  // The wait between heartbeats is cut short by stop(), so closing an edge does not wait a second.
  let wake: () => void = () => undefined;
  const loop = async (): Promise<void> => {
    while (!stopped) {
      try {
        await beat();
        if (warned) log.info({ edge: id }, 'control plane reachable again');
        warned = false;
      } catch (err) {
        if (!warned) log.warn({ edge: id, err: (err as Error).message }, 'heartbeat failed; sandboxes keep running, retrying');
        warned = true;
        if (joinUrls.length > 1) failOver();
      }
      if (stopped) break;
      await new Promise<void>((r) => {
        const timer = setTimeout(r, opts.intervalMs ?? 1000);
        wake = () => {
          clearTimeout(timer);
          r();
        };
      });
    }
  };
  const loopDone = loop();
  return {
    registry: first.registry,
    left,
    async stop() {
      stopped = true;
      wake();
      await loopDone;
    },
  };
}
