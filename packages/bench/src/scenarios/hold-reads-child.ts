/**
 * The client process of `dsec bench cluster --hold`'s reads (hold-reads.ts), spoken to in JSON
 * lines by LineChild (rollout-child.ts): one HoldReadsInput on stdin, one HoldReadsOutput (or
 * `{error}`) on stdout, then `{op: 'close'}` ends it.
 */
import { createInterface } from 'node:readline';
import { measureHoldReads, type HoldReadsInput } from './hold-reads.js';

for await (const line of createInterface({ input: process.stdin })) {
  const req = JSON.parse(line) as HoldReadsInput | { op: 'close' };
  if ('op' in req) break;
  try {
    process.stdout.write(JSON.stringify(await measureHoldReads(req)) + '\n');
  } catch (err) {
    process.stdout.write(JSON.stringify({ error: (err as Error).message }) + '\n');
  }
}
