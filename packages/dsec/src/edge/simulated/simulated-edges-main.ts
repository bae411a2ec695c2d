/**
 * A child process of `dsec bench cluster` that runs N SIMULATED edges (simulated-edge.ts), so the
 * control plane under test does not share its event loop with them.
 *
 *   node simulated-edges-main.js --join URL --count N --id-prefix P --run-dir DIR   (token in env DSEC_JOIN_TOKEN)
 *
 * Prints one JSON line `{"edges":[{id,url}]}` once every edge has joined. Each line `stats` read
 * on stdin is answered with `{"stats":[{id,sandboxes,created}]}`. SIGTERM, or stdin closing (its
 * parent gone), closes the edges and exits. `--run-dir` is not used for files: it names the
 * benchmark run in this process's command line, so the run's leak check and sweep find it.
 */
import { createInterface } from 'node:readline';
import { parseArgs } from 'node:util';
import { startSimulatedEdge, type RunningSimulatedEdge } from './simulated-edge.js';

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: { join: { type: 'string' }, count: { type: 'string' }, 'id-prefix': { type: 'string' }, 'run-dir': { type: 'string' } },
  });
  const token = process.env['DSEC_JOIN_TOKEN'];
  const count = Number(values.count);
  if (!values.join || !token || !values['id-prefix'] || !Number.isInteger(count) || count < 1)
    throw new Error('usage: simulated-edges-main --join URL --count N --id-prefix P --run-dir DIR (token in DSEC_JOIN_TOKEN)');
  const edges: RunningSimulatedEdge[] = [];
  let closing: Promise<void> | undefined;
  const close = (code: number): void => {
    closing ??= Promise.allSettled(edges.map((e) => e.close())).then(() => process.exit(code));
  };
  process.on('SIGTERM', () => close(0));
  process.on('SIGINT', () => close(0));
  try {
    for (let i = 1; i <= count; i++) edges.push(await startSimulatedEdge({ join: values.join, token, id: `${values['id-prefix']}${i}` }));
  } catch (err) {
    process.stderr.write(`simulated edges: ${(err as Error).message}\n`);
    close(1);
    return;
  }
  process.stdout.write(JSON.stringify({ edges: edges.map((e) => ({ id: e.id, url: e.url })) }) + '\n');
  const lines = createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    if (line.trim() === 'stats')
      process.stdout.write(
        JSON.stringify({ stats: edges.map((e) => ({ id: e.id, sandboxes: e.edge.size, created: e.edge.created })) }) + '\n',
      );
  });
  lines.on('close', () => close(0));
}

void main();
