export { Sandbox, type CreateOptions } from './sandbox.js';
export { Commands, ProcessHandle, type RunOptions, type StreamEvent } from './commands.js';
export { Files } from './files.js';
export { Session, Sessions, type SessionResult } from './sessions.js';
export { Connection, resolveConnection, DEFAULT_DATA_DIR, type ConnectionOptions, type CallOptions } from './connection.js';
export * from './errors.js';
export type * from './schema/index.js';
export { Terminal, type TerminalOptions } from './terminal.js';
