import { Type, type Static } from 'typebox';

export const MAX_FILE_BYTES = 64 << 20;

export const FilePathQuery = Type.Object(
  {
    path: Type.String({ minLength: 1, maxLength: 4096, description: 'Path inside the sandbox; resolved inside its root, never on the host.' }),
    mode: Type.Optional(Type.String({ pattern: '^0?[0-7]{3,4}$', description: 'Octal file mode on write, e.g. 0644.' })),
  },
  { additionalProperties: false },
);
export type FilePathQuery = Static<typeof FilePathQuery>;

export const WriteFileResult = Type.Object({ path: Type.String(), bytes: Type.Integer() }, {});
export type WriteFileResult = Static<typeof WriteFileResult>;
