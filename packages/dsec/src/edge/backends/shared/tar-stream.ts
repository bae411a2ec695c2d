import type { CommandProcess } from './command-process.js';
import { iterateOutput } from './output-stream.js';

/** `tar -c` of one path: its parent as the directory, its name as the member (`.` for the root). */
export function tarCreateArgs(path: string): string[] {
  const clean = path.replace(/\/+$/, '') || '/';
  const slash = clean.lastIndexOf('/');
  const parent = slash <= 0 ? '/' : clean.slice(0, slash);
  const name = clean === '/' ? '.' : clean.slice(slash + 1);
  return ['-c', '-f', '-', '-C', parent, name];
}

/**
 * A running `tar -c`'s stdout as a stream, once its first bytes show that it started: a tar that
 * fails before any output (a path it cannot read) is an error the caller can still answer with a
 * status, whoever runs the tar (a container's toolbox, a VM's guest).
 */
export async function tarOutput(
  proc: CommandProcess,
  failed: (what: string, stderr: string, exitCode: number) => Error,
): Promise<AsyncIterable<Buffer>> {
  const it = iterateOutput(proc, 'raw');
  const first: Buffer[] = [];
  for (;;) {
    const n = await it.next();
    if (n.done) break;
    if (n.value.stream === 'stdout') {
      first.push(n.value.data);
      break;
    }
  }
  if (first.length === 0) {
    const exit = await proc.done;
    throw failed('tar download', proc.stderr.bytes().toString('utf8'), exit.exitCode);
  }
  return (async function* () {
    yield* first;
    for await (const { stream, data } of { [Symbol.asyncIterator]: () => it }) if (stream === 'stdout') yield data;
    const exit = await proc.done;
    // Output already started: a late failure can only end the stream early (tar's stderr is logged by the caller).
    if (exit.exitCode !== 0) throw failed('tar download', proc.stderr.bytes().toString('utf8'), exit.exitCode);
  })();
}
