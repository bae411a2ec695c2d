import { fstatSync } from 'node:fs';
import { DEFAULT_EXEC_TIMEOUT_MS, MAX_STDIN_BYTES } from '@dsec/sdk/schema';
import type { RunOptions, Sandbox } from '@dsec/sdk';
import { UsageError } from './args.js';

/**
 * Whether the CLI sends its stdin to the command. With `-i`, always (unless it is a terminal and
 * `-t` takes it). Without, when stdin is a shell pipe or a redirected file (`echo hi | dsec exec …`,
 * `< in.txt`), never a terminal, and never a socket: a parent that spawns dsec with a stdin pipe
 * it never closes (Node's default) would otherwise hang it.
 */
export function stdinForCommand(interactive: boolean): boolean {
  if (interactive) return true;
  try {
    const st = fstatSync(0);
    return st.isFIFO() || st.isFile();
  } catch {
    return false; // stdin closed
  }
}

/** All of stdin, up to the exec API's stdin limit (larger input belongs to a background process). */
export async function readStdin(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    const b = chunk as Buffer;
    size += b.length;
    if (size > MAX_STDIN_BYTES) {
      throw new UsageError(
        `stdin is over ${MAX_STDIN_BYTES} bytes (the exec limit); copy large input in with \`dsec cp\` or the SDK's files.write, or feed a background process`,
      );
    }
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

/** Writes a chunk and waits for the pipe to take it, so a slow reader (`| head`) is not flooded. */
export function writeOut(stream: NodeJS.WriteStream, data: Uint8Array | string): Promise<void> {
  return new Promise((resolve) => {
    if (stream.write(data)) resolve();
    else stream.once('drain', resolve);
  });
}

/**
 * Runs a command and copies its output to this process's stdout and stderr as it is produced, byte
 * for byte (the stream carries bytes; nothing is decoded as text). Returns the exit code, after
 * saying on stderr when the output was cut or the command timed out.
 */
export async function streamToTerminal(
  sb: Sandbox,
  cmd: string[],
  opts: Omit<RunOptions, 'onStdout' | 'onStderr' | 'throwOnError'>,
): Promise<number> {
  for await (const ev of sb.commands.stream(cmd, opts)) {
    if (ev.type !== 'exit') {
      await writeOut(ev.type === 'stdout' ? process.stdout : process.stderr, ev.data);
      continue;
    }
    if (ev.truncated)
      process.stderr.write(
        `dsec: output cut at ${opts.maxOutputBytes ?? 'maxOutputBytes'} bytes per stream (${ev.stdoutBytes} stdout, ${ev.stderrBytes} stderr bytes written)\n`,
      );
    if (ev.timedOut)
      process.stderr.write(
        `dsec: the command timed out after ${opts.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS} ms and was killed (set --timeout MS)\n`,
      );
    return ev.exitCode;
  }
  throw new Error('the exec stream ended without an exit status');
}

/** The stdin options of an exec request, from the CLI's stdin when it is sent. */
export async function stdinOptions(send: boolean): Promise<Pick<RunOptions, 'stdin' | 'stdinEncoding'>> {
  if (!send) return {};
  return { stdin: (await readStdin()).toString('base64'), stdinEncoding: 'base64' };
}
