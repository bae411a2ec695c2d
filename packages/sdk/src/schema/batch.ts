import { Type, type Static } from 'typebox';
import { CreateSandboxRequest } from './sandbox.js';

/** DSec's largest job asks for 32,000 sandboxes at once. */
export const MAX_BATCH = 32_000;

/**
 * A batch's default creates in flight per edge: what one edge gets of a batch whatever the
 * cluster's size (a fixed 64 across the cluster was 0.64 per edge on 100 edges).
 */
export const BATCH_CONCURRENCY_PER_EDGE = 64;

export const CreateBatchRequest = Type.Object(
  {
    count: Type.Integer({ minimum: 1, maximum: MAX_BATCH, description: `How many sandboxes of the spec (at most ${MAX_BATCH}).` }),
    spec: CreateSandboxRequest,
    concurrency: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 1024,
        description: `Creates in flight at once across the cluster. Default: ${BATCH_CONCURRENCY_PER_EDGE} per ready edge of the spec's pool when the batch starts, at most 1024. For a project with a create rate, at most that rate or ${BATCH_CONCURRENCY_PER_EDGE}, whichever is more, whatever the request asks.`,
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateBatchRequest = Static<typeof CreateBatchRequest>;

export const BatchState = Type.Union([Type.Literal('running'), Type.Literal('done'), Type.Literal('cancelled')], {
  description:
    'running: sandboxes are being created; done: every item is running or failed; cancelled: stopped by DELETE, what it made was killed.',
});

export const BatchInfo = Type.Object({
  id: Type.String(),
  count: Type.Integer(),
  state: BatchState,
  placed: Type.Integer({ description: 'Items placed on an edge so far.' }),
  running: Type.Integer({ description: 'Items whose sandbox runs.' }),
  failed: Type.Integer({ description: 'Items that failed, each with a reason in the events.' }),
  createdAt: Type.String({ format: 'date-time' }),
  finishedAt: Type.Optional(Type.String({ format: 'date-time' })),
  lastSeq: Type.Integer({ description: 'Sequence number of the last event; GET …/events?after=N resumes after N.' }),
  concurrency: Type.Optional(
    Type.Integer({
      description:
        "Creates in flight the batch runs with: the request's or the default, bounded by the project's create rate (see CreateBatchRequest.concurrency).",
    }),
  ),
});
export type BatchInfo = Static<typeof BatchInfo>;

export const BatchEvent = Type.Object(
  {
    seq: Type.Integer({ description: 'Increases by one per event of the batch.' }),
    type: Type.Union([
      Type.Literal('accepted'),
      Type.Literal('placed'),
      Type.Literal('running'),
      Type.Literal('failed'),
      Type.Literal('done'),
      Type.Literal('cancelled'),
    ]),
    at: Type.String({ format: 'date-time' }),
    index: Type.Optional(Type.Integer({ description: 'The item (0..count-1).' })),
    sandboxId: Type.Optional(Type.String()),
    edge: Type.Optional(Type.String()),
    code: Type.Optional(Type.String({ description: 'Error code of a failed item.' })),
    reason: Type.Optional(Type.String({ description: 'Why an item failed.' })),
    count: Type.Optional(Type.Integer()),
  },
  { description: 'One line of a batch progress stream (NDJSON).' },
);
export type BatchEvent = Static<typeof BatchEvent>;

export const BatchIdParams = Type.Object({ id: Type.String({ pattern: '^batch-[a-z0-9]{6,32}$' }) });
export const BatchEventsQuery = Type.Object(
  {
    after: Type.Optional(
      Type.Integer({ minimum: -1, default: -1, description: 'Only events with seq > after (resume where a dropped stream left off).' }),
    ),
    follow: Type.Optional(Type.Boolean({ default: true, description: 'Keep the stream open until the batch ends.' })),
  },
  { additionalProperties: false },
);

export const ListBatchesQuery = Type.Object(
  {
    limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 500, default: 50, description: 'The newest this many batches.' })),
  },
  { additionalProperties: false },
);

export const BatchList = Type.Object({ batches: Type.Array(BatchInfo, { description: 'Newest first.' }) }, {});
export type BatchList = Static<typeof BatchList>;
