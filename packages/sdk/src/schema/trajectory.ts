import { Type, type Static } from 'typebox';
import { SandboxInfo } from './sandbox.js';

export const TrajectoryKind = Type.Union([
  Type.Literal('exec'),
  Type.Literal('session.open'),
  Type.Literal('session.exec'),
  Type.Literal('session.close'),
  Type.Literal('files.write'),
  Type.Literal('files.mkdir'),
  Type.Literal('files.remove'),
  Type.Literal('files.rename'),
  Type.Literal('files.upload'),
  Type.Literal('pty'),
  Type.Literal('process.start'),
  Type.Literal('process.signal'),
  Type.Literal('process.stdin'),
  Type.Literal('network.set'),
  Type.Literal('pause'),
  Type.Literal('resume'),
  // Not a step of the agent's: its edge stopped reporting and came back with the sandbox intact
  // (request: edge, reason (which says since when), backAt); nothing to redo in a replay.
  Type.Literal('edge.gap'),
  // Not a step either: the sandbox moved to another edge (request: from, to, cause; result: ms,
  // heldMs, bytes, endedProcesses — processes a restartProcesses move ended).
  Type.Literal('sandbox.migrated'),
]);
export type TrajectoryKind = Static<typeof TrajectoryKind>;

export const TrajectoryEntry = Type.Object({
  seq: Type.Integer({ description: 'Order within the sandbox, from 1.' }),
  at: Type.String({ format: 'date-time' }),
  kind: TrajectoryKind,
  request: Type.Record(Type.String(), Type.Unknown(), { description: 'What was asked (file contents omitted).' }),
  result: Type.Optional(
    Type.Record(Type.String(), Type.Unknown(), { description: 'What came back; command output capped at 64 KiB per stream.' }),
  ),
  durationMs: Type.Optional(
    Type.Number({ description: "A command's run (see ExecResult); a file step's, from its request to the edge's answer." }),
  ),
  queuedMs: Type.Optional(Type.Number({ description: "A command's wait before it started (ExecResult's)." })),
  cpuMs: Type.Optional(Type.Number({ description: "A command's CPU time (ExecResult's)." })),
  peakMemoryBytes: Type.Optional(Type.Integer({ description: "The sandbox's memory peak while a command ran (ExecResult's)." })),
  exitCode: Type.Optional(Type.Integer()),
  replayable: Type.Boolean({ description: 'False when the step cannot be re-run (e.g. an upload too large to keep).' }),
  sandboxId: Type.Optional(
    Type.String({
      description: "The sandbox the step ran in: set in a lineage (lineage=true: an ancestor's steps come before the sandbox's own).",
    }),
  ),
});
export type TrajectoryEntry = Static<typeof TrajectoryEntry>;

export const Trajectory = Type.Object({
  sandboxId: Type.String(),
  entries: Type.Array(TrajectoryEntry),
  dropped: Type.Integer({ description: 'Entries not kept because the log reached its bound.' }),
  lineageMissing: Type.Optional(
    Type.Array(Type.String(), {
      description:
        'With lineage=true: ancestors whose steps are not in `entries` (their trajectory is no longer kept, or they were forked before fork points were recorded); the lineage stops there. Empty when it is whole.',
    }),
  ),
});
export type Trajectory = Static<typeof Trajectory>;

export const TrajectoryQuery = Type.Object(
  {
    afterSeq: Type.Optional(
      Type.Integer({ minimum: 0, default: 0, description: "Only the sandbox's own entries with seq greater than this." }),
    ),
    limit: Type.Optional(
      Type.Integer({ minimum: 1, maximum: 10000, default: 1000, description: "At most this many of the sandbox's own entries." }),
    ),
    lineage: Type.Optional(
      Type.Boolean({
        default: false,
        description:
          "A fork's log continuing its parent's: the first page (afterSeq 0) starts with its ancestors' steps, oldest first, each up to where the next was forked from it (the label dsec.fork-at-seq), every entry carrying its sandboxId.",
      }),
    ),
  },
  { additionalProperties: false },
);

/** One line of GET /v1/trajectories (NDJSON): a step and the sandbox it ran in. */
export const TrajectoryLine = Type.Object({ ...TrajectoryEntry.properties, sandboxId: Type.String() });
export type TrajectoryLine = Static<typeof TrajectoryLine>;

const LabelFilter = Type.String({ pattern: '^[^=]+=.*$' });

export const TrajectoriesQuery = Type.Object(
  {
    label: Type.Optional(
      Type.Union([LabelFilter, Type.Array(LabelFilter)], {
        description: 'Sandboxes with this label, k=v; repeat for several (all must match).',
      }),
    ),
    batch: Type.Optional(Type.String({ pattern: '^batch-[a-z0-9]{6,32}$', description: "A batch's sandboxes." })),
    project: Type.Optional(
      Type.String({ description: "Only this project's sandboxes (an admin key; another key always reads its own project's only)." }),
    ),
  },
  { additionalProperties: false },
);
export type TrajectoriesQuery = Static<typeof TrajectoriesQuery>;

export const ReplayStep = Type.Object({
  seq: Type.Integer(),
  kind: TrajectoryKind,
  loggedExitCode: Type.Optional(Type.Integer()),
  replayedExitCode: Type.Optional(Type.Integer()),
  diverged: Type.Boolean({
    description: 'The step was re-run and failed, or its exit code differs from the log. Always false for a skipped step.',
  }),
  skipped: Type.Boolean({
    description:
      'The step was not re-run: it cannot be (an interactive terminal, a payload too large to keep) or need not be (a pause); see skipReason.',
  }),
  skipReason: Type.Optional(Type.String()),
  error: Type.Optional(Type.String()),
});

export const ReplayResult = Type.Object({
  sandbox: SandboxInfo,
  replayed: Type.Integer({ description: 'Steps re-run.' }),
  diverged: Type.Integer({ description: 'Re-run steps that failed or exited differently.' }),
  skipped: Type.Integer({ description: "Steps not re-run (see each step's skipReason)." }),
  steps: Type.Array(ReplayStep),
});
export type ReplayResult = Static<typeof ReplayResult>;
