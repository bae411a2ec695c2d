/**
 * The process the edge makes ahead for a sandbox's next exec (exec-standby.ts) is the edge's, not
 * the sandbox's work: a move's look at the sandbox's processes (container-quiesce.ts) leaves it
 * out by its pid. dsec-spawn reports that pid a moment after the standby is already in the
 * sandbox's pid namespace, so the edge must say "one is on its way" (execStandbyStarting) for as
 * long as it does not know it. A CI run once counted, and with `restartProcesses` ended, a
 * standby caught in that window as the sandbox's own process (migrate.test: 2 ended, not 1).
 *
 * Here every moment of many standbys' starts is looked at from the event loop, where the edge
 * looks from: any process of the sandbox but its init must be the standby the edge knows, or the
 * edge must say one is starting.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { describe, test } from 'node:test';
import { type Sandbox } from '@dsec/sdk';
import { cgroupTreePids, sandboxCgroupDirs } from '../../src/host/cgroups.js';
import {
  dropExecStandby,
  execStandbyPid,
  execStandbyStarting,
  execStandbyWaiting,
} from '../../src/edge/backends/container/exec/exec-standby.js';
import { useServerAndSandbox } from '../helpers/server.js';

/** Host pids in the pid namespace `ns` (a /proc/PID/ns/pid link), but those of zombies. */
function pidNamespaceMembers(ns: string): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) !== ns) continue;
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      if (stat[stat.lastIndexOf(')') + 2] !== 'Z') out.push(Number(name));
    } catch {
      // gone, or a kernel thread
    }
  }
  return out;
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return 'gone';
  }
}

/** The sandbox's init: the process of its cgroups that is pid 1 in its own namespace. */
function initPid(id: string): number {
  for (const pid of cgroupTreePids(sandboxCgroupDirs(id))) {
    try {
      const nspid = /^NSpid:\s+(.*)$/m
        .exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]
        ?.trim()
        .split(/\s+/);
      if (nspid?.at(-1) === '1') return pid;
    } catch {
      // gone
    }
  }
  throw new Error(`no init found for ${id}`);
}

describe('engine: the edge knows the process it makes ahead from the moment it is in the sandbox', { timeout: 180_000 }, () => {
  let sb: Sandbox;
  useServerAndSandbox({ resources: { memoryMiB: 64 } }, (_s, b) => {
    sb = b;
  });

  test('every process of the sandbox but its init is the known standby, or the edge says one is starting', async (t) => {
    const init = initPid(sb.id);
    const ns = readlinkSync(`/proc/${init}/ns/pid`);
    const unknown: string[] = [];
    let starts = 0;
    let samples = 0;
    let startingSeen = 0;
    for (let round = 0; round < 20; round++) {
      dropExecStandby(sb.id);
      // Nothing of the dropped one left: it exits on its spec pipe's end, or by SIGKILL.
      for (let i = 0; i < 400 && pidNamespaceMembers(ns).some((p) => p !== init); i++) await new Promise((r) => setTimeout(r, 5));
      const ran = await sb.commands.run(['true']);
      assert.equal(ran.exitCode, 0, ran.stderr);
      // From the answer on (the next standby is asked for right after it), each turn of the
      // event loop until the standby waits with its pid known.
      for (let i = 0; i < 2000; i++) {
        samples++;
        const starting = execStandbyStarting(sb.id);
        if (starting) startingSeen++;
        for (const p of pidNamespaceMembers(ns)) {
          if (p === init) continue;
          // Read again after the look: the pid may have become known in between, never unknown.
          if (!starting && !execStandbyStarting(sb.id) && execStandbyPid(sb.id) !== p) {
            unknown.push(`round ${round}: pid ${p} (${cmdline(p)})`);
          }
        }
        if (execStandbyWaiting(sb.id) && execStandbyPid(sb.id) !== undefined) {
          starts++;
          break;
        }
        await new Promise((r) => setImmediate(r));
      }
    }
    t.diagnostic(`${starts} standbys started, ${samples} looks, ${startingSeen} while one was starting`);
    assert.equal(starts, 20, 'a standby was not made after each command');
    assert.deepEqual(unknown, [], 'a process was in the sandbox that the edge neither knew nor said was starting');
  });
});
