/**
 * Red team, issue 10 item 9: a process outlives its command's timeout by dropping the tag the
 * edge used to find a command's processes (`env -u DSEC_EXEC_ID`) after a double fork, which
 * also takes it out of the command's process tree. Every command now runs in a cgroup of its own
 * (a cgroup2 directory with no controllers under the sandbox's; host/command-cgroups.ts) that
 * its processes are born in and cannot leave, and a timeout ends that cgroup with cgroup.kill.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { CGROUP_PARENT, cgroupPids } from '../../src/host/cgroups.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { attack, must, show } from './support/harness.js';

/** Two escapes (tag dropped after a double fork, and in a new session), then a long wait the timeout cuts. */
const ESCAPE = `
(env -u DSEC_EXEC_ID sleep 601 &)
(env -u DSEC_EXEC_ID setsid sleep 602 &)
touch /tmp/escaped-started
sleep 600`;

/** Host-side view: the sandbox's processes whose command line is `sleep 601` or `sleep 602`. */
function escapers(sandboxId: string): string[] {
  const found: string[] = [];
  for (const pid of cgroupPids(`${CGROUP_PARENT}/${sandboxId}`)) {
    try {
      const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
      const state = /^State:\s+(\S)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
      if (/^sleep 60[12]$/.test(argv) && state !== 'Z') found.push(`${pid} ${argv}`);
    } catch {
      // exited meanwhile
    }
  }
  return found;
}

async function settle(sandboxId: string): Promise<string[]> {
  let left = escapers(sandboxId);
  for (let i = 0; i < 50 && left.length; i++) {
    await new Promise((r) => setTimeout(r, 100));
    left = escapers(sandboxId);
  }
  return left;
}

describe('red team: a process that drops its tag outlives its command timeout', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 128 } });
  });
  after(async () => {
    await server?.close();
  });

  test('exec: every process the timed-out command started is gone, tag or no tag', async () => {
    await must(server, sb, 'rm -f /tmp/escaped-started');
    const r = await attack(server, sb, ['/bin/sh', '-c', ESCAPE], { timeoutMs: 5_000 });
    assert.equal(r.timedOut, true, show(r));
    assert.equal(
      (await attack(server, sb, 'test -e /tmp/escaped-started && echo yes')).stdout,
      'yes\n',
      'the escapes ran before the timeout',
    );
    assert.deepEqual(await settle(sb.id), [], 'no escaped process survives the timeout');
  });

  test('session: a timed-out session command takes its escaped processes with it', async () => {
    await must(server, sb, 'rm -f /tmp/escaped-started');
    const s = await sb.sessions.create();
    const r = await s.run(ESCAPE, { timeoutMs: 5_000 });
    assert.equal(r.timedOut, true, JSON.stringify(r));
    assert.equal(
      (await attack(server, sb, 'test -e /tmp/escaped-started && echo yes')).stdout,
      'yes\n',
      'the escapes ran before the timeout',
    );
    assert.deepEqual(await settle(sb.id), [], 'no escaped process survives the timeout');
    await s.close();
  });

  test("a command's processes stay in the sandbox's own cgroups (its memory limit holds) while in their command cgroup", async () => {
    const r = await attack(server, sb, ['/bin/sh', '-c', 'cat /proc/self/cgroup']);
    assert.equal(r.exitCode, 0, show(r));
    const lines = r.stdout.trim().split('\n');
    const memory = lines.find((l) => /^\d+:memory:/.test(l));
    const unified = lines.find((l) => l.startsWith('0::'));
    // Inside the sandbox's cgroup namespace its own cgroup is the root: the memory line must not
    // point anywhere else (as `crun exec --cgroup` does on this layout), and the v2 line names
    // the command's cgroup below it.
    if (memory) assert.match(memory, /^\d+:memory:\/$/, r.stdout);
    assert.ok(unified, r.stdout);
    assert.match(unified, /^0::\/cmd-[0-9a-f]+$/, r.stdout);
  });
});
