import type { CommandProcess, StreamName } from './command-process.js';

/**
 * A process's output as an async iterable, at the consumer's pace: past a few queued chunks the
 * pipes are paused (the process blocks writing), so a slow reader never makes the edge buffer
 * more than that. `kept` yields only bytes within the output cap; `raw` yields everything (for
 * tar streams, which are not capped). Leaving the loop early kills the process.
 */
export async function* iterateOutput(proc: CommandProcess, mode: 'kept' | 'raw'): AsyncGenerator<{ stream: StreamName; data: Buffer }> {
  const queue: { stream: StreamName; data: Buffer }[] = [];
  let wake: (() => void) | undefined;
  const off = proc.onOutput((stream, raw, kept) => {
    const data = mode === 'raw' ? raw : kept;
    if (data.length === 0) return;
    queue.push({ stream, data });
    if (queue.length > 16) proc.pause();
    wake?.();
  });
  let exited = false;
  void proc.done.then(() => {
    exited = true;
    wake?.();
  });
  try {
    for (;;) {
      const item = queue.shift();
      if (item) {
        if (queue.length <= 4) proc.resume();
        yield item;
        continue;
      }
      if (exited) return;
      await new Promise<void>((r) => (wake = r));
      wake = undefined;
    }
  } finally {
    off();
    if (!proc.exit) proc.kill();
  }
}
