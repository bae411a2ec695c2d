import { Type, type Static } from 'typebox';
import { EnvMap, Labels } from './common.js';
import { NetworkPolicyRequest } from './network.js';
import { MAX_SANDBOX_VOLUMES, VolumeMount } from './volume.js';

/** Resource limits, enforced by cgroups on the edge. Every field has a default. */
export const Resources = Type.Object(
  {
    cpu: Type.Optional(
      Type.Number({
        minimum: 0.05,
        maximum: 64,
        description: 'CPU cores: cgroup shares (1 core = 1024) and a CFS quota of this many cores.',
        default: 1,
      }),
    ),
    memoryMiB: Type.Optional(Type.Integer({ minimum: 16, maximum: 262144, description: 'Memory limit in MiB (no swap).', default: 512 })),
    pids: Type.Optional(
      Type.Integer({ minimum: 8, maximum: 65536, description: 'Maximum number of processes and threads.', default: 512 }),
    ),
    diskMiB: Type.Optional(
      Type.Integer({
        minimum: 16,
        maximum: 1048576,
        description:
          'Size limit of the writable layer: writes past it fail with ENOSPC inside the sandbox. Unset: no limit of its own (faster create).',
      }),
    ),
  },
  { additionalProperties: false },
);
export type Resources = Static<typeof Resources>;

export const SandboxStatus = Type.Union(
  [
    Type.Literal('creating'),
    Type.Literal('running'),
    Type.Literal('paused'),
    Type.Literal('stopped'),
    Type.Literal('failed'),
    Type.Literal('lost'),
  ],
  {
    description:
      'creating → running | failed; running ⇄ paused (memory kept); stopped: ended by its TTL or idle policy (resources freed, record kept); lost: its edge stopped reporting (reason says which); calls answer 503 EDGE_UNAVAILABLE with details.retryable (the SDKs retry them within the call timeout); if the edge comes back the sandbox is running (or paused) again with an edge.gap step in its trajectory, unless it was replayed meanwhile (POST …/replay makes it failed, "replayed as …", and it is killed); kill (DELETE) removes the sandbox and its record.',
  },
);
export type SandboxStatus = Static<typeof SandboxStatus>;

export const SandboxBackend = Type.Union([Type.Literal('container'), Type.Literal('microvm'), Type.Literal('vm')], {
  description:
    'Isolation backend. container: crun on the host kernel. microvm: a QEMU microVM (virtio-mmio, no firmware) with its own kernel. vm: a QEMU q35 machine with PCI. VMs serve exec, sessions, writablePaths (Landlock in the guest kernel), files (tar included), background processes, terminals, ports, pause/resume, kill, network policies fork (a live fork: memory and disk restored into new VMs on the same edge) and snapshots as images (the changes to the guest disk as a layer that containers and VMs start from); volumes answer BACKEND_UNSUPPORTED.',
  default: 'container',
});
export type SandboxBackend = Static<typeof SandboxBackend>;

