import { setTimeout as sleep } from 'node:timers/promises';
import type { Command } from 'commander';
import { Connection } from '@dsec/sdk';
import type { NodeInfo } from '@dsec/sdk/schema';
import { positiveArg } from '../args.js';
import { parsePromText } from '../top/prom-text.js';
import { renderTopFrame, type TopSample } from '../top/top-frame.js';

async function sample(conn: Connection): Promise<TopSample> {
  const [metrics, nodes] = await Promise.all([
    conn.request('GET', '/metrics').then(async (r) => parsePromText(await r.text())),
    conn.json<{ nodes: NodeInfo[] }>('GET', '/v1/nodes'),
  ]);
  return { at: performance.now(), metrics, nodes: nodes.nodes };
}

/** `dsec top`: the node or cluster live in the terminal, from /metrics and /v1/nodes. */
export function registerTopCommand(program: Command): void {
  program
    .command('top')
    .description(
      "a live view of the node or cluster: sandboxes by state, create and exec rates, each edge's sandboxes, CPU and memory (Ctrl-C quits)",
    )
    .option('--once', 'print one frame and exit (rates over one interval, and over the last minute)')
    .option('--interval <seconds>', 'time between frames (default 2)', positiveArg, 2)
    .action(async (f: { once?: boolean; interval: number }) => {
      const conn = new Connection();
      const ms = f.interval * 1000;
      let prev = await sample(conn);
      if (f.once) {
        await sleep(ms);
        process.stdout.write(renderTopFrame(prev, await sample(conn), { url: conn.url }));
        return;
      }
      const tty = process.stdout.isTTY === true;
      const stop = new AbortController();
      const quit = (): void => stop.abort();
      process.once('SIGINT', quit);
      process.once('SIGTERM', quit);
      if (tty) process.stdout.write('\x1b[?25l'); // no cursor blinking over the table
      try {
        process.stdout.write(`${tty ? '\x1b[H\x1b[2J' : ''}${renderTopFrame(undefined, prev, { url: conn.url })}`);
        while (!stop.signal.aborted) {
          await sleep(ms, undefined, { signal: stop.signal }).catch(() => undefined);
          if (stop.signal.aborted) break;
          const cur = await sample(conn);
          // On a terminal the frame replaces the last one; in a pipe frames follow each other.
          process.stdout.write(`${tty ? '\x1b[H\x1b[2J' : '\n'}${renderTopFrame(prev, cur, { url: conn.url })}`);
          prev = cur;
        }
      } finally {
        if (tty) process.stdout.write('\x1b[?25h');
        process.off('SIGINT', quit);
        process.off('SIGTERM', quit);
      }
    });
}
