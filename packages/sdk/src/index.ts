export { Sandbox, Commands, Files, type CreateOptions, type RunOptions } from './sandbox.js';
export { Connection, resolveConnection, DEFAULT_DATA_DIR, type ConnectionOptions, type CallOptions } from './connection.js';
export * from './errors.js';
export type * from './schema/index.js';