export const CreateSandboxRequest = Type.Object(
  {
    backend: Type.Optional(SandboxBackend),
    pool: Type.Optional(
      Type.String({
        pattern: '^[a-z0-9][a-z0-9-]{0,62}$',
        description:
          "Claim a ready sandbox from this warm pool (POST /v1/pools) instead of creating one; the rest of the spec must match the pool's. With no ready sandbox the create happens on demand (a miss). A create whose spec matches a pool's claims from it too.",
      }),
    ),
    image: Type.String({
      minLength: 1,
      maxLength: 200,
      description: 'Image name (e.g. "busybox", "debian:py") or id ("sha256:…").',
    }),
    resources: Type.Optional(Resources),
    layers: Type.Optional(
      Type.Array(Type.String({ minLength: 1, maxLength: 200 }), {
        maxItems: 64,
        description:
          'Images (names or ids) or layer digests stacked over the base image, in order (workspace, toolkits). No layer data is copied.',
      }),
    ),
    env: Type.Optional(EnvMap),
    labels: Type.Optional(Labels),
    network: Type.Optional(NetworkPolicyRequest),
    volumes: Type.Optional(
      Type.Array(VolumeMount, {
        maxItems: MAX_SANDBOX_VOLUMES,
        description:
          'Named volumes (POST /v1/volumes) bind-mounted at create, nosuid and nodev, read-write unless readOnly. The sandbox runs on the edge that holds them.',
      }),
    ),
    placement: Type.Optional(
      Type.Object(
        {
          pool: Type.Optional(
            Type.String({ pattern: '^[a-z0-9][a-z0-9-]{0,31}$', description: 'Run on edges of this pool.', default: 'default' }),
          ),
          labels: Type.Optional(
            Type.Record(Type.String({ maxLength: 63 }), Type.String({ maxLength: 63 }), {
              description: 'Run only on edges that carry every one of these labels.',
            }),
          ),
          burst: Type.Optional(
            Type.Boolean({
              description: 'May go to the burst pool when the pool is above the burst threshold (default 80 %) or full.',
              default: false,
            }),
          ),
        },
        { additionalProperties: false, description: 'Where the sandbox may run (a cluster of edges).' },
      ),
    ),
    ttlSeconds: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 30 * 86400, description: 'Absolute lifetime; on expiry the onExpiry action applies.' }),
    ),
    idleTimeoutSeconds: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 30 * 86400,
        description: 'Seconds without exec/files/session activity before the onExpiry action applies.',
      }),
    ),
    onExpiry: Type.Optional(
      Type.Union([Type.Literal('stop'), Type.Literal('pause')], {
        default: 'stop',
        description: 'stop frees everything (record kept as stopped); pause freezes it.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateSandboxRequest = Static<typeof CreateSandboxRequest>;

/**
 * What a sandbox has used, read live on inspect (GET /v1/sandboxes/{id}) of a running or paused
 * sandbox. The optional figures are left out where the sandbox's backend or the host cannot give
 * them (a microVM's disk and network; a cgroup v1 host's memory peak before its edge's restart).
 */
export const SandboxUsage = Type.Object(
  {
    oomKills: Type.Integer({ description: 'Processes the kernel killed for exceeding the memory limit (OOM), since create.' }),
    memoryBytes: Type.Integer({ description: 'Memory in use now (its memory cgroup, page cache included).' }),
    peakMemoryBytes: Type.Optional(
      Type.Integer({ description: "The most memory it has used at once (on a cgroup v1 host: since its edge's last start)." }),
    ),
    cpuMs: Type.Optional(Type.Number({ description: 'CPU time its processes have used, user and system, since create.' })),
    pids: Type.Integer({ description: 'Processes (threads included) now.' }),
    diskBytes: Type.Optional(
      Type.Integer({ description: 'Disk used by what it wrote: its writable layer (the upper), in allocated bytes.' }),
    ),
    netRxBytes: Type.Optional(
      Type.Integer({ description: 'Bytes it received on its network link since the link was made (0 without one).' }),
    ),
    netTxBytes: Type.Optional(Type.Integer({ description: 'Bytes it sent on its network link since the link was made (0 without one).' })),
  },
  { description: 'Live usage, on inspect of a running or paused sandbox.' },
);
export type SandboxUsage = Static<typeof SandboxUsage>;

export const SandboxInfo = Type.Object(
  {
    id: Type.String({
      description: 'Sandbox id: sb-<edge>-<random>, naming the edge it was created on (a move keeps the id; `edge` says where it runs).',
    }),
    edge: Type.String(),
    project: Type.Optional(Type.String({ description: 'The project whose key created it (docs/PROJECTS.md).' })),
    backend: SandboxBackend,
    status: SandboxStatus,
    image: Type.String({ description: 'The image as requested.' }),
    imageId: Type.String({ description: 'The resolved image id.' }),
    resources: Type.Object({ cpu: Type.Number(), memoryMiB: Type.Integer(), pids: Type.Integer(), diskMiB: Type.Optional(Type.Integer()) }),
    labels: Type.Record(Type.String(), Type.String()),
    layers: Type.Array(Type.String(), { description: 'Every layer digest of the sandbox, bottom first.' }),
    createdAt: Type.String({ format: 'date-time' }),
    reason: Type.Optional(Type.String({ description: 'Why the sandbox failed or stopped.' })),
    ttlSeconds: Type.Optional(Type.Integer()),
    idleTimeoutSeconds: Type.Optional(Type.Integer()),
    onExpiry: Type.Union([Type.Literal('stop'), Type.Literal('pause')]),
    expiresAt: Type.Optional(Type.String({ format: 'date-time', description: 'When the TTL ends.' })),
    lastActivityAt: Type.String({ format: 'date-time' }),
    usage: Type.Optional(SandboxUsage),
    migration: Type.Optional(
      Type.Object(
        { to: Type.String({ description: 'The edge it is moving to.' }), since: Type.String({ format: 'date-time' }) },
        {
          description:
            'Present while the sandbox moves to another edge (POST /v1/sandboxes/{id}/migrate): calls wait for the move or get SANDBOX_MIGRATING.',
        },
      ),
    ),
  },
  {},
);
export type SandboxInfo = Static<typeof SandboxInfo>;

export const SandboxList = Type.Object(
  {
    sandboxes: Type.Array(SandboxInfo),
    next: Type.Optional(
      Type.String({ description: 'With `limit`: the cursor of the next page (pass it as `after`); absent on the last page.' }),
    ),
  },
  {},
);
export type SandboxList = Static<typeof SandboxList>;

export const SandboxIdParams = Type.Object({
  id: Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$', description: 'Sandbox id.' }),
});

/** The order of a list's pages: oldest first (the default) or newest first. */
export const ListOrder = Type.Union([Type.Literal('oldest'), Type.Literal('newest')]);
export type ListOrder = Static<typeof ListOrder>;

export const ListSandboxesQuery = Type.Object(
  {
    label: Type.Optional(
      Type.Union([Type.String({ pattern: '^[^=]+=.*$' }), Type.Array(Type.String({ pattern: '^[^=]+=.*$' }))], {
        description: 'Filter: k=v; repeat for several (all must match).',
      }),
    ),
    status: Type.Optional(SandboxStatus),
    project: Type.Optional(
      Type.String({ description: "Filter by project (an admin key; another key always sees its own project's sandboxes only)." }),
    ),
    limit: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 10_000,
        description: 'At most this many, in `order`, and `next` when there are more (default: all).',
      }),
    ),
    after: Type.Optional(
      Type.String({ minLength: 1, description: "The page after this cursor (a previous page's `next`, of the same filters and order)." }),
    ),
    order: Type.Optional(
      Type.Union(ListOrder.anyOf, {
        description:
          'Oldest first (the default) or newest first: `limit` with `newest` is the latest sandboxes, read as one range of an index.',
      }),
    ),
  },
  { additionalProperties: false },
);

