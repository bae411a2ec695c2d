import { Type, type Static } from 'typebox';
import { EnvMap, Labels } from './common.js';

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
    memoryMiB: Type.Optional(
      Type.Integer({ minimum: 16, maximum: 262144, description: 'Memory limit in MiB (no swap).', default: 512 }),
    ),
    pids: Type.Optional(
      Type.Integer({ minimum: 8, maximum: 65536, description: 'Maximum number of processes and threads.', default: 512 }),
    ),
  },
  { additionalProperties: false },
);
export type Resources = Static<typeof Resources>;

export const SandboxStatus = Type.Union(
  [Type.Literal('creating'), Type.Literal('running'), Type.Literal('failed'), Type.Literal('killed')],
  { description: 'creating → running | failed; kill removes the sandbox.' },
);
export type SandboxStatus = Static<typeof SandboxStatus>;

export const CreateSandboxRequest = Type.Object(
  {
    backend: Type.Optional(Type.Literal('container', { description: 'Isolation backend.', default: 'container' })),
    image: Type.String({
      minLength: 1,
      maxLength: 200,
      description: 'Image name (e.g. "busybox", "debian:py") or id ("sha256:…").',
    }),
    resources: Type.Optional(Resources),
    env: Type.Optional(EnvMap),
    labels: Type.Optional(Labels),
  },
  { additionalProperties: false },
);
export type CreateSandboxRequest = Static<typeof CreateSandboxRequest>;

export const SandboxInfo = Type.Object(
  {
    id: Type.String({ description: 'Sandbox id; encodes the edge it runs on: sb-<edge>-<random>.' }),
    edge: Type.String(),
    backend: Type.Literal('container'),
    status: SandboxStatus,
    image: Type.String({ description: 'The image as requested.' }),
    imageId: Type.String({ description: 'The resolved image id.' }),
    resources: Type.Object({ cpu: Type.Number(), memoryMiB: Type.Integer(), pids: Type.Integer() }),
    labels: Type.Record(Type.String(), Type.String()),
    createdAt: Type.String({ format: 'date-time' }),
    reason: Type.Optional(Type.String({ description: 'Why the sandbox failed, when status is failed.' })),
  },
  {},
);
export type SandboxInfo = Static<typeof SandboxInfo>;

export const SandboxList = Type.Object({ sandboxes: Type.Array(SandboxInfo) }, {});
export type SandboxList = Static<typeof SandboxList>;

export const SandboxIdParams = Type.Object({
  id: Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$', description: 'Sandbox id.' }),
});

export const ListSandboxesQuery = Type.Object(
  {
    label: Type.Optional(
      Type.Union([Type.String({ pattern: '^[^=]+=.*$' }), Type.Array(Type.String({ pattern: '^[^=]+=.*$' }))], {
        description: 'Filter: k=v; repeat for several (all must match).',
      }),
    ),
    status: Type.Optional(SandboxStatus),
  },
  { additionalProperties: false },
);
