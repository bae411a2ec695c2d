import { chmodSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type { BurstOptions } from '../control/service/burst-mover.js';
import { SYSTEM } from '../control/service/callers.js';
import { ControlPlane } from '../control/control-plane.js';
import { loadOrCreateClusterToken } from '../control/cluster/cluster-token.js';
import { EdgeRegistry } from '../control/edges/edge-registry.js';
import { createApiKey, hashKey } from '../control/api-keys.js';
import { buildServer, type App } from '../control/server.js';
import { StateStore } from '../control/state-store.js';
import type { ContainerBackend } from '../edge/backends/container/container-backend.js';
import { Edge } from '../edge/edge.js';
import { LocalBlobSource } from '../edge/node/blob-source.js';
import type { VmBackend } from '../edge/backends/vm/vm-backend.js';
import { doctorPassed, formatChecks, runDoctor, type Check } from '../host/doctor.js';
import { ImageStore } from '../image/image-store.js';
import { StoreImageCatalog } from '../control/image-catalog.js';
import { ClusterRegistry } from '../control/cluster/cluster-registry.js';
import { credentialsFromEnv } from '../image/registry/registry-auth.js';
import { parseRegistryRef, RegistryRefError } from '../image/registry/registry-ref.js';
import { LayerStore } from '../image/layer-store.js';
import { BlobServerThread } from '../edge/node/lazy/blob-server-thread.js';
import { parseListen, parseRegistryAllow, portsListenOf, type ServerOptions } from '../config/options.js';
import type { FastifyRequest } from 'fastify';
import { PortLinkGate, PortLinks } from '../control/ports/port-links.js';
import { buildPortsServer } from '../control/ports/ports-server.js';
import { createLogger, requestArrivals } from '../http/request-log.js';

export interface ClientFile {
  url: string;
  apiKey: string;
  /** The cluster's join token (`dsec edge --join URL --token T`); not an API key. */
  joinToken?: string;
}

import { HostNotReadyError, takePidLock } from './pid-lock.js';
import { confineDataDir } from '../host/data-dir.js';

export { HostNotReadyError };

/** A running control plane + local edge, as `dsec up` and `dsec demo` start it. */
export interface RunningDsec {
  url: string;
  apiKey: string;
  /** Set only when this start created the key (it is printed once). */
  newKey: boolean;
  app: App;
  /** The port-link origin's server (control/ports/ports-server.ts) and its base URL. */
  portsApp: App;
  portsUrl: string;
  /** The node's container backend. */
  edge: ContainerBackend;
  /** The node as the control plane reaches it: its EdgeApi over every backend (edge/edge.ts). */
  node: Edge;
  /** microVM/VM sandboxes; undefined when the VM guest was not built. */
  vms: VmBackend | undefined;
  control: ControlPlane;
  /**
   * The control plane's state store. In-process callers (tests, tools) use this one: a second
   * SQLite connection in the same process can block the thread on a lock this one holds across
   * an await, until its busy timeout gives up.
   */
  store: StateStore;
  images: ImageStore;
  log: Logger;
  doctor: Check[];
  /** Stops serving; sandboxes keep running for the next start unless killAll. */
  close(opts?: { killAll?: boolean }): Promise<void>;
}

export function clientFilePath(dataDir: string): string {
  return join(dataDir, 'client.json');
}

export function readClientFile(dataDir: string): ClientFile | undefined {
  try {
    return JSON.parse(readFileSync(clientFilePath(dataDir), 'utf8')) as ClientFile;
  } catch {
    return undefined;
  }
}

/**
 * A server already up on this data dir, if its client.json answers: only the connection (the
 * file also holds the cluster's join token, which is no client option).
 */
export async function findRunningServer(dataDir: string): Promise<{ url: string; apiKey: string } | undefined> {
  const c = readClientFile(dataDir);
  if (!c) return undefined;
  try {
    const res = await fetch(`${c.url}/v1/nodes`, { headers: { authorization: `Bearer ${c.apiKey}` }, signal: AbortSignal.timeout(2000) });
    return res.ok ? { url: c.url, apiKey: c.apiKey } : undefined;
  } catch {
    return undefined;
  }
}

/** A control plane with no edge of its own (`dsec control`): edges join it over the network. */
export interface RunningControl extends Omit<RunningDsec, 'edge' | 'node'> {
  /** The cluster's join token, for `dsec edge --join URL --token T`. */
  joinToken: string;
}

/**
 * The wiring module: doctor, stores, edge, control plane and HTTP server, each given its
 * dependencies here. The control plane reaches the edge only through EdgeApi.
 */
export async function startAllInOne(opts: ServerOptions, extra: { log?: Logger; quietDoctor?: boolean } = {}): Promise<RunningDsec> {
  const started = await startDsecProcess(opts, { ...extra, localEdge: true });
  return started as RunningDsec;
}

/** What `dsec control` sets beyond a server's options. */
export interface ControlOnlyOptions {
  edgeLostAfterMs?: number;
  /** The burst pool, its threshold, and whether sandboxes come back (control/service/burst-mover.ts). */
  burst?: BurstOptions;
  /** How often the pools are looked at for bursting. */
  burstCheckMs?: number;
}

/** `dsec control`: the control plane alone; edges on other nodes join it with the token. */
export async function startControlPlane(opts: ServerOptions & ControlOnlyOptions, extra: { log?: Logger } = {}): Promise<RunningControl> {
  return startDsecProcess(opts, { ...extra, localEdge: false });
}

async function startDsecProcess(
  opts: ServerOptions & ControlOnlyOptions,
  extra: { log?: Logger; localEdge: boolean },
): Promise<RunningControl & { edge?: ContainerBackend; node?: Edge; vms?: VmBackend | undefined }> {
  const log = extra.log ?? createLogger({ level: opts.logLevel });
  // A control plane alone runs no sandbox, but builds images (mkfs.erofs): the same host checks
  // (the host limits of a full node only where sandboxes run).
  const doctor = runDoctor({ dataDir: opts.dataDir, ...(extra.localEdge ? { maxSandboxes: opts.maxSandboxes } : {}) });
  for (const c of doctor) {
    if (c.fixed) log.warn({ check: c.name }, `doctor fixed the host: ${c.fixed}`);
    else if (!c.ok && !c.required) log.warn({ check: c.name }, c.detail);
  }
  if (!doctorPassed(doctor)) throw new HostNotReadyError(`this host cannot run sandboxes:\n${formatChecks(doctor.filter((c) => !c.ok))}`);

  confineDataDir(opts.dataDir);
  const releaseLock = takePidLock(opts.dataDir, 'dsec.pid', 'dsec');
  const layers = new LayerStore(opts.layerDir || opts.dataDir, { chunkSize: opts.layerChunkKiB * 1024 });
  const images = new ImageStore(opts.dataDir, layers);
  let store: StateStore;
  try {
    store = await StateStore.open(opts.store || join(opts.dataDir, 'state.db'), {
      onError: (err) => log.error({ err }, 'state store connection failed'),
      arrivals: requestArrivals,
    });
  } catch (err) {
    releaseLock();
    throw err;
  }
  // With a registry, it is the blob store: the layer dir is this replica's cache of it.
  let clusterRegistry: ClusterRegistry | undefined;
  if (opts.registry) {
    try {
      const ref = parseRegistryRef(opts.registry, { requireName: false });
      clusterRegistry = new ClusterRegistry(
        opts.registry,
        ref,
        credentialsFromEnv(process.env, (p) => readFileSync(p, 'utf8')),
        layers,
        store,
        log.child({ component: 'registry' }),
      );
      layers.remote = clusterRegistry;
    } catch (err) {
      await store.close();
      releaseLock();
      if (err instanceof RegistryRefError) throw new HostNotReadyError(`--registry (DSEC_REGISTRY): ${err.message}`);
      throw err;
    }
  }
  // Image records live in the store, shared by replicas; files in the data dir are imported
  // (their blobs put in the registry first, when there is one).
  try {
    await images.attachCatalog(new StoreImageCatalog(store), clusterRegistry);
  } catch (err) {
    await store.close();
    releaseLock();
    throw err;
  }
  // Replicas on one store share the cluster token: the first one's stays.
  const clusterToken = await store.leases.sharedSetting('cluster-token', loadOrCreateClusterToken(opts.dataDir));
  const replicaId = `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const registry = await EdgeRegistry.open({
    replicaId,
    store,
    token: clusterToken,
    log: log.child({ component: 'edges' }),
    ...(opts.edgeLostAfterMs ? { lostAfterMs: opts.edgeLostAfterMs } : {}),
  });
  const control = new ControlPlane(store, images, log.child({ component: 'control' }), {
    edges: registry,
    trajectoryRetentionHours: opts.trajectoryRetentionHours,
    outputBudgetBytes: opts.outputBudgetMiB * 2 ** 20,
    replicaId,
    ...(opts.burst ? { burstPool: opts.burst.pool, burstThreshold: opts.burst.threshold, burstReturn: opts.burst.returnHome } : {}),
    ...(clusterRegistry ? { registry: clusterRegistry } : {}),
  });
  let edge: ContainerBackend | undefined;
  let node: Edge | undefined;
  // Lazy layers: the store is local here, so its blobs are served to dsec-chunk-fuse from a
  // thread of their own (see BlobServerThread), on loopback, under the cluster token.
  const blobThread =
    extra.localEdge && opts.layerFetch === 'lazy'
      ? await BlobServerThread.start({
          storeRoot: opts.layerDir || opts.dataDir,
          chunkSize: layers.chunkSize,
          token: clusterToken,
          host: '127.0.0.1',
        })
      : undefined;
  if (extra.localEdge) {
    node = new Edge({
      id: opts.edgeId,
      nodeDir: join(opts.dataDir, 'node'),
      blobs: new LocalBlobSource(layers),
      maxSandboxes: opts.maxSandboxes,
      minFreeDiskBytes: opts.minFreeDiskMiB * 1024 * 1024,
      memoryAdmission: { minAvailableBytes: opts.minAvailableMemoryMiB * 1024 * 1024, maxFullPressure: opts.maxMemoryPressure },
      layerCacheBytes: opts.layerCacheMiB * 1024 * 1024,
      userns: opts.userns,
      usernsPool: opts.usernsPool,
      ...(blobThread ? { lazy: { source: () => ({ url: blobThread.url, token: clusterToken }) } } : {}),
      onSandboxFailed: (id, reason) =>
        void store.sandboxes
          .setStatus(id, 'failed', reason)
          .catch((err: unknown) => log.error({ err, sandbox: id }, 'recording a failed sandbox failed')),
      log: log.child({ edge: opts.edgeId }),
    });
    edge = node.containers;
    try {
      await node.start();
    } catch (err) {
      // The edge adopted and removed nothing: leave the data dir for the next start.
      await store.close();
      releaseLock();
      throw err;
    }
    await control.edges.addLocal(opts.edgeId, node);
    await control.nodes.reconcile(opts.edgeId);
  }
  // Remote edges known from before a restart are reconciled when they next report.
  await control.expiry.sweepExpired();
  await control.batches.resume();
  await control.pools.start();
  const stopExpiryLoop = control.expiry.startLoop();
  const stopBurstLoop = control.burst.startLoop(opts.burstCheckMs);
  const stopBatchOwner = control.batches.startOwnerLoop();
  const stopEdgeWatcher = control.edges.startWatcher();
  const stopImageRefresh = startImageRefresh(images, log);
  /** The background work started above, stopped at close or when the start-up fails after it. */
  const stopBackgroundWork = async (): Promise<void> => {
    stopExpiryLoop();
    stopBurstLoop();
    stopBatchOwner();
    stopEdgeWatcher();
    stopImageRefresh();
    await control.pools.stop();
  };

  // Port links are served on an origin of their own (ports-server.ts); links made here name it.
  const links = new PortLinks(clusterToken);
  const ports = portsListenOf(opts);
  let portsPort = ports.port;
  const portsOrigin = (req: FastifyRequest): string => opts.portsUrl || `${req.protocol}://${hostForUrl(req.hostname)}:${portsPort}`;
  const app = await buildServer({
    control,
    store,
    images,
    log,
    clusterToken,
    links,
    portsOrigin,
    dataDir: opts.dataDir,
    registryAllow: parseRegistryAllow(opts.registryAllow),
  });
  const portsApp = await buildPortsServer({
    control,
    linkGate: new PortLinkGate(links, { projectOf: (id) => store.sandboxes.projectOf(id) }),
    log: log.child({ origin: 'ports' }),
  });
  const { host, port } = parseListen(opts.listen);
  let listening = opts.listen;
  try {
    await app.listen({ host, port });
    listening = `${ports.host}:${ports.port} (the port-link origin, --ports-listen / DSEC_PORTS_LISTEN)`;
    await portsApp.listen({ host: ports.host, port: ports.port });
    const pa = portsApp.server.address();
    portsPort = typeof pa === 'object' && pa ? pa.port : ports.port;
  } catch (err) {
    // Undo the start-up so far; the sandboxes the edge adopted keep running for the next start.
    await stopBackgroundWork();
    await app.close();
    await portsApp.close();
    await node?.shutdown({ killAll: false });
    await blobThread?.close();
    await store.close();
    releaseLock();
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE')
      throw new HostNotReadyError(
        `cannot listen on ${listening}: the address is in use; stop what listens there or pick another with --listen HOST:PORT (env DSEC_LISTEN) or --ports-listen HOST:PORT (env DSEC_PORTS_LISTEN)`,
      );
    if (code === 'EADDRNOTAVAIL')
      throw new HostNotReadyError(`cannot listen on ${listening}: no interface has that address; use --listen 127.0.0.1:PORT`);
    if (code === 'EACCES') throw new HostNotReadyError(`cannot listen on ${listening}: permission denied (ports below 1024 need root)`);
    throw err;
  }
  const addr = app.server.address();
  const actualPort = typeof addr === 'object' && addr ? addr.port : port;
  const url = `http://${hostForUrl(host)}:${actualPort}`;

  // client.json keeps a working key for local scripts; a key is created when none there works.
  const existing = readClientFile(opts.dataDir);
  let apiKey = existing?.apiKey;
  let newKey = false;
  // The bootstrap key is an admin key of project `default` (docs/PROJECTS.md): one that was
  // revoked, or is not an admin key, is replaced, so the host's root can always get back in.
  if (!apiKey || !(await store.keys.byHash(hashKey(apiKey)))?.admin) {
    apiKey = (await createApiKey(store, 'client.json', { admin: true })).key;
    newKey = true;
  }
  // Written aside and renamed: a client reading it while dsec starts never sees half a file.
  const clientTmp = `${clientFilePath(opts.dataDir)}.${process.pid}.tmp`;
  writeFileSync(clientTmp, JSON.stringify({ url, apiKey, joinToken: clusterToken } satisfies ClientFile, null, 2) + '\n', { mode: 0o600 });
  chmodSync(clientTmp, 0o600);
  renameSync(clientTmp, clientFilePath(opts.dataDir));

  let closing: Promise<void> | undefined;
  const running: RunningControl & { edge?: ContainerBackend; node?: Edge; vms?: VmBackend | undefined } = {
    url,
    apiKey,
    newKey,
    joinToken: clusterToken,
    app,
    portsApp,
    portsUrl: opts.portsUrl || `http://${hostForUrl(ports.host)}:${portsPort}`,
    control,
    store,
    images,
    log,
    doctor,
    vms: node?.vms,
    close(closeOpts = {}) {
      // A second close (a signal during a stop) waits for the first, never cuts it short.
      closing ??= (async () => {
        await stopBackgroundWork();
        await control.batches.stop();
        await app.close();
        await portsApp.close();
        await images.flush().catch((err: unknown) => log.error({ err }, 'writing image records to the store failed'));
        if (closeOpts.killAll) await control.sandboxes.killAll(SYSTEM);
        await node?.shutdown({ killAll: closeOpts.killAll ?? false });
        await blobThread?.close();
        await store.close();
        releaseLock();
      })();
      return closing;
    },
  };
  if (edge) running.edge = edge;
  if (node) running.node = node;
  return running;
}

/** A host as it stands in a URL: an IPv6 literal in brackets. */
function hostForUrl(host: string): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]` : host;
}

/**
 * Every second, images made or deleted at another replica (or by a tool writing files) reach this
 * one's copy; a create that misses an image refreshes at once (ProjectImages.resolve).
 */
function startImageRefresh(images: ImageStore, log: Logger, intervalMs = 1000): () => void {
  let busy = false;
  const timer = setInterval(() => {
    if (busy) return;
    busy = true;
    void images
      .refresh()
      .catch((err: unknown) => log.error({ err }, 'refreshing image records from the store failed'))
      .finally(() => (busy = false));
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
