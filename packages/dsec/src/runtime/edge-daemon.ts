import { confineDataDir } from '../host/data-dir.js';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { App } from '../control/server.js';
import { HttpBlobSource } from '../edge/node/blob-source.js';
import { RegistryBlobSource } from '../edge/node/registry-blob-source.js';
import { JoinedBlobSource } from '../edge/node/joined-blob-source.js';
import { parseRegistryRef } from '../image/registry/registry-ref.js';
import { RegistryChunkProxyThread } from '../edge/node/lazy/registry-chunk-proxy-thread.js';
import type { RegistryCredentials } from '../image/registry/registry-auth.js';
import { RegistryClient } from '../image/registry/registry-client.js';
import type { RegistryRef } from '../image/registry/registry-ref.js';
import type { ContainerBackend } from '../edge/backends/container/container-backend.js';
import { Edge } from '../edge/edge.js';
import { joinCluster, type JoinedEdge } from '../edge/join-loop.js';
import { buildEdgeServer } from '../edge/server/edge-server.js';
import { doctorPassed, formatChecks, runDoctor } from '../host/doctor.js';
import { parseListen } from '../config/options.js';
import { createLogger } from '../http/request-log.js';
import { HostNotReadyError, takePidLock } from './pid-lock.js';

export interface EdgeDaemonOptions {
  /** The control plane's URL. */
  join: string;
  /** The cluster's join token (printed by `dsec control`, in its client.json). */
  token: string;
  /** host:port the edge protocol listens on. */
  listen: string;
  /** URL the control plane reaches this edge at; default http://<listen>. */
  advertise?: string | undefined;
  dataDir: string;
  /** Default: kept in DATA_DIR/edge-id, made once. */
  id?: string | undefined;
  pool: string;
  labels: Record<string, string>;
  cpuOvercommit: number;
  maxSandboxes: number;
  /** A create is refused (NODE_DISK_FULL) below this much free disk under the data dir; 0: never. */
  minFreeDiskMiB?: number;
  /** A create is refused (NODE_MEMORY_PRESSURE) below this much available memory (MiB) or at this PSI full avg10 (%); 0: never. Default 256 MiB, 40 %. */
  memoryAdmission?: { minAvailableMiB: number; maxFullPressure: number };
  layerCacheMiB: number;
  /** lazy: layers mounted through dsec-chunk-fuse, chunks fetched from the control plane's blob endpoint on first read. */
  layerFetch?: 'eager' | 'lazy';
  /** Sandboxes in user namespaces of their own (DSEC_USERNS; see EdgeOptions.userns); default on. */
  userns?: boolean;
  /** User namespaces kept made ahead (DSEC_USERNS_POOL; see EdgeOptions.usernsPool). */
  usernsPool?: number;
  /** An OCI registry repository to read layers from first (the control plane's blob endpoint for what it lacks). */
  registry?: { ref: Pick<RegistryRef, 'baseUrl' | 'host' | 'repository'>; credentials?: RegistryCredentials | undefined } | undefined;
  logLevel: string;
}

export interface RunningEdgeDaemon {
  id: string;
  url: string;
  edge: ContainerBackend;
  /** With a registry and lazy layers: where dsec-chunk-fuse reads chunks (its stats say from where). */
  chunkProxy: RegistryChunkProxyThread | undefined;
  /** Resolves when the edge has left the cluster (drained and empty). */
  left: Promise<void>;
  close(opts?: { killAll?: boolean }): Promise<void>;
}

/** The edge id: given, or the one this data dir was given before, or a new one kept there. */
function edgeIdFor(dataDir: string, given: string | undefined): string {
  const file = join(dataDir, 'edge-id');
  if (given) {
    if (!/^[a-z0-9]{1,32}$/.test(given))
      throw new HostNotReadyError(`edge id ${JSON.stringify(given)}: use 1-32 lowercase letters and digits`);
    writeFileSync(file, given + '\n');
    return given;
  }
  if (existsSync(file)) return readFileSync(file, 'utf8').trim();
  const id = `e${randomBytes(4).toString('hex')}`;
  writeFileSync(file, id + '\n');
  return id;
}

/**
 * `dsec edge`: one node of a cluster. Runs the node's edge (crun, layers, network, exec engine)
 * behind the edge protocol's HTTP server, fetches layers from the control plane's blob endpoint
 * (no shared filesystem; with `registry`, from that OCI registry repository first), joins the control plane and reports its capacity every second
 * (edge/join-loop.ts). A control plane that does not answer changes nothing here: sandboxes keep
 * running, heartbeats keep trying.
 */
