/**
 * Commands whose output reaches the server while its event loop stalls (a loaded host, or a burst of
 * synchronous work) keep that output. A stall of 600 ms now and then, from setImmediate (after a
 * turn's I/O, as the server's own synchronous work falls), while 8 commands run at a time:
 * before the fix about 1 command in 9 answered exit 0 with its stdout empty (9 of 80, with the same
 * stalls): the quiet spell the exec engine waits after crun exits (sandbox-process.ts) was a timer,
 * and timers run before a turn's I/O poll, so it expired while the output and the pipes' end waited
 * unread. The same loss showed as the "first command after a resume across an edge restart"
 * returning an empty stdout (docs/RELIABILITY.md).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const COMMANDS = 48;
const CONCURRENCY = 8;
const STALL_MS = 600;

describe('exec output under event-loop stalls', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test(`${COMMANDS} commands, ${CONCURRENCY} at a time, while the loop stalls ${STALL_MS} ms now and then: every output arrives`, async () => {
    const sandboxes = await Promise.all([0, 1, 2, 3].map(() => Sandbox.create({ ...server.conn, image: 'busybox' })));
    let stalling = true;
    let stalls = 0;
    const stall = (): void => {
      if (!stalling) return;
      setImmediate(() => {
        const until = Date.now() + STALL_MS;
        while (Date.now() < until); // the stall: nothing else runs
        stalls++;
        setTimeout(stall, Math.random() * 30);
      });
    };
    stall();
    const lost: string[] = [];
    let next = 0;
    try {
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let k = next++; k < COMMANDS; k = next++) {
            const r = await sandboxes[k % sandboxes.length]!.commands.run(['sh', '-c', `echo done ${k}`]);
            if (r.stdout !== `done ${k}\n` || r.exitCode !== 0) lost.push(`#${k}: ${JSON.stringify(r)}`);
          }
        }),
      );
    } finally {
      stalling = false;
    }
    console.log(`exec under stalls: ${COMMANDS} commands, ${stalls} stalls of ${STALL_MS} ms, ${lost.length} lost`);
    assert.ok(stalls >= 5, `the loop stalled only ${stalls} times`);
    assert.deepEqual(lost, [], 'commands whose output was lost');
    for (const sb of sandboxes) await sb.kill();
  });
});
