export {
  Sandbox,
  type CreateOptions,
  type CreateManyOptions,
  type BatchFailure,
  type Snapshot,
  type TrajectoryOptions,
} from './sandbox.js';
export { batchEvents, batchInfo, type BatchProgress } from './batch.js';
export { type BulkAction, type BulkOptions, type ListFilter, type ListOptions, MAX_PAGE } from './listing.js';
export { Image } from './image.js';
export { Pool } from './pool.js';
export { fn, type FnOutcome } from './fn.js';
export { Commands, ProcessHandle, type RunOptions, type StreamEvent } from './commands.js';
export { Files } from './files.js';
export { readNdjson } from './ndjson.js';
export { Session, Sessions, type SessionResult } from './sessions.js';
export { Connection, resolveConnection, DEFAULT_DATA_DIR, type ConnectionOptions, type CallOptions } from './connection.js';
export * from './errors.js';
export type * from './schema/index.js';
export { Terminal, type TerminalOptions } from './terminal.js';
export { Ports } from './ports.js';
export { webSocketStream, parsePortFrame, type PortFrame } from './port-stream.js';
export { Volume } from './volume.js';