export const SandboxCounts = Type.Object({
  counts: Type.Record(Type.String(), Type.Integer({ minimum: 0 }), { description: 'Sandboxes by status (statuses with none are absent).' }),
  total: Type.Integer({ minimum: 0 }),
});
export type SandboxCounts = Static<typeof SandboxCounts>;

export const SandboxCountsQuery = Type.Object(
  {
    project: Type.Optional(
      Type.String({ description: "Count one project's (an admin key; another key always counts its own project's only)." }),
    ),
  },
  { additionalProperties: false },
);

export const SnapshotRequest = Type.Object(
  {
    name: Type.Optional(
      Type.String({
        pattern: '^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9][a-z0-9._-]{0,62})?$',
        description: 'Tag the snapshot image with this name.',
      }),
    ),
    scrub: Type.Optional(
      Type.Array(Type.String({ pattern: '^/', maxLength: 4096 }), {
        maxItems: 256,
        description: 'Paths left out of the snapshot (default: apt caches and lists, /root/.cache, /var/log/apt).',
      }),
    ),
    keep: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'Keep the image after the sandbox is gone. An unnamed snapshot that is not kept is deleted once its sandbox and every sandbox started from it are killed; a named one is always kept.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type SnapshotRequest = Static<typeof SnapshotRequest>;

export const SnapshotResult = Type.Object({
  imageId: Type.String({ description: 'Create sandboxes from this image id to restore the snapshot.' }),
  layers: Type.Array(Type.String()),
  layerAdded: Type.Boolean({ description: 'False when the sandbox had changed nothing: the image reuses its layers.' }),
  frozenMs: Type.Number({ description: 'How long the sandbox was frozen for the capture.' }),
  entries: Type.Integer(),
  bytes: Type.Integer(),
  whiteouts: Type.Integer(),
  opaqueDirs: Type.Integer(),
  sparseFiles: Type.Integer({ description: 'Sparse files kept sparse (the layer is then built in chunked mode, which is slower).' }),
  kept: Type.Boolean({
    description:
      'True when the image outlives the sandbox (named, keep: true, or an image that existed already); false when it is deleted with the sandbox and the sandboxes started from it.',
  }),
});
export type SnapshotResult = Static<typeof SnapshotResult>;

export const MigrateRequest = Type.Object(
  {
    edge: Type.Optional(Type.String({ pattern: '^[a-z0-9]{1,32}$', description: 'The edge to move to; placement picks one when absent.' })),
    pool: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 64,
        description: "The pool to move into (placement picks its edge); the sandbox's own when absent.",
      }),
    ),
    restartProcesses: Type.Optional(
      Type.Boolean({
        description:
          "A container's processes cannot move: without this a container that runs any besides its init is refused (SANDBOX_NOT_MIGRATABLE, `details.processes`); with it they are ended and the answer names them.",
      }),
    ),
  },
  { additionalProperties: false },
);
export type MigrateRequest = Static<typeof MigrateRequest>;