export async function startEdgeDaemon(opts: EdgeDaemonOptions, extra: { log?: Logger } = {}): Promise<RunningEdgeDaemon> {
  const log = extra.log ?? createLogger({ level: opts.logLevel });
  mkdirSync(opts.dataDir, { recursive: true });
  const doctor = runDoctor({ dataDir: opts.dataDir, maxSandboxes: opts.maxSandboxes });
  for (const c of doctor) if (c.fixed) log.warn({ check: c.name }, `doctor fixed the host: ${c.fixed}`);
  if (!doctorPassed(doctor)) throw new HostNotReadyError(`this host cannot run sandboxes:\n${formatChecks(doctor.filter((c) => !c.ok))}`);
  confineDataDir(opts.dataDir);
  const releaseLock = takePidLock(opts.dataDir, 'dsec-edge.pid', 'a dsec edge');
  const id = edgeIdFor(opts.dataDir, opts.id);
  const joinUrl = opts.join.replace(/\/$/, '');
  // Lazy chunks are read from one control plane (dsec-chunk-fuse takes one URL): the first of
  // several replicas. Heartbeats and whole blobs move to the next replica when one stops answering.
  const chunkUrl = joinUrl.split(',')[0]!.trim().replace(/\/$/, '');
  // Lazy layers with a registry: dsec-chunk-fuse reads its ranges through a proxy that asks the
  // registry (with its auth) and the control plane for what the registry lacks.
  const chunkProxyToken = randomBytes(24).toString('base64url');
  let chunkProxy: RegistryChunkProxyThread | undefined;
  // The registry of --registry, or else the one the control plane names at join (below).
  const useRegistry = async (registry: NonNullable<EdgeDaemonOptions['registry']>): Promise<void> => {
    if (opts.layerFetch === 'lazy') {
      chunkProxy = await RegistryChunkProxyThread.start({
        registry: registry.ref,
        credentials: registry.credentials,
        fallbackUrl: chunkUrl,
        fallbackToken: opts.token,
        token: chunkProxyToken,
      });
    }
    blobs.use(
      new RegistryBlobSource(
        // Few attempts: a create waits on them, and the control plane serves the layer if the registry cannot.
        new RegistryClient(registry.ref, {
          credentials: registry.credentials,
          attempts: 3,
          onRetry: (why) => log.warn(`registry: retrying: ${why}`),
        }),
        new HttpBlobSource(joinUrl, opts.token),
        (digest, why) => log.warn({ layer: digest }, `registry unavailable, layer fetched from the control plane instead: ${why}`),
      ),
    );
  };
  const blobs = new JoinedBlobSource(new HttpBlobSource(joinUrl, opts.token));
  if (opts.registry) await useRegistry(opts.registry);
  const node = new Edge({
    id,
    nodeDir: join(opts.dataDir, 'node'),
    blobs,
    maxSandboxes: opts.maxSandboxes,
    cpuOvercommit: opts.cpuOvercommit,
    minFreeDiskBytes: (opts.minFreeDiskMiB ?? 256) * 1024 * 1024,
    memoryAdmission: {
      minAvailableBytes: (opts.memoryAdmission?.minAvailableMiB ?? 256) * 1024 * 1024,
      maxFullPressure: opts.memoryAdmission?.maxFullPressure ?? 40,
    },
    layerCacheBytes: opts.layerCacheMiB * 1024 * 1024,
    userns: opts.userns !== false,
    ...(opts.usernsPool !== undefined ? { usernsPool: opts.usernsPool } : {}),
    ...(opts.layerFetch === 'lazy'
      ? { lazy: { source: () => (chunkProxy ? { url: chunkProxy.url, token: chunkProxyToken } : { url: chunkUrl, token: opts.token }) } }
      : {}),
    log: log.child({ edge: id }),
  });
  const api = node;
  let server: App | undefined;
  try {
    await node.start();
    server = await buildEdgeServer(api, { token: opts.token, log: log.child({ edge: id }) });
    const { host, port } = parseListen(opts.listen);
    await server.listen({ host, port });
  } catch (err) {
    await server?.close();
    await node.shutdown();
    await chunkProxy?.close();
    releaseLock();
    throw err;
  }
  const addr = server.server.address();
  const { host } = parseListen(opts.listen);
  const url = opts.advertise ?? `http://${host.includes(':') ? `[${host}]` : host}:${typeof addr === 'object' && addr ? addr.port : 0}`;

  let joined: JoinedEdge;
  try {
    joined = await joinCluster({
      join: joinUrl,
      token: opts.token,
      id,
      url,
      pool: opts.pool,
      labels: opts.labels,
      cpuOvercommit: opts.cpuOvercommit,
      info: () => api.info(),
      log,
    });
  } catch (err) {
    await server.close();
    await node.shutdown();
    await chunkProxy?.close();
    releaseLock();
    // A wrong URL or token is the operator's to fix: one line that says which, no stack trace.
    let e: unknown = err;
    while (e && typeof e === 'object' && !('code' in e) && 'cause' in e) e = (e as { cause?: unknown }).cause;
    const code = e && typeof e === 'object' && 'code' in e ? String((e as { code: unknown }).code) : undefined;
    const causeMessage = (err as { cause?: { message?: string } }).cause?.message;
    const why = code ? `cannot reach ${joinUrl} (${code})` : `${(err as Error).message}${causeMessage ? ` (${causeMessage})` : ''}`;
    throw new HostNotReadyError(
      `this edge could not join the control plane: ${why}; check --join (the URL \`dsec control\` printed) and --token`,
    );
  }
  // No --registry here: the cluster's registry, if the control plane has one, comes with the join.
  if (!opts.registry && joined.registry) {
    try {
      const grant = joined.registry;
      await useRegistry({
        ref: parseRegistryRef(grant.repository, { requireName: false }),
        credentials: grant.username !== undefined ? { username: grant.username, password: grant.password ?? '' } : undefined,
      });
      log.info({ registry: grant.repository }, "reading layers from the cluster's registry (named by the control plane at join)");
    } catch (err) {
      log.error(
        { err: (err as Error).message, registry: joined.registry.repository },
        "the cluster's registry cannot be used; layers come from the control plane",
      );
    }
  }

  // A second close (SIGTERM while a drained edge is leaving) waits for the first: returning at
  // once let the caller's process.exit cut the first short, leaving the pool's namespace binds.
  let closing: Promise<void> | undefined;
  const close = async (closeOpts: { killAll?: boolean }): Promise<void> => {
    await joined.stop();
    await server.close();
    await node.shutdown({ killAll: closeOpts.killAll ?? false });
    await chunkProxy?.close();
    releaseLock();
  };
  return {
    id,
    url,
    edge: node.containers,
    chunkProxy,
    left: joined.left,
    close(closeOpts = {}) {
      closing ??= close(closeOpts);
      return closing;
    },
  };
}
