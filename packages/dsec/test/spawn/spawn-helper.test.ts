/**
 * The edge starts crun on its create, exec and kill path through dsec-spawn (host/spawn-helper.ts),
 * not with a fork of its own large process. A helper that crashes is replaced at the next call and
 * no running sandbox is lost.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { pollUntil } from '../engine/support/sandbox-procs.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

/** The parent pid and argv of a process. */
function procInfo(pid: number): { ppid: number; argv: string[] } {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return {
    ppid: Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]),
    argv: readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean),
  };
}

/** Pids of the processes whose parent is `parent`. */
function childrenOf(parent: number): number[] {
  return readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number)
    .filter((pid) => {
      try {
        return procInfo(pid).ppid === parent;
      } catch {
        return false; // exited meanwhile
      }
    });
}

/** Pids of dsec-spawn processes whose parent is this process (the in-process edge's helper). */
function ourSpawnHelpers(): number[] {
  const pids: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const comm = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      if (comm === 'dsec-spawn' && ppid === process.pid) pids.push(Number(name));
    } catch {
      // exited meanwhile
    }
  }
  return pids;
}

describe("crun through the edge's resident spawn helper", { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('creates and kills go through one resident dsec-spawn; after it is killed, sandboxes keep running and the next call starts a new one', async () => {
    const a = await Sandbox.create({ ...server.conn });
    const helpers = ourSpawnHelpers();
    assert.equal(helpers.length, 1, `one dsec-spawn started the sandbox: ${JSON.stringify(helpers)}`);
    const b = await Sandbox.create({ ...server.conn });
    assert.deepEqual(ourSpawnHelpers(), helpers, 'the same helper serves the next create (resident, not one per call)');

    process.kill(helpers[0]!, 'SIGKILL');
    // Once the edge has seen it die (it reaps it and fails what was in flight at once); a call
    // racing with the death itself fails with the reason, as any call in flight does.
    for (let i = 0; i < 500 && existsSync(`/proc/${helpers[0]}`); i++) await new Promise((r) => setTimeout(r, 10));
    // Running sandboxes are not the helper's: both still run commands.
    for (const sb of [a, b]) {
      const r = await sb.commands.run(['echo', 'alive']);
      assert.equal(r.stdout, 'alive\n');
    }
    // The kill path starts a new helper for crun delete; the sandbox is gone for real.
    await a.kill();
    const replaced = ourSpawnHelpers();
    assert.equal(replaced.length, 1);
    assert.notEqual(replaced[0], helpers[0]);
    await assert.rejects(a.commands.run(['true']), /was killed/);
    const listed = execFileSync('crun', ['--root', join(server.dataDir, 'node', 'crun'), 'list', '-q'], { encoding: 'utf8' });
    assert.doesNotMatch(listed, new RegExp(a.id), 'crun delete (through the new helper) removed the container');
    assert.match(listed, new RegExp(b.id));
    const c = await Sandbox.create({ ...server.conn });
    assert.equal((await c.commands.run(['sh', '-c', 'exit 7'])).exitCode, 7);
    await c.kill();
    await b.kill();
  });
  test("a command's starter (dsec-enter) is a child of dsec-spawn, not a fork of the edge; the command is in its own cgroup from the start and killed with it", async () => {
    const sb = await Sandbox.create({ ...server.conn });
    try {
      const marker = `dsec-spawn-exec-${process.pid}`;
      const proc = await sb.commands.start(['sh', '-c', `sleep 1000 & exec sleep 1001 # ${marker}`]);
      const [helper] = ourSpawnHelpers();
      assert.ok(helper, 'a resident dsec-spawn');
      // dsec-enter names the sandbox's cgroup (--cgroup /dsec/<id>); crun exec would end with the id.
      const starters = (parent: number): number[] =>
        childrenOf(parent).filter((pid) => {
          try {
            const { argv } = procInfo(pid);
            return argv[0]!.endsWith('dsec-enter')
              ? argv.includes(`/dsec/${sb.id}`)
              : argv.includes('exec') && argv[argv.length - 1] === sb.id;
          } catch {
            return false;
          }
        });
      // The start call answers with the process's handle before dsec-spawn has forked its starter
      // (start-process.ts queues the spawn), and the fork wears dsec-spawn's argv until it
      // writes its own: look until it is there, then check where it is.
      await pollUntil(() => starters(helper).length > 0);
      assert.equal(starters(helper).length, 1, "the background command's starter runs under dsec-spawn");
      assert.deepEqual(starters(process.pid), [], 'and not under the edge');
      const cg = await sb.commands.run(['sh', '-c', 'grep ^0:: /proc/self/cgroup']);
      assert.match(cg.stdout, /^0::\/cmd-[0-9a-f]+\n$/, 'a command runs in its own command cgroup');
      await proc.kill();
      const after = await sb.commands.run(['sh', '-c', `ps -o args | grep -c "[s]leep 100" || true`]);
      assert.equal(after.stdout.trim(), '0', 'kill ended the command and the sleep it left in the background (its cgroup)');
    } finally {
      await sb.kill();
    }
  });
  test('a command whose argv and environment are longer than a start takes is refused with the reason; the helper runs on', async () => {
    const sb = await Sandbox.create({ ...server.conn });
    try {
      await sb.commands.run(['true']);
      const [helper] = ourSpawnHelpers();
      // 8 MiB of environment (the schema allows 256 variables of 32 KiB): more than dsec-spawn
      // takes in one request (4 MiB), which would end the helper and every tool in flight.
      const env = Object.fromEntries(Array.from({ length: 256 }, (_, i) => [`BIG_${i}`, 'x'.repeat(32_768)]));
      const big = await sb.commands.run(['true'], { env });
      assert.notEqual(big.exitCode, 0);
      assert.match(big.stderr, /more than the \d+ a start takes/);
      assert.equal((await sb.commands.run(['sh', '-c', 'exit 3'])).exitCode, 3);
      assert.deepEqual(ourSpawnHelpers(), [helper], 'the same helper runs on');
    } finally {
      await sb.kill();
    }
  });
});
