import { Type, type Static } from 'typebox';
import { EnvMap, WritablePaths } from './common.js';
import { Encoding, MAX_EXEC_TIMEOUT_MS, MAX_OUTPUT_BYTES_LIMIT } from './exec.js';

export const OpenSessionRequest = Type.Object(
  {
    shell: Type.Optional(
      Type.Union([Type.Literal('auto'), Type.Literal('bash'), Type.Literal('sh')], {
        default: 'auto',
        description: 'auto: bash if the image has it, else sh.',
      }),
    ),
    cwd: Type.Optional(Type.String({ pattern: '^/', maxLength: 4096, description: 'Starting directory; default the image cwd.' })),
    env: Type.Optional(EnvMap),
    writablePaths: Type.Optional(WritablePaths),
  },
  { additionalProperties: false },
);
export type OpenSessionRequest = Static<typeof OpenSessionRequest>;

export const SessionInfo = Type.Object({
  id: Type.String(),
  shell: Type.String({ description: 'The shell binary the session runs.' }),
  alive: Type.Boolean(),
  busy: Type.Boolean({ description: 'A command is running; further commands queue behind it.' }),
  commands: Type.Integer({ description: 'Commands run so far.' }),
  createdAt: Type.String({ format: 'date-time' }),
  endReason: Type.Optional(
    Type.String({
      description: 'Why the session is no longer alive when dsec ended it, e.g. its edge restarted (a session lives in the edge process).',
    }),
  ),
});
export type SessionInfo = Static<typeof SessionInfo>;

export const SessionList = Type.Object({ sessions: Type.Array(SessionInfo) });

export const SessionParams = Type.Object({
  id: Type.String({ pattern: '^sb-[a-z0-9]{1,32}-[a-z0-9]{6,32}$' }),
  sid: Type.String({ pattern: '^ss-[a-z0-9]{1,32}$', description: 'Session id.' }),
});

export const SessionExecRequest = Type.Object(
  {
    cmd: Type.String({
      minLength: 1,
      maxLength: 131072,
      description: 'A shell command line, run by the session shell; cd/export/variables persist.',
    }),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: MAX_EXEC_TIMEOUT_MS,
        default: 60_000,
        description: 'Interrupt the command (not the session) after this long.',
      }),
    ),
    maxOutputBytes: Type.Optional(Type.Integer({ minimum: 0, maximum: MAX_OUTPUT_BYTES_LIMIT, default: 1 << 20 })),
    encoding: Type.Optional(Encoding),
  },
  { additionalProperties: false },
);
export type SessionExecRequest = Static<typeof SessionExecRequest>;
