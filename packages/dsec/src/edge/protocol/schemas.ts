import { Type, type Static } from 'typebox';
import { FnRunRequest, ImageConfig, LayerCacheStats, SandboxBackend, SandboxUsage, OpenSessionRequest } from '@dsec/sdk/schema';

/**
 * The edge protocol: what crosses the control plane ↔ edge seam, as schemas. The edge's HTTP
 * server validates with them and serves them as an OpenAPI document (`/edge/v1/openapi.json`);
 * the in-process edge is typed by them. Everything here is data: terminals, output and tar
 * archives travel as byte streams, errors as `{error:{code,message,details}}` with registry codes.
 */
export const EDGE_PROTOCOL_VERSION = 1;
export const EDGE_PREFIX = '/edge/v1';

const Digest = Type.String({ pattern: '^sha256:[0-9a-f]{64}$' });
const SandboxId = Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$' });

/** Limits after defaults are applied: every field is set. */
export const SandboxLimits = Type.Object(
  {
    cpu: Type.Number({ exclusiveMinimum: 0 }),
    memoryMiB: Type.Integer({ minimum: 1 }),
    pids: Type.Integer({ minimum: 1 }),
    /** Size of the writable layer; unset: no limit of its own (it shares the node's disk). */
    diskMiB: Type.Optional(Type.Integer({ minimum: 1 })),
  },
  { additionalProperties: false },
);
export type SandboxLimits = Static<typeof SandboxLimits>;

/**
 * An egress policy as the caller wrote it: host names are resolved by the edge, on its node
 * (a fact of the node, like its memory), not by the control plane.
 */
export const EdgeNetworkRequest = Type.Object(
  {
    mode: Type.Union([Type.Literal('none'), Type.Literal('allow'), Type.Literal('open')]),
    allow: Type.Array(Type.String({ minLength: 1, maxLength: 300 }), { maxItems: 256 }),
  },
  { additionalProperties: false },
);
export type EdgeNetworkRequest = Static<typeof EdgeNetworkRequest>;

/**
 * An open shell session as it moves with its sandbox (a migration): its id, its shell, the request
 * it was opened with and what its last command left (cwd and the script that recreates the rest).
 */
export const EdgeSessionCarry = Type.Object(
  {
    id: Type.String({ pattern: '^ss-[0-9a-f]{12}$' }),
    shell: Type.Union([Type.Literal('/bin/bash'), Type.Literal('/bin/sh')]),
    request: OpenSessionRequest,
    state: Type.Optional(Type.Object({ cwd: Type.String({ maxLength: 4096 }), script: Type.String() }, { additionalProperties: false })),
    commands: Type.Integer({ minimum: 0 }),
    createdAt: Type.String(),
  },
  { additionalProperties: false },
);
export type EdgeSessionCarry = Static<typeof EdgeSessionCarry>;

/** What the control plane asks an edge to run: everything resolved, nothing left to look up. */
export const EdgeCreateRequest = Type.Object(
  {
    id: SandboxId,
    /** Layers bottom first. */
    layers: Type.Array(Digest, { minItems: 1, maxItems: 128 }),
    config: ImageConfig,
    env: Type.Record(Type.String(), Type.String()),
    limits: SandboxLimits,
    /** Isolation backend; container when absent. */
    backend: Type.Optional(SandboxBackend),
    /** Egress policy applied right after start; none (loopback only) when absent. */
    network: Type.Optional(EdgeNetworkRequest),
    /** A moved container's open shell sessions, reopened with the same ids and state. */
    sessions: Type.Optional(Type.Array(EdgeSessionCarry, { maxItems: 32 })),
    /** VMs only: start from the latest snapshot of this VM on the same edge (memory, devices, disk) instead of booting. */
    restoreFrom: Type.Optional(SandboxId),
    /**
     * VMs only: start from a VM state blob (a snapshot with `portable`, made on any edge), fetched
     * from the cluster's blob store, instead of booting: memory, devices and disk as saved. Its
     * layers must be the request's; RAM and vCPUs are the saved VM's.
     */
    restoreState: Type.Optional(Digest),
    /** Volumes of this edge to bind-mount (nosuid, nodev), each at its path. */
    volumes: Type.Optional(
      Type.Array(
        Type.Object(
          {
            name: Type.String({ pattern: '^[a-z0-9][a-z0-9._-]{0,62}$' }),
            path: Type.String({ minLength: 2, maxLength: 1024 }),
            readOnly: Type.Boolean(),
          },
          { additionalProperties: false },
        ),
        {
          maxItems: 16,
        },
      ),
    ),
  },
  { additionalProperties: false },
);
export type EdgeCreateRequest = Static<typeof EdgeCreateRequest>;