export const MigrateResult = Type.Object({
  sandbox: SandboxInfo,
  from: Type.String({ description: 'The edge it ran on.' }),
  to: Type.String({ description: 'The edge it runs on now.' }),
  ms: Type.Number({ description: 'From the call to running on the new edge.' }),
  heldMs: Type.Number({
    description: 'How long it was held still (frozen, its calls waiting): from the quiesce to running on the new edge.',
  }),
  bytes: Type.Integer({ description: 'Bytes of its writable layer that moved.' }),
  endedProcesses: Type.Array(Type.Object({ pid: Type.Integer(), cmd: Type.String() }), {
    description: 'Processes ended for the move (restartProcesses), as the sandbox numbered them.',
  }),
});
export type MigrateResult = Static<typeof MigrateResult>;

export const ForkRequest = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: 256, description: 'How many sandboxes to start from one snapshot.' }),
    labels: Type.Optional(Labels),
  },
  { additionalProperties: false },
);
export type ForkRequest = Static<typeof ForkRequest>;

export const ForkResult = Type.Object({
  snapshot: SnapshotResult,
  sandboxes: Type.Array(SandboxInfo),
  failures: Type.Array(Type.Object({ code: Type.String(), message: Type.String() })),
});
export type ForkResult = Static<typeof ForkResult>;

/** Which sandboxes a bulk operation applies to: those whose labels match all of these. */
export const BulkRequest = Type.Object(
  {
    labels: Type.Record(Type.String({ minLength: 1, maxLength: 128 }), Type.String({ maxLength: 512 }), {
      minProperties: 1,
      maxProperties: 64,
      description: 'Sandboxes whose labels contain every pair (at least one: a bulk call never means "all").',
    }),
  },
  { additionalProperties: false },
);
export type BulkRequest = Static<typeof BulkRequest>;

export const BulkResult = Type.Object({
  ids: Type.Array(Type.String(), { description: 'Sandboxes the operation was applied to.' }),
  failures: Type.Array(Type.Object({ id: Type.String(), code: Type.String(), message: Type.String() }), {
    description: 'Sandboxes it failed on (the others are done).',
  }),
});
export type BulkResult = Static<typeof BulkResult>;

export const BulkProgress = Type.Object(
  {
    type: Type.Union([Type.Literal('progress'), Type.Literal('done')], {
      description: 'progress: a report while it runs (about every 500 ms); done: the last line, with the result.',
    }),
    total: Type.Integer({ description: 'Sandboxes the labels selected.' }),
    done: Type.Integer({ description: 'Those finished so far (applied or failed).' }),
    failed: Type.Integer({ description: 'Those it failed on so far.' }),
    ids: Type.Optional(Type.Array(Type.String(), { description: 'done only: the sandboxes it was applied to.' })),
    failures: Type.Optional(Type.Array(Type.Object({ id: Type.String(), code: Type.String(), message: Type.String() }))),
  },
  { description: 'A line of a bulk call streamed as NDJSON (Accept: application/x-ndjson).' },
);
export type BulkProgress = Static<typeof BulkProgress>;
