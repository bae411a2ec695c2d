import { Type, type Static } from 'typebox';

/** The wire form of every error: `{ error: { code, message, details } }`. */
export const ErrorBody = Type.Object(
  {
    error: Type.Object({
      code: Type.String({ description: 'Stable machine-readable code, e.g. SANDBOX_NOT_FOUND.' }),
      message: Type.String({ description: 'What went wrong and what to change.' }),
      details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    }),
  },
  {},
);
export type ErrorBody = Static<typeof ErrorBody>;

/** Labels: short keys and values a caller filters sandboxes by. */
export const Labels = Type.Record(Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$' }), Type.String({ maxLength: 256 }), {
  description:
    "Key/value labels; list filters on them with ?label=k=v. dsec.batch and dsec.pool-ready are dsec's own: a spec that sets them is refused (400).",
  maxProperties: 64,
  additionalProperties: false,
});

export const EnvMap = Type.Record(Type.String({ pattern: '^[A-Za-z_][A-Za-z0-9_]*$', maxLength: 256 }), Type.String({ maxLength: 32768 }), {
  description: 'Environment variables, merged over the image environment.',
  maxProperties: 256,
  additionalProperties: false,
});

/**
 * Landlock write confinement for one command (or session, or background process) and everything
 * it starts: files may be changed only beneath these paths (and /dev); the rest of the sandbox is
 * read-only to it. Each path must exist in the sandbox.
 */
export const WritablePaths = Type.Array(
  Type.String({ minLength: 1, maxLength: 4096, pattern: '^/[^\\u0000]*$', description: 'An absolute path in the sandbox.' }),
  {
    minItems: 1,
    maxItems: 64,
    description:
      'Confine the command with Landlock: it and its descendants may create, change, rename or remove files only beneath these paths (and /dev). Reading and executing stay allowed everywhere. Each path must exist.',
  },
);

/**
 * Response header on every error answer dsec itself makes (its value: the error code). Answers a
 * server in a sandbox gives through the port proxy never carry it, so a client tells dsec's
 * "nothing listens on that port" from the server's own 502.
 */
export const DSEC_ERROR_HEADER = 'x-dsec-error';
