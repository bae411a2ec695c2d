import { resolve } from 'node:path';
import { Type, type Static } from 'typebox';
import { Value } from 'typebox/value';
import { DEFAULT_DATA_DIR } from '@dsec/sdk';
import { DEFAULT_CHUNK_SIZE } from '../image/chunk-index.js';

/**
 * Every option dsec's server accepts, with its default and environment variable. Flags, env and
 * defaults are merged once at start-up by compileOptions(); unknown keys are rejected, and every
 * field of the result is defined.
 */
export const ServerOptions = Type.Object(
  {
    /** DSEC_DATA_DIR: state (SQLite, layer blobs, images, sandboxes). */
    dataDir: Type.String({ default: DEFAULT_DATA_DIR, minLength: 1 }),
    /**
     * DSEC_STORE: where the control plane keeps its state: empty for SQLite in the data dir
     * (state.db), or a postgres:// URL (PostgreSQL, shared by control-plane replicas).
     */
    store: Type.String({ default: '' }),
    /**
     * DSEC_LAYER_DIR: where layer blobs live (`layers/`, and `tmp/` for builds in progress); empty
     * for the data dir. Control-plane replicas without a registry share one directory (NFS, CephFS,
     * 3FS) so that each serves every blob; image records are shared through the store.
     */
    layerDir: Type.String({ default: '' }),
    /**
     * DSEC_REGISTRY: the cluster's OCI registry, HOST/REPOSITORY (https:// for a loopback host that
     * speaks TLS). It is the control plane's blob store: every image's layers (and the image, as an
     * OCI artifact) are put there before the image is recorded, and the layer dir is a cache of it.
     * Edges that join get its address and account (DSEC_REGISTRY_USER, DSEC_REGISTRY_PASSWORD[_FILE]);
     * empty: none.
     */
    registry: Type.String({ default: '' }),
    /**
     * DSEC_REGISTRY_ALLOW: the registries a project key may name in POST /v1/images/push|pull, as
     * comma-separated HOST[:PORT] (as written in a REF, e.g. `registry.example.com,10.0.0.5:5000`).
     * The cluster's registry (DSEC_REGISTRY) is always allowed; admin keys may name any. Empty: a
     * project key may use the cluster's registry only. The registry account (DSEC_REGISTRY_USER,
     * DSEC_REGISTRY_PASSWORD[_FILE]) is sent to the cluster's registry only, never to these.
     */
    registryAllow: Type.String({ default: '', pattern: '^[A-Za-z0-9.:\\[\\], -]*$' }),
    /** DSEC_LISTEN: host:port of the HTTP API. */
    listen: Type.String({ default: '127.0.0.1:7070', pattern: '^[^:]+:[0-9]{1,5}$' }),
    /**
     * DSEC_PORTS_LISTEN: host:port of the port-link origin. Pages a sandbox serves through a signed
     * link are served here, never on the API's origin, so they cannot read the dashboard's key or
     * register a service worker over the API (docs/SECURITY.md). Empty: the API's host, its port
     * + 8 (7078 beside 7070; 0 when the API's port is 0).
     */
    portsListen: Type.String({ default: '', pattern: '^([^:]+:[0-9]{1,5})?$' }),
    /**
     * DSEC_PORTS_URL: the base URL links are made with (`https://ports.example.com` behind a proxy).
     * Empty: http://<the host the API was called by>:<the port-link port>.
     */
    portsUrl: Type.String({ default: '', pattern: '^(https?://[^/?#]+)?$' }),
    /** DSEC_EDGE_ID: this node's edge id, part of every sandbox id. */
    edgeId: Type.String({ default: 'local', pattern: '^[a-z0-9]{1,32}$' }),
    /** DSEC_MAX_SANDBOXES: the edge admits no more than this many at once. */
    maxSandboxes: Type.Integer({ default: 4000, minimum: 1 }),
    /**
     * DSEC_LAYER_CACHE_MIB: budget of the node's layer cache (node/layer-cache), in MiB. Above it,
     * the least recently used layers no sandbox mounts are evicted; mounted layers never are.
     * Blobs hard-linked from a store on the same filesystem cost nothing against it.
     */
    layerCacheMiB: Type.Integer({ default: 20480, minimum: 0 }),
    /**
     * DSEC_LAYER_FETCH: how the edge brings in a layer it has not got. `eager`: the whole blob before
     * the layer is mounted. `lazy`: the layer is mounted from dsec-chunk-fuse at once, and each chunk
     * is fetched from the blob endpoint (HTTP ranges, sha256 per chunk) when a sandbox first reads it.
     */
    layerFetch: Type.Union([Type.Literal('eager'), Type.Literal('lazy')], { default: 'eager' }),
    /**
     * DSEC_LAYER_CHUNK_KIB: chunk size of the per-chunk digest lists recorded for new layers, in KiB
     * (the unit lazy nodes fetch and verify). Layers keep the size they were recorded with.
     */
    layerChunkKiB: Type.Integer({ default: DEFAULT_CHUNK_SIZE / 1024, minimum: 4, maximum: 1024 * 1024 }),
    /**
     * DSEC_USERNS: run each container sandbox in a user namespace of its own, so its root is an
     * unprivileged host uid range (65,536 ids, claimed host-wide) instead of host root; layers and
     * volumes are mounted id-mapped. On by default; DSEC_USERNS=false (`--no-userns`) opts out.
     * See docs/SECURITY.md for what it stops and costs.
     */
    userns: Type.Boolean({ default: true }),
    /**
     * DSEC_USERNS_POOL: user namespaces the edge keeps made ahead (each with its uid range claimed),
     * so a create does not wait for one to be made; refilled in the background. 0: none. A pooled
     * namespace costs a few KiB of kernel memory and one of the host's 16,384 ranges.
     */
    usernsPool: Type.Integer({ default: 2, minimum: 0, maximum: 64 }),
    /**
     * DSEC_MIN_FREE_DISK_MIB: the edge refuses a create (507 NODE_DISK_FULL) while the filesystem of
     * its data dir has less than this free, so a sandbox is never half-made on a full disk; 0: never.
     */
    minFreeDiskMiB: Type.Integer({ default: 256, minimum: 0 }),
    /**
     * DSEC_MIN_AVAILABLE_MEMORY_MIB: the edge refuses a create (503 NODE_MEMORY_PRESSURE) while the
     * node has less memory available than this (MemAvailable, or the headroom of a memory cgroup that
     * bounds the sandboxes: the edge's container's, or the `dsec` parent's); 0: never.
     */
    minAvailableMemoryMiB: Type.Integer({ default: 256, minimum: 0 }),
    /**
     * DSEC_MAX_MEMORY_PRESSURE: the edge refuses a create (503 NODE_MEMORY_PRESSURE) while the node's
     * PSI memory `full avg10` (% of the last 10 s in which all its tasks waited on memory) is at least
     * this; 0: never.
     */
    maxMemoryPressure: Type.Integer({ default: 40, minimum: 0, maximum: 100 }),
    /**
     * DSEC_OUTPUT_BUDGET_MIB: output the control plane may hold for buffered results at once
     * (control/service/output-budget.ts). A command whose maxOutputBytes is above the default 1 MiB
     * reserves 2 × (maxOutputBytes − 1 MiB) before it starts; one that does not fit, or takes a
     * project past half of it, is refused (503 OUTPUT_BUDGET_EXCEEDED). Default-cap commands reserve nothing.
     * 0 is no room (every reservation refused), not the budget turned off.
     */
    outputBudgetMiB: Type.Integer({ default: 1024, minimum: 0 }),
    /** DSEC_TRAJECTORY_RETENTION_HOURS: how long a killed sandbox's trajectory stays readable by id; 0 deletes it at kill. */
    trajectoryRetentionHours: Type.Integer({ default: 24, minimum: 0 }),
    /** DSEC_LOG_LEVEL */
    logLevel: Type.Union(
      [Type.Literal('debug'), Type.Literal('info'), Type.Literal('warn'), Type.Literal('error'), Type.Literal('silent')],
      {
        default: 'info',
      },
    ),
  },
  { additionalProperties: false },
);
export type ServerOptions = Static<typeof ServerOptions>;

