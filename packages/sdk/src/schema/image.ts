import { Type, type Static } from 'typebox';

export const ImageConfig = Type.Object({
  env: Type.Array(Type.String(), { description: 'KEY=VALUE entries.' }),
  cwd: Type.String(),
  user: Type.String({ description: 'uid[:gid] the sandbox processes run as.' }),
  entrypoint: Type.Array(Type.String()),
  cmd: Type.Array(Type.String()),
  labels: Type.Record(Type.String(), Type.String()),
});
export type ImageConfig = Static<typeof ImageConfig>;

export const ImageInfo = Type.Object(
  {
    id: Type.String({ description: 'sha256 of the canonical manifest.' }),
    names: Type.Array(Type.String()),
    layers: Type.Array(Type.String({ description: 'sha256:<hex> of an EROFS blob, bottom first.' })),
    config: ImageConfig,
    sizeBytes: Type.Integer({ description: 'Sum of the layer blob sizes.' }),
    createdAt: Type.String({ format: 'date-time' }),
  },
  {},
);
export type ImageInfo = Static<typeof ImageInfo>;

export const ImageList = Type.Object({ images: Type.Array(ImageInfo) }, {});
export type ImageList = Static<typeof ImageList>;

export const IMAGE_NAME_PATTERN = '^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9][a-z0-9._-]{0,62})?$';

export const BuildImageRequest = Type.Object(
  {
    builder: Type.Union([Type.Literal('busybox'), Type.Literal('debian')], { description: 'Which builder makes the root filesystem.' }),
    name: Type.Optional(Type.String({ pattern: IMAGE_NAME_PATTERN, description: 'Name to tag the image with; default the builder name.' })),
    packages: Type.Optional(
      Type.Array(Type.String({ pattern: '^[a-z0-9][a-z0-9+.-]{0,100}$' }), { maxItems: 200, description: 'debian: extra Debian packages (e.g. python3, git).' }),
    ),
  },
  { additionalProperties: false },
);
export type BuildImageRequest = Static<typeof BuildImageRequest>;