/** Many creates in one request: a batch's group for one edge (each item succeeds or fails alone). */
export const MAX_EDGE_CREATE_GROUP = 1024;
export const EdgeCreateGroupRequest = Type.Object(
  { sandboxes: Type.Array(EdgeCreateRequest, { minItems: 1, maxItems: MAX_EDGE_CREATE_GROUP }) },
  { additionalProperties: false },
);

export const EdgeSandboxStatus = Type.Union([Type.Literal('running'), Type.Literal('paused')]);
export type EdgeSandboxStatus = Static<typeof EdgeSandboxStatus>;

export const EdgeSandbox = Type.Object({ id: Type.String(), status: EdgeSandboxStatus, pid: Type.Integer(), createdAt: Type.String() });
export type EdgeSandbox = Static<typeof EdgeSandbox>;
export const EdgeSandboxList = Type.Object({ sandboxes: Type.Array(EdgeSandbox) });

/** One item of a group create: the sandbox, or the error (a registry code) that item got. */
export const EdgeCreateOutcome = Type.Object({
  id: Type.String(),
  sandbox: Type.Optional(EdgeSandbox),
  error: Type.Optional(Type.Object({ code: Type.String(), message: Type.String(), details: Type.Record(Type.String(), Type.Unknown()) })),
});
export type EdgeCreateOutcome = Static<typeof EdgeCreateOutcome>;
export const EdgeCreateGroupResult = Type.Object({ results: Type.Array(EdgeCreateOutcome) });

/** What a node has and has promised, as its edge measures it: placement decides from this. */
export const EdgeCapacity = Type.Object({
  cpus: Type.Integer({ description: 'CPUs of the node.' }),
  memoryBytes: Type.Integer({ description: 'Memory of the node.' }),
  memoryAvailableBytes: Type.Integer({ description: 'MemAvailable now.' }),
  cpuCommitted: Type.Number({ description: 'Sum of the cpu limits of its sandboxes.' }),
  memoryCommittedMiB: Type.Integer({ description: 'Sum of the memory limits of its sandboxes.' }),
  pidsCommitted: Type.Integer({ description: 'Sum of the pids limits of its sandboxes.' }),
  pidMax: Type.Integer({ description: 'kernel.pid_max of the node.' }),
  pidsInUse: Type.Integer({ description: 'Processes and threads on the node now.' }),
  vms: Type.Optional(
    Type.Object({
      slots: Type.Integer({ description: 'microVM/VM sandboxes the node takes at most (DSEC_MAX_VMS).' }),
      running: Type.Integer({ description: 'VM sandboxes on the node now (being created included).' }),
      memoryCommittedMiB: Type.Integer({ description: 'Guest RAM plus QEMU overhead of its VMs, each charged to its cgroup.' }),
      overheadMiB: Type.Integer({ description: 'Host memory a VM takes beyond its guest RAM.' }),
    }),
  ),
  cpuUsage: Type.Optional(Type.Number({ description: "Share of the node's CPU time busy since the previous measurement, 0..1." })),
});
export type EdgeCapacity = Static<typeof EdgeCapacity>;

export const EdgeInfo = Type.Object({
  id: Type.String(),
  protocol: Type.Integer({ description: 'Edge protocol version.' }),
  version: Type.String({ description: 'dsec version of the edge.' }),
  state: Type.Union([Type.Literal('starting'), Type.Literal('running'), Type.Literal('draining'), Type.Literal('stopped')]),
  sandboxes: Type.Integer(),
  maxSandboxes: Type.Integer(),
  capacity: EdgeCapacity,
  layerCache: LayerCacheStats,
  /** Layers in the node's cache (for placement by locality). */
  cachedLayers: Type.Array(Type.String()),
});
export type EdgeInfo = Static<typeof EdgeInfo>;

