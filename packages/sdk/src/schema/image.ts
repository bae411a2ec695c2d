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
    snapshotOf: Type.Optional(
      Type.String({
        description:
          'An unnamed snapshot of this sandbox, deleted once it and every sandbox started from the image are gone (name the image to keep it).',
      }),
    ),
  },
  {},
);
export type ImageInfo = Static<typeof ImageInfo>;

export const ImageRefParams = Type.Object({
  ref: Type.String({ minLength: 1, maxLength: 200, description: 'An image name (name[:tag]) or id (sha256:…).' }),
});

export const ImageList = Type.Object({ images: Type.Array(ImageInfo) }, {});
export type ImageList = Static<typeof ImageList>;

export const IMAGE_NAME_PATTERN = '^[a-z0-9][a-z0-9._-]{0,62}(:[a-z0-9][a-z0-9._-]{0,62})?$';

export const BuildImageRequest = Type.Object(
  {
    builder: Type.Union([Type.Literal('busybox'), Type.Literal('debian'), Type.Literal('fn-runtime')], {
      description:
        "Which builder makes the root filesystem. fn-runtime: busybox plus this host's python3 (with its standard library), bash and node: the default image of function calls.",
    }),
    name: Type.Optional(Type.String({ pattern: IMAGE_NAME_PATTERN, description: 'Name to tag the image with; default the builder name.' })),
    packages: Type.Optional(
      Type.Array(Type.String({ pattern: '^[a-z0-9][a-z0-9+.-]{0,100}$' }), {
        maxItems: 200,
        description: 'debian: extra Debian packages (e.g. python3, git).',
      }),
    ),
  },
  { additionalProperties: false },
);
export type BuildImageRequest = Static<typeof BuildImageRequest>;

/** Largest archive POST /v1/images/import accepts (it is unpacked to disk as it streams in). */
export const MAX_IMAGE_IMPORT_BYTES = 64 * 1024 ** 3;

export const ImportImageQuery = Type.Object(
  {
    name: Type.Optional(
      Type.String({ pattern: IMAGE_NAME_PATTERN, description: 'Tag the image with this name; default: the name the archive gives it.' }),
    ),
    squash: Type.Optional(
      Type.Boolean({ default: false, description: 'Merge every layer into one EROFS layer (whiteouts applied as deletions).' }),
    ),
    ref: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 256,
        description: 'Which image, when the archive holds several: a name it is tagged with in the archive.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type ImportImageQuery = Static<typeof ImportImageQuery>;

export const ImportedLayer = Type.Object({
  diffId: Type.String({ description: 'sha256 of the uncompressed layer tar, as the image config lists it.' }),
  digest: Type.String({ description: 'The EROFS layer it became ("" for an empty layer, which is left out).' }),
  cached: Type.Boolean({ description: 'Reused from an earlier import of the same layer.' }),
  empty: Type.Boolean(),
  entries: Type.Integer(),
  bytes: Type.Integer(),
  whiteouts: Type.Integer(),
  opaqueDirs: Type.Integer(),
});
export type ImportedLayer = Static<typeof ImportedLayer>;

export const ImportImageResult = Type.Object({
  image: ImageInfo,
  format: Type.Union([Type.Literal('oci-layout'), Type.Literal('docker-save')]),
  sourceRef: Type.Optional(Type.String({ description: 'The name the archive gave the image.' })),
  squashed: Type.Boolean(),
  layers: Type.Array(ImportedLayer),
  warnings: Type.Array(Type.String(), { description: 'Entries skipped or changed while unpacking (unsafe paths, dropped xattrs…).' }),
});
export type ImportImageResult = Static<typeof ImportImageResult>;

export const GcResult = Type.Object({
  removedLayers: Type.Array(Type.String()),
  freedBytes: Type.Integer(),
  keptLayers: Type.Integer({ description: 'keptInUse + keptYoung.' }),
  keptInUse: Type.Integer({ description: 'Layers an image or a live (running, paused, creating) sandbox uses.' }),
  keptYoung: Type.Integer({
    description:
      'Unused layers younger than graceSeconds, spared because a build or snapshot may not have registered its image yet; a later gc removes them.',
  }),
  keptYoungBytes: Type.Integer(),
  graceSeconds: Type.Integer(),
  removedTemp: Type.Array(Type.String()),
  keptByRegistry: Type.Optional(
    Type.Integer({
      description:
        "Unused blobs the cluster's registry (the control plane's blob store, with `--registry`) refused to delete: its deletes are disabled (distribution: storage.delete.enabled). Absent without a registry.",
    }),
  ),
});
export type GcResult = Static<typeof GcResult>;

const REGISTRY_REF = Type.String({
  minLength: 3,
  maxLength: 512,
  description: '[https://]HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST]; loopback hosts speak plain HTTP unless https:// is written.',
});

export const PushImageRequest = Type.Object(
  {
    image: Type.String({ minLength: 1, maxLength: 200, description: 'The image to push: a name or id.' }),
    ref: REGISTRY_REF,
  },
  { additionalProperties: false },
);
export type PushImageRequest = Static<typeof PushImageRequest>;

export const PushImageResult = Type.Object({
  ref: Type.String({ description: 'HOST/REPOSITORY:TAG pushed to.' }),
  digest: Type.String({ description: "The manifest's digest: pull REPOSITORY@digest for exactly this image." }),
  layers: Type.Integer(),
  uploadedLayers: Type.Integer({ description: 'Layers the repository lacked (the others it had).' }),
  bytes: Type.Integer({ description: 'Layer bytes uploaded.' }),
});
export type PushImageResult = Static<typeof PushImageResult>;

export const PullImageRequest = Type.Object(
  {
    ref: REGISTRY_REF,
    name: Type.Optional(
      Type.String({
        pattern: IMAGE_NAME_PATTERN,
        description: "Tag the image with this name; default: the repository's last part and the tag.",
      }),
    ),
  },
  { additionalProperties: false },
);
export type PullImageRequest = Static<typeof PullImageRequest>;

export const PullImageResult = Type.Object({
  image: ImageInfo,
  digest: Type.String({ description: 'The manifest digest the image was pulled by.' }),
  fetchedLayers: Type.Integer({ description: 'Layers fetched (the others were here already).' }),
  bytes: Type.Integer({ description: 'Layer bytes fetched.' }),
  resumes: Type.Integer({ description: 'Times a layer download broke off and resumed with a Range request.' }),
});
export type PullImageResult = Static<typeof PullImageResult>;