const ENV: Record<keyof ServerOptions, string> = {
  dataDir: 'DSEC_DATA_DIR',
  store: 'DSEC_STORE',
  layerDir: 'DSEC_LAYER_DIR',
  registry: 'DSEC_REGISTRY',
  registryAllow: 'DSEC_REGISTRY_ALLOW',
  listen: 'DSEC_LISTEN',
  portsListen: 'DSEC_PORTS_LISTEN',
  portsUrl: 'DSEC_PORTS_URL',
  edgeId: 'DSEC_EDGE_ID',
  maxSandboxes: 'DSEC_MAX_SANDBOXES',
  layerCacheMiB: 'DSEC_LAYER_CACHE_MIB',
  layerFetch: 'DSEC_LAYER_FETCH',
  layerChunkKiB: 'DSEC_LAYER_CHUNK_KIB',
  userns: 'DSEC_USERNS',
  usernsPool: 'DSEC_USERNS_POOL',
  minFreeDiskMiB: 'DSEC_MIN_FREE_DISK_MIB',
  minAvailableMemoryMiB: 'DSEC_MIN_AVAILABLE_MEMORY_MIB',
  maxMemoryPressure: 'DSEC_MAX_MEMORY_PRESSURE',
  outputBudgetMiB: 'DSEC_OUTPUT_BUDGET_MIB',
  trajectoryRetentionHours: 'DSEC_TRAJECTORY_RETENTION_HOURS',
  logLevel: 'DSEC_LOG_LEVEL',
};

