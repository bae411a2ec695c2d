/**
 * Red team, kernel-wide pseudo-terminals (issue 10, Medium 5, first half): one sandbox opened
 * 3,071 /dev/ptmx and every other sandbox's PTY then failed (No space left on device), because
 * every devpts instance draws on one host-wide count. Here a sandbox opens /dev/ptmx 300 times:
 * it gets at most its own devpts instance's `max=` (PTYS_PER_SANDBOX), and a bystander sandbox
 * and the host still open terminals.
 */
import assert from 'node:assert/strict';
import { closeSync, openSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { PTYS_PER_SANDBOX } from '../../src/edge/backends/container/oci-config.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { attack, must, show } from './support/harness.js';

describe('red team: one sandbox takes every pseudo-terminal', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let hog: Sandbox;
  let bystander: Sandbox;

  before(async () => {
    server = await startTestServer();
    hog = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 256, pids: 1024 } });
    bystander = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
  });
  after(async () => {
    await server?.close();
  });

  test(`300 opens of /dev/ptmx get at most ${PTYS_PER_SANDBOX}; the bystander and the host still get terminals`, async () => {
    const r = await attack(
      server,
      hog,
      'i=0; while [ $i -lt 300 ]; do sleep 3600 </dev/ptmx 2>/dev/null & i=$((i+1)); done; sleep 1; ls /dev/pts | grep -c "^[0-9]"',
      {
        timeoutMs: 60_000,
      },
    );
    const held = Number(r.stdout.trim());
    assert.ok(held > 0, `control: the sandbox opened no terminal at all: ${show(r)}`);
    assert.ok(held <= PTYS_PER_SANDBOX, `one sandbox holds ${held} terminals (cap ${PTYS_PER_SANDBOX})`);
    const b = await must(server, bystander, 'sleep 1 </dev/ptmx && echo opened');
    assert.equal(b.stdout, 'opened\n');
    const fd = openSync('/dev/ptmx', 'r+');
    closeSync(fd);
    await hog.kill();
  });
});
