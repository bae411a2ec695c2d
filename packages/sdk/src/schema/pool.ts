import { Type, type Static } from 'typebox';
import { CreateSandboxRequest } from './sandbox.js';

export const POOL_NAME_PATTERN = '^[a-z0-9][a-z0-9-]{0,62}$';
/** Ready sandboxes a pool may keep: a pool holds real sandboxes, each with its own memory and pids. */
export const MAX_POOL_SIZE = 1024;

/** The part of a create request a pool fixes: every ready sandbox is made from it. */
const specFields = {
  backend: CreateSandboxRequest.properties.backend,
  image: CreateSandboxRequest.properties.image,
  resources: CreateSandboxRequest.properties.resources,
  layers: CreateSandboxRequest.properties.layers,
  env: CreateSandboxRequest.properties.env,
  network: CreateSandboxRequest.properties.network,
  placement: CreateSandboxRequest.properties.placement,
};
export const PoolSpec = Type.Object(specFields, { additionalProperties: false });
export type PoolSpec = Static<typeof PoolSpec>;

export const CreatePoolRequest = Type.Object(
  {
    name: Type.String({ pattern: POOL_NAME_PATTERN, description: 'Pool name; creates name it with `pool`.' }),
    size: Type.Integer({
      minimum: 0,
      maximum: MAX_POOL_SIZE,
      description: 'Ready sandboxes to keep; refilled in the background after each claim.',
    }),
    ...specFields,
  },
  { additionalProperties: false },
);
export type CreatePoolRequest = Static<typeof CreatePoolRequest>;

export const PoolInfo = Type.Object(
  {
    name: Type.String(),
    size: Type.Integer({ description: 'Ready sandboxes the pool keeps.' }),
    spec: PoolSpec,
    ready: Type.Integer({ description: 'Sandboxes ready to be claimed now.' }),
    creating: Type.Integer({ description: 'Refills in flight.' }),
    claims: Type.Integer({ description: 'Creates served from a ready sandbox since the control plane started.' }),
    misses: Type.Integer({
      description: 'Creates for this pool that found no ready sandbox and were created on demand, since the control plane started.',
    }),
    refillFailures: Type.Integer({ description: 'Refill creates that failed since the control plane started.' }),
    lastRefillError: Type.Optional(Type.String()),
    refillMsP50: Type.Optional(Type.Number({ description: 'Median time of the last (up to 100) refill creates, ms.' })),
    refillMsLast: Type.Optional(Type.Number({ description: 'Time of the latest refill create, ms.' })),
    claimMsP50: Type.Optional(Type.Number({ description: 'Median time the control plane spent on the last (up to 100) claims, ms.' })),
    createdAt: Type.String({ format: 'date-time' }),
  },
  {},
);
export type PoolInfo = Static<typeof PoolInfo>;

export const PoolList = Type.Object({ pools: Type.Array(PoolInfo) });
export type PoolList = Static<typeof PoolList>;

export const PoolNameParams = Type.Object({ name: Type.String({ pattern: POOL_NAME_PATTERN }) });