export class OptionsError extends Error {
  override readonly name = 'OptionsError';
}

/** Flags over env over defaults; throws OptionsError naming the bad field. */
export function compileOptions(flags: Partial<Record<keyof ServerOptions, unknown>> = {}, env = process.env): ServerOptions {
  const merged: Record<string, unknown> = {};
  for (const key of Object.keys(ENV) as (keyof ServerOptions)[]) {
    const envValue = env[ENV[key]];
    if (envValue !== undefined && envValue !== '') merged[key] = envValue;
  }
  for (const [k, v] of Object.entries(flags)) if (v !== undefined) merged[k] = v;
  // Convert would cut "2.5" to 2: numbers must be written as integers.
  for (const key of [
    'maxSandboxes',
    'layerCacheMiB',
    'layerChunkKiB',
    'minFreeDiskMiB',
    'minAvailableMemoryMiB',
    'maxMemoryPressure',
    'outputBudgetMiB',
    'trajectoryRetentionHours',
  ] as const) {
    if (merged[key] !== undefined && !/^\d+$/.test(String(merged[key]))) {
      throw new OptionsError(`invalid option /${key}: ${JSON.stringify(merged[key])} is not a whole number`);
    }
  }
  const withDefaults = Value.Default(ServerOptions, Value.Convert(ServerOptions, merged));
  const errors = [...Value.Errors(ServerOptions, withDefaults)];
  if (errors.length > 0) {
    const e = errors[0]!;
    throw new OptionsError(`invalid option ${e.instancePath || '(root)'}: ${e.message}`);
  }
  const port = parseListen((withDefaults as ServerOptions).listen).port;
  if (port > 65535) throw new OptionsError(`invalid option /listen: port ${port} is above 65535`);
  const options = withDefaults as ServerOptions;
  // Absolute from here on: dsec-spawn carries a create's dirs into crun's mount namespace by path,
  // and joining a mount namespace resets the cwd to its root, so a relative path (--data-dir ./d)
  // named nothing there and every create fell back to the slow path.
  return { ...options, dataDir: resolve(options.dataDir) };
}

/** DSEC_REGISTRY_ALLOW's hosts, lowercase, without blanks. */
export function parseRegistryAllow(text: string): string[] {
  return text
    .split(',')
    .map((h) => h.trim().toLowerCase())
    .filter((h) => h !== '');
}

/** Where the port-link origin listens: DSEC_PORTS_LISTEN, else the API's host at its port + 8 (0 stays 0). */
export function portsListenOf(opts: Pick<ServerOptions, 'listen' | 'portsListen'>): { host: string; port: number } {
  if (opts.portsListen) return parseListen(opts.portsListen);
  const { host, port } = parseListen(opts.listen);
  return { host, port: port === 0 ? 0 : port + 8 };
}

export function parseListen(listen: string): { host: string; port: number } {
  const i = listen.lastIndexOf(':');
  return { host: listen.slice(0, i), port: Number(listen.slice(i + 1)) };
}
