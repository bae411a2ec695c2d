import { Type, type Static } from 'typebox';
import { EnvMap, WritablePaths } from './common.js';
import { Encoding, MAX_EXEC_TIMEOUT_MS, MAX_OUTPUT_BYTES_LIMIT } from './exec.js';

export const StartProcessRequest = Type.Object(
  {
    cmd: Type.Union(
      [Type.String({ minLength: 1, maxLength: 131072 }), Type.Array(Type.String({ maxLength: 131072 }), { minItems: 1, maxItems: 4096 })],
      {
        description: 'A shell string (run with /bin/sh -c) or an argv.',
      },
    ),
    cwd: Type.Optional(Type.String({ pattern: '^/', maxLength: 4096 })),
    env: Type.Optional(EnvMap),
    writablePaths: Type.Optional(WritablePaths),
    stdin: Type.Optional(Type.Boolean({ default: false, description: 'Keep stdin open for POST …/stdin; otherwise stdin is /dev/null.' })),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_EXEC_TIMEOUT_MS,
        description: 'Kill after this long; default: runs until it exits or the sandbox dies.',
      }),
    ),
    maxOutputBytes: Type.Optional(
      Type.Integer({
        minimum: 0,
        maximum: MAX_OUTPUT_BYTES_LIMIT,
        default: 1 << 20,
        description: 'Kept output per stream; the rest is counted.',
      }),
    ),
  },
  { additionalProperties: false },
);
export type StartProcessRequest = Static<typeof StartProcessRequest>;

export const ProcessInfo = Type.Object({
  id: Type.String({ description: 'Handle of the process (not its pid).' }),
  cmd: Type.Union([Type.String(), Type.Array(Type.String())]),
  status: Type.Union([Type.Literal('running'), Type.Literal('exited')]),
  exitCode: Type.Optional(Type.Integer()),
  timedOut: Type.Boolean(),
  startedAt: Type.String({ format: 'date-time' }),
  durationMs: Type.Optional(Type.Number()),
  stdoutBytes: Type.Integer(),
  stderrBytes: Type.Integer(),
  truncated: Type.Boolean(),
  endReason: Type.Optional(
    Type.String({
      description:
        'Set when the process was ended by dsec rather than by itself, e.g. its edge restarted (a background process does not outlive the edge process that holds its pipes).',
    }),
  ),
});
export type ProcessInfo = Static<typeof ProcessInfo>;

export const ProcessList = Type.Object({ processes: Type.Array(ProcessInfo) });

export const ProcessOutput = Type.Object({
  process: ProcessInfo,
  stdout: Type.String({ description: 'Kept stdout from stdoutOffset on, in encoding.' }),
  stderr: Type.String(),
  encoding: Encoding,
});
export type ProcessOutput = Static<typeof ProcessOutput>;

export const ProcessParams = Type.Object({
  id: Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$' }),
  pid: Type.String({ pattern: '^p-[a-z0-9]{1,32}$', description: 'Process handle.' }),
});

export const ProcessOutputQuery = Type.Object(
  {
    stdoutOffset: Type.Optional(
      Type.Integer({ minimum: 0, default: 0, description: 'Skip this many kept stdout bytes (poll incrementally).' }),
    ),
    stderrOffset: Type.Optional(Type.Integer({ minimum: 0, default: 0 })),
    encoding: Type.Optional(Encoding),
  },
  { additionalProperties: false },
);

export const WaitProcessRequest = Type.Object(
  {
    timeoutMs: Type.Optional(
      Type.Integer({ minimum: 0, maximum: 3_600_000, default: 30_000, description: 'Return after this long even if still running.' }),
    ),
  },
  { additionalProperties: false },
);

export const SIGNALS = ['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT'] as const;
export const SignalRequest = Type.Object(
  {
    signal: Type.Union(
      [
        Type.Literal('SIGTERM'),
        Type.Literal('SIGKILL'),
        Type.Literal('SIGINT'),
        Type.Literal('SIGHUP'),
        Type.Literal('SIGQUIT'),
        Type.Literal('SIGUSR1'),
        Type.Literal('SIGUSR2'),
        Type.Literal('SIGSTOP'),
        Type.Literal('SIGCONT'),
      ],
      { default: 'SIGTERM', description: 'SIGKILL ends the whole process tree.' },
    ),
  },
  { additionalProperties: false },
);
export type SignalRequest = Static<typeof SignalRequest>;
