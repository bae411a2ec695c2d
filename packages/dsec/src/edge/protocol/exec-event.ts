import type { ExecResult } from '@dsec/sdk/schema';

/** The two output streams of a command. */
export type StreamName = 'stdout' | 'stderr';

/** One event of an exec stream: output as it is produced, then the exit (edge protocol and public API alike). */
export type ExecEvent = { type: StreamName; data: Buffer } | { type: 'exit'; result: Omit<ExecResult, 'stdout' | 'stderr'> };
