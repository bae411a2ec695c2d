import { Type, type Static } from 'typebox';

export const MAX_FILE_BYTES = 64 << 20;

export const FilePathQuery = Type.Object(
  {
    path: Type.String({
      minLength: 1,
      maxLength: 4096,
      description: 'Path inside the sandbox; resolved inside its root, never on the host.',
    }),
    mode: Type.Optional(Type.String({ pattern: '^0?[0-7]{3,4}$', description: 'Octal file mode on write, e.g. 0644.' })),
  },
  { additionalProperties: false },
);
export type FilePathQuery = Static<typeof FilePathQuery>;

export const WriteFileResult = Type.Object({ path: Type.String(), bytes: Type.Integer() }, {});
export type WriteFileResult = Static<typeof WriteFileResult>;

export const FileStat = Type.Object({
  path: Type.String(),
  name: Type.String(),
  type: Type.Union([Type.Literal('file'), Type.Literal('dir'), Type.Literal('symlink'), Type.Literal('other')]),
  size: Type.Integer(),
  mode: Type.String({ description: 'Octal permission bits, e.g. 0644.' }),
  uid: Type.Integer(),
  gid: Type.Integer(),
  mtime: Type.String({ format: 'date-time' }),
  linkTarget: Type.Optional(Type.String({ description: 'For symlinks: where it points (not followed).' })),
  metadata: Type.Optional(
    Type.Record(Type.String(), Type.String(), {
      description:
        "The entry's user extended attributes under the prefix the call asked for, the prefix stripped (values as UTF-8); absent when it has none or none was asked for.",
    }),
  ),
});
export type FileStat = Static<typeof FileStat>;

export const DirListing = Type.Object({ path: Type.String(), entries: Type.Array(FileStat), truncated: Type.Boolean() });
export type DirListing = Static<typeof DirListing>;

export const PathQuery = Type.Object(
  { path: Type.String({ minLength: 1, maxLength: 4096, description: 'Path inside the sandbox.' }) },
  { additionalProperties: false },
);

export const RemoveQuery = Type.Object(
  {
    path: Type.String({ minLength: 1, maxLength: 4096 }),
    recursive: Type.Optional(Type.Boolean({ default: false, description: 'Remove a directory and everything in it.' })),
  },
  { additionalProperties: false },
);

export const MkdirRequest = Type.Object(
  {
    path: Type.String({ minLength: 1, maxLength: 4096 }),
    parents: Type.Optional(Type.Boolean({ default: true, description: 'Create missing parents (mkdir -p).' })),
  },
  { additionalProperties: false },
);
export type MkdirRequest = Static<typeof MkdirRequest>;

export const RenameRequest = Type.Object(
  { from: Type.String({ minLength: 1, maxLength: 4096 }), to: Type.String({ minLength: 1, maxLength: 4096 }) },
  { additionalProperties: false },
);
export type RenameRequest = Static<typeof RenameRequest>;

export const MAX_TAR_UPLOAD_BYTES = 1 << 30;
