import { Type, type Static } from 'typebox';

/** A project name: lower-case letters, digits and dashes, as in a DNS label. */
export const PROJECT_NAME_PATTERN = '^[a-z0-9][a-z0-9-]{0,62}$';

/** Every project starts with this one: keys from before projects, and the bootstrap key, are in it. */
export const DEFAULT_PROJECT = 'default';

const ProjectName = Type.String({ pattern: PROJECT_NAME_PATTERN, description: 'Project name: a-z, 0-9 and -, at most 63 characters.' });

export const ProjectQuota = Type.Object(
  {
    maxSandboxes: Type.Optional(
      Type.Integer({
        minimum: 0,
        description: 'Live sandboxes (creating, running, paused) at once; over it a create is refused with QUOTA_SANDBOXES_EXCEEDED (403).',
      }),
    ),
    maxCpu: Type.Optional(Type.Number({ minimum: 0, description: 'Sum of resources.cpu over live sandboxes; QUOTA_CPU_EXCEEDED (403).' })),
    maxMemoryMiB: Type.Optional(
      Type.Integer({ minimum: 0, description: 'Sum of resources.memoryMiB over live sandboxes; QUOTA_MEMORY_EXCEEDED (403).' }),
    ),
    createsPerSecond: Type.Optional(
      Type.Number({
        exclusiveMinimum: 0,
        description:
          'Sandbox creates per second (a token bucket holding one second of creates); QUOTA_CREATE_RATE_EXCEEDED (429). Batches are paced to it instead.',
      }),
    ),
  },
  { additionalProperties: false, description: 'A field left out is unlimited.' },
);
export type ProjectQuota = Static<typeof ProjectQuota>;

export const QuotaName = Type.Union([
  Type.Literal('maxSandboxes'),
  Type.Literal('maxCpu'),
  Type.Literal('maxMemoryMiB'),
  Type.Literal('createsPerSecond'),
]);
export type QuotaName = Static<typeof QuotaName>;

export const UpdateProjectRequest = Type.Object(
  {
    quota: Type.Optional(ProjectQuota),
    clear: Type.Optional(Type.Array(QuotaName, { description: 'Quotas to remove (unlimited).' })),
  },
  { additionalProperties: false, description: 'Quotas given are set, those in clear removed, the others stay as they are.' },
);
export type UpdateProjectRequest = Static<typeof UpdateProjectRequest>;

export const ProjectUsage = Type.Object({
  sandboxes: Type.Integer({ description: 'Live sandboxes (creating, running, paused).' }),
  cpu: Type.Number(),
  memoryMiB: Type.Integer(),
});
export type ProjectUsage = Static<typeof ProjectUsage>;

export const ProjectInfo = Type.Object({
  name: Type.String(),
  quota: ProjectQuota,
  usage: ProjectUsage,
  createdAt: Type.String({ format: 'date-time' }),
});
export type ProjectInfo = Static<typeof ProjectInfo>;

export const ProjectList = Type.Object({ projects: Type.Array(ProjectInfo) });
export type ProjectList = Static<typeof ProjectList>;

export const CreateProjectRequest = Type.Object({ name: ProjectName, quota: Type.Optional(ProjectQuota) }, { additionalProperties: false });
export type CreateProjectRequest = Static<typeof CreateProjectRequest>;

export const ProjectNameParams = Type.Object({ name: ProjectName });

export const CreateKeyRequest = Type.Object(
  {
    project: ProjectName,
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 128, description: 'What the key is for (shown by key ls).' })),
    admin: Type.Optional(Type.Boolean({ default: false, description: 'An admin key manages projects and keys and sees every project.' })),
  },
  { additionalProperties: false },
);
export type CreateKeyRequest = Static<typeof CreateKeyRequest>;

export const ApiKeyInfo = Type.Object({
  id: Type.String(),
  name: Type.String(),
  project: Type.String(),
  admin: Type.Boolean(),
  createdAt: Type.String({ format: 'date-time' }),
  revokedAt: Type.Optional(Type.String({ format: 'date-time' })),
  mintedBy: Type.Optional(
    Type.String({ description: 'The key that minted this one (POST /v1/e2b/keys); revoking that key revokes this one too.' }),
  ),
});
export type ApiKeyInfo = Static<typeof ApiKeyInfo>;

export const CreatedKey = Type.Object({
  id: Type.String(),
  key: Type.String({ description: 'The key itself: shown once; only its hash is stored.' }),
  project: Type.String(),
  admin: Type.Boolean(),
});
export type CreatedKey = Static<typeof CreatedKey>;

export const KeyList = Type.Object({ keys: Type.Array(ApiKeyInfo) });
export type KeyList = Static<typeof KeyList>;

export const KeyIdParams = Type.Object({ id: Type.String({ pattern: '^key_[0-9a-f]{12}$' }) });
