import { Type, type Static } from 'typebox';
import { EnvMap } from './common.js';
import { DEFAULT_MAX_OUTPUT_BYTES, Encoding, MAX_STDIN_BYTES } from './exec.js';

/** The image fn calls run in unless they name one: it needs python3 (the zygote) and the runtime's interpreter. */
export const DEFAULT_FN_IMAGE = 'fn-runtime';
export const DEFAULT_FN_TIMEOUT_MS = 10_000;
export const MAX_FN_TIMEOUT_MS = 600_000;
export const DEFAULT_FN_MEMORY_MIB = 256;
export const DEFAULT_FN_DISK_MIB = 256;
export const MAX_FN_CODE_BYTES = 1 << 20;
/** Calls a batch may hold. */
export const MAX_FN_BATCH = 10_000;

export const FnRuntime = Type.Union([Type.Literal('python'), Type.Literal('node'), Type.Literal('bash')], {
  description: 'python: the code runs in a fork of a warm python3 (stdlib imported once); node, bash: a fresh interpreter process.',
});
export type FnRuntime = Static<typeof FnRuntime>;

export const FnRunRequest = Type.Object(
  {
    runtime: FnRuntime,
    code: Type.String({
      maxLength: MAX_FN_CODE_BYTES,
      description: 'The program: main.py, main.js or main.sh in a fresh scratch dir (its cwd and HOME).',
    }),
    stdin: Type.Optional(Type.String({ maxLength: MAX_STDIN_BYTES * 2, description: "Bytes on the program's stdin (see stdinEncoding)." })),
    stdinEncoding: Type.Optional(Encoding),
    files: Type.Optional(
      Type.Record(
        Type.String({ minLength: 1, maxLength: 1024, pattern: '^(?!/)(?!.*(^|/)\\.\\.(/|$)).+$' }),
        Type.String({ maxLength: MAX_STDIN_BYTES * 2 }),
        {
          description: 'Files written into the scratch dir before the call: relative path → content (see filesEncoding).',
        },
      ),
    ),
    filesEncoding: Type.Optional(Encoding),
    args: Type.Optional(
      Type.Array(Type.String({ maxLength: 131072 }), {
        maxItems: 4096,
        description: 'Arguments after the program (sys.argv[1:], process.argv.slice(2), $@).',
      }),
    ),
    env: Type.Optional(EnvMap),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_FN_TIMEOUT_MS,
        default: DEFAULT_FN_TIMEOUT_MS,
        description: 'Kill the call (its whole session) after this long.',
      }),
    ),
    memoryMiB: Type.Optional(
      Type.Integer({
        minimum: 32,
        maximum: 65536,
        default: DEFAULT_FN_MEMORY_MIB,
        description: 'Memory limit of the worker the call runs in.',
      }),
    ),
    diskMiB: Type.Optional(
      Type.Integer({
        minimum: 16,
        maximum: 65536,
        default: DEFAULT_FN_DISK_MIB,
        description: "Size of the worker's writable layer (scratch): writes past it fail with ENOSPC.",
      }),
    ),
    network: Type.Optional(
      Type.Boolean({ default: false, description: 'Run in a worker with open egress; by default a call has loopback only.' }),
    ),
    image: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 200,
        default: DEFAULT_FN_IMAGE,
        description: 'Image of the worker; it needs python3 (the fork server) and the runtime.',
      }),
    ),
    maxOutputBytes: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: 64 << 20,
        default: DEFAULT_MAX_OUTPUT_BYTES,
        description: 'Cap per stream on returned output; bytes past it are counted, not kept.',
      }),
    ),
    encoding: Type.Optional(Encoding),
  },
  { additionalProperties: false },
);
export type FnRunRequest = Static<typeof FnRunRequest>;

export const FnRunResult = Type.Object(
  {
    exitCode: Type.Integer({ description: 'Exit status; 128+N when killed by signal N; 137 on timeout.' }),
    stdout: Type.String(),
    stderr: Type.String(),
    encoding: Encoding,
    truncated: Type.Boolean(),
    stdoutBytes: Type.Integer(),
    stderrBytes: Type.Integer(),
    timedOut: Type.Boolean(),
    oomKilled: Type.Boolean({ description: 'The worker hit its memory limit during the call.' }),
    durationMs: Type.Number({ description: 'The call in its worker, from request to answer.' }),
    runMs: Type.Number({ description: "The program itself, as the worker's fork server measured it." }),
    coldStart: Type.Boolean({ description: 'A new worker was started for this call.' }),
    worker: Type.String({ description: 'The worker sandbox that ran the call (an edge-internal sandbox, not callable).' }),
    workerReplaced: Type.Boolean({
      description:
        'The call left the worker damaged (leftover process, OOM, failed cleanup, a dead fork server): it was killed, never reused.',
    }),
    replacedBecause: Type.Optional(Type.String()),
  },
  {},
);
export type FnRunResult = Static<typeof FnRunResult>;

export const FnBatchRequest = Type.Object(
  {
    calls: Type.Array(FnRunRequest, { minItems: 1, maxItems: MAX_FN_BATCH }),
    concurrency: Type.Optional(Type.Integer({ minimum: 1, maximum: 256, default: 32, description: 'Calls in flight at once.' })),
  },
  { additionalProperties: false },
);
export type FnBatchRequest = Static<typeof FnBatchRequest>;

export const FnBatchLine = Type.Object(
  {
    index: Type.Integer({ description: "The call's position in `calls`." }),
    result: Type.Optional(FnRunResult),
    error: Type.Optional(Type.Object({ code: Type.String(), message: Type.String() })),
  },
  { description: 'One NDJSON line per call, in the order calls finish.' },
);
export type FnBatchLine = Static<typeof FnBatchLine>;
