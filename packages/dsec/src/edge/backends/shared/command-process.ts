import type { StreamName } from '../../protocol/exec-event.js';
import type { CappedOutput } from './capped-output.js';

export type { StreamName };

export type OutputListener = (stream: StreamName, raw: Buffer, kept: Buffer) => void;

/**
 * What the exec engine needs of a running command, whatever runs it: a SandboxProcess (crun exec
 * into a container) or a VM backend's process (the guest agent's exec).
 */
export interface CommandProcess {
  readonly stdout: CappedOutput;
  readonly stderr: CappedOutput;
  readonly done: Promise<ProcessExit>;
  readonly startedAt: Date;
  readonly exit: ProcessExit | undefined;
  onOutput(listener: OutputListener): () => void;
  writeStdin(data: Buffer): boolean;
  endStdin(): void;
  pause(): void;
  resume(): void;
  signal(sig: NodeJS.Signals, opts?: { now?: boolean }): Promise<void>;
  kill(opts?: { now?: boolean }): void;
}

export interface ProcessExit {
  exitCode: number;
  timedOut: boolean;
  /** Set when killed from outside (timeout, kill(), client gone). */
  killed: boolean;
  durationMs: number;
  /** CPU time of the command and everything it started (its command cgroup), where the host can tell. */
  cpuMs?: number;
  /** The sandbox's memory peak while the command ran (memory-peaks.ts), where the host can tell. */
  peakMemoryBytes?: number;
}

export interface StartOptions {
  /** Keep stdin open for writeStdin(); otherwise stdin is /dev/null (or `input`, then closed). */
  stdin?: boolean;
  input?: Buffer;
  maxOutputBytes: number;
  timeoutMs?: number;
  /** The exec tag (see killTagged); commands of one session share theirs, and the session removes their cgroup (killTagged at close). @default random */
  tag?: string;
  /**
   * Give the command a third output pipe as fd 3 (`crun exec --preserve-fds=1`), kept up to this
   * many bytes in `fd3`: a channel of this command's own, e.g. for a session's state.
   */
  fd3MaxBytes?: number;
  /** Every chunk that arrives on fd 3, as it arrives (a channel read as a stream, not a capped buffer). */
  onFd3?: (data: Buffer) => void;
}

export type ProcessFigures = Pick<ProcessExit, 'cpuMs' | 'peakMemoryBytes'>;

/** A command's CPU time and memory peak, where its host could tell them (for its result). */
export function processFigures(from: ProcessFigures): ProcessFigures {
  const out: ProcessFigures = {};
  if (from.cpuMs !== undefined) out.cpuMs = from.cpuMs;
  if (from.peakMemoryBytes !== undefined) out.peakMemoryBytes = from.peakMemoryBytes;
  return out;
}