/** EdgeInfo as a heartbeat carries it: the cached layers may come as changes instead (layer-delta.ts). */
export const EdgeHeartbeatInfo = Type.Object({ ...EdgeInfo.properties, cachedLayers: Type.Optional(Type.Array(Type.String())) });
export type EdgeHeartbeatInfo = Static<typeof EdgeHeartbeatInfo>;

export const DiffStats = Type.Object({
  entries: Type.Integer(),
  bytes: Type.Integer(),
  whiteouts: Type.Integer(),
  opaqueDirs: Type.Integer(),
  sparseFiles: Type.Integer(),
});

/** What pack_diff captured: a new layer over the sandbox's own layers, or none if nothing changed. */
export const EdgeSnapshot = Type.Object({
  layer: Type.Union([Digest, Type.Null()]),
  baseLayers: Type.Array(Type.String()),
  config: ImageConfig,
  stats: DiffStats,
  frozenMs: Type.Number(),
  /** With `portable`: the VM state blob in the cluster's blob store (a create's `restoreState`), and its size. */
  state: Type.Optional(Type.Object({ digest: Digest, bytes: Type.Integer() })),
});
export type EdgeSnapshot = Static<typeof EdgeSnapshot>;

export const EdgeSnapshotRequest = Type.Object(
  {
    scrub: Type.Optional(Type.Array(Type.String({ pattern: '^/' }), { maxItems: 256 })),
    /** A VM's memory, device and disk state kept on its edge for restores (a live fork), not an image. */
    memory: Type.Optional(Type.Boolean()),
    /**
     * With `memory`: the state goes to the cluster's blob store as one blob (`state` in the answer)
     * for a restore on any edge; the VM stays paused after the save (the caller kills or resumes it).
     */
    portable: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
);

/**
 * A sandbox held still for a move (control/service/migration.ts): frozen, and its processes other
 * than its init listed (a container's cannot move without a checkpointer); ended when asked.
 */
export const EdgeQuiesceRequest = Type.Object(
  {
    /** End the processes found (SIGKILL) instead of refusing: the sandbox moves without them. */
    endProcesses: Type.Boolean(),
  },
  { additionalProperties: false },
);
export type EdgeQuiesceRequest = Static<typeof EdgeQuiesceRequest>;

export const EdgeQuiesce = Type.Object({
  /** Processes besides the init, as the sandbox sees them (pid in its own namespace, its command line). */
  processes: Type.Array(Type.Object({ pid: Type.Integer(), cmd: Type.String() })),
  /** Whether those processes were ended. */
  ended: Type.Boolean(),
  /** Whether it was paused before (a failed move leaves it paused then, else resumes it). */
  wasPaused: Type.Boolean(),
  /** Whether it is frozen now: false when it was left running because it had processes and none were to be ended. */
  frozen: Type.Boolean(),
  /** Its open shell sessions, to reopen where it moves (a container's). */
  sessions: Type.Optional(Type.Array(EdgeSessionCarry)),
});
export type EdgeQuiesce = Static<typeof EdgeQuiesce>;

export const EdgeLink = Type.Object({ index: Type.Integer(), host: Type.String(), sandbox: Type.String() });
export const EdgeNetworkState = Type.Object({
  policy: Type.Object({
    mode: Type.String(),
    allow: Type.Array(Type.Object({ cidr: Type.String(), port: Type.Optional(Type.Integer()) })),
  }),
  link: Type.Optional(EdgeLink),
  appliedMs: Type.Optional(Type.Number()),
});

/** A sandbox's live usage, as the public API gives it on inspect. */
export const EdgeUsage = SandboxUsage;

/**
 * A function call for the node's FnCall backend: the call with its defaults filled and its image
 * resolved by the control plane (the edge reads no image store). Answered with FnRunResult.
 */
export const EdgeFnRequest = Type.Object(
  {
    call: FnRunRequest,
    imageId: Type.String({ minLength: 1, maxLength: 200 }),
    layers: Type.Array(Digest, { minItems: 1, maxItems: 128 }),
    config: ImageConfig,
    /** The caller's project: workers are kept per project, so a worker never serves two. */
    tenant: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  },
  { additionalProperties: false },
);
export type EdgeFnRequest = Static<typeof EdgeFnRequest>;

export const EdgeVolumeUsage = Type.Object({ bytes: Type.Integer() });
