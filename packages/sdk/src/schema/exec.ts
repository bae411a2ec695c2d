import { Type, type Static } from 'typebox';
import { EnvMap, WritablePaths } from './common.js';

export const DEFAULT_EXEC_TIMEOUT_MS = 60_000;
export const MAX_EXEC_TIMEOUT_MS = 24 * 3600_000;
export const DEFAULT_MAX_OUTPUT_BYTES = 1 << 20;
export const MAX_OUTPUT_BYTES_LIMIT = 64 << 20;
export const MAX_STDIN_BYTES = 8 << 20;

/** How bytes travel in JSON: utf8 text, or base64 for binary-safe transfer. */
export const Encoding = Type.Union([Type.Literal('utf8'), Type.Literal('base64')], {
  default: 'utf8',
  description: 'utf8 text or base64 bytes.',
});
export type Encoding = Static<typeof Encoding>;

export const ExecRequest = Type.Object(
  {
    cmd: Type.Union(
      [
        Type.String({ minLength: 1, maxLength: 131072, description: 'A shell command line, run with /bin/sh -c.' }),
        Type.Array(Type.String({ maxLength: 131072 }), { minItems: 1, maxItems: 4096, description: 'An argv, run as is.' }),
      ],
      { description: 'The command: a shell string or an argv array.' },
    ),
    cwd: Type.Optional(
      Type.String({ minLength: 1, maxLength: 4096, pattern: '^/', description: 'Absolute working directory; default the image cwd.' }),
    ),
    env: Type.Optional(EnvMap),
    writablePaths: Type.Optional(WritablePaths),
    stdin: Type.Optional(
      Type.String({ maxLength: MAX_STDIN_BYTES * 2, description: 'Bytes written to the command stdin, then closed (see stdinEncoding).' }),
    ),
    stdinEncoding: Type.Optional(Encoding),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_EXEC_TIMEOUT_MS,
        default: DEFAULT_EXEC_TIMEOUT_MS,
        description: 'Kill the command (its whole process tree) after this long.',
      }),
    ),
    maxOutputBytes: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_OUTPUT_BYTES_LIMIT,
        default: DEFAULT_MAX_OUTPUT_BYTES,
        description: 'Cap per stream on returned output; bytes past it are counted, not kept.',
      }),
    ),
    encoding: Type.Optional(Encoding),
    uncapped: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          'Streamed exec only (Accept: application/x-ndjson): send every byte the command writes, not only the first maxOutputBytes per stream. A buffered (JSON) result is always capped, so true is refused there.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type ExecRequest = Static<typeof ExecRequest>;

export const ExecResult = Type.Object(
  {
    exitCode: Type.Integer({ description: 'Exit status; 128+N when killed by signal N.' }),
    stdout: Type.String({ description: 'Kept stdout, in `encoding`.' }),
    stderr: Type.String({ description: 'Kept stderr, in `encoding`.' }),
    encoding: Encoding,
    truncated: Type.Boolean({ description: 'True when either stream exceeded maxOutputBytes.' }),
    stdoutBytes: Type.Integer({ description: 'Total bytes the command wrote to stdout, kept or not.' }),
    stderrBytes: Type.Integer({ description: 'Total bytes the command wrote to stderr, kept or not.' }),
    timedOut: Type.Boolean(),
    oomKilled: Type.Boolean({ description: 'The sandbox hit its memory limit and the kernel killed a process while the command ran.' }),
    durationMs: Type.Number({ description: "From the command's start to its exit (its output drained)." }),
    queuedMs: Type.Optional(
      Type.Number({
        description:
          "Before the command started: from dsec taking the request (the control plane's lookup) to its edge starting the command's first process, the hop between them not counted.",
      }),
    ),
    cpuMs: Type.Optional(
      Type.Number({ description: 'CPU time, user and system, of the command and everything it started while it ran (its own cgroup).' }),
    ),
    peakMemoryBytes: Type.Optional(
      Type.Integer({
        description:
          "The sandbox's memory peak while the command ran: the command's use plus what the sandbox already held (what decides an OOM kill).",
      }),
    ),
  },
  {},
);
export type ExecResult = Static<typeof ExecResult>;

export const PtyQuery = Type.Object(
  {
    cmd: Type.Optional(
      Type.Array(Type.String({ maxLength: 4096 }), {
        maxItems: 256,
        description: 'argv (repeat ?cmd=); default bash if present, else sh.',
      }),
    ),
    cols: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 80 })),
    rows: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 24 })),
    cwd: Type.Optional(Type.String({ pattern: '^/', maxLength: 4096 })),
  },
  { additionalProperties: false },
);
export type PtyQuery = Static<typeof PtyQuery>;
