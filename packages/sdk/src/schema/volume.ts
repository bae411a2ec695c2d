import { Type, type Static } from 'typebox';
import { Labels } from './common.js';

export const VolumeName = Type.String({
  pattern: '^[a-z0-9][a-z0-9._-]{0,62}$',
  description: 'Volume name: lowercase letters, digits, . _ - (up to 63).',
});

/** Most volumes one sandbox mounts. */
export const MAX_SANDBOX_VOLUMES = 16;

export const VolumeMount = Type.Object(
  {
    name: VolumeName,
    path: Type.String({
      minLength: 2,
      maxLength: 1024,
      pattern: '^/[^\\u0000]*$',
      description: 'Where it appears in the sandbox: an absolute path, not /, not under /proc, /sys or /dev.',
    }),
    readOnly: Type.Optional(Type.Boolean({ default: false, description: 'Mount it read-only (writes fail with EROFS).' })),
  },
  { additionalProperties: false },
);
export type VolumeMount = Static<typeof VolumeMount>;

export const CreateVolumeRequest = Type.Object(
  {
    name: VolumeName,
    labels: Type.Optional(Labels),
    edge: Type.Optional(
      Type.String({
        maxLength: 64,
        description:
          'The edge (node) to keep it on; default: the ready edge with the most free sandbox slots. Sandboxes that mount it run there.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateVolumeRequest = Static<typeof CreateVolumeRequest>;

export const VolumeInfo = Type.Object({
  name: Type.String(),
  project: Type.String({ description: 'The project that owns it: only its keys see it, only its sandboxes mount it.' }),
  edge: Type.String({ description: 'The node whose disk holds it; every sandbox that mounts it is placed there.' }),
  labels: Type.Record(Type.String(), Type.String()),
  createdAt: Type.String({ format: 'date-time' }),
  mountedBy: Type.Array(Type.String(), { description: 'Sandboxes (creating, running, paused or lost) that mount it.' }),
  bytes: Type.Optional(Type.Integer({ description: 'Apparent size of its files (du -sb), on inspect of one volume.' })),
});
export type VolumeInfo = Static<typeof VolumeInfo>;

export const VolumeList = Type.Object({ volumes: Type.Array(VolumeInfo) });
export type VolumeList = Static<typeof VolumeList>;

export const VolumeNameParams = Type.Object({ name: VolumeName });
