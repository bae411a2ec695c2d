/**
 * A command the edge starts (dsec-spawn's `enter` request: native/spawn-enter.c, enter-core.c,
 * with the Landlock domain applied in the command's own process) sees itself exactly as one that
 * `crun exec` starts with the same process spec, dsec-landlock in front as the edge gave crun
 * before: the same ids and groups, capability sets, seccomp and no_new_privs state, namespaces,
 * cgroups, rlimits, umask, HOME, cwd and environment, and the same Landlock domain (a write
 * outside writablePaths refused, one inside allowed; a block device node refused as --isolate
 * does). Only what must differ is taken out, each named where it is.
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import { type Sandbox } from '@dsec/sdk';
import { LANDLOCK_PATH, processBlock } from '../../src/edge/backends/container/oci-config.js';
import { runTool } from '../../src/host/run-tool.js';
import { dropExecStandby, execStandbyWaiting } from '../../src/edge/backends/container/exec/exec-standby.js';
import { pollUntil } from './support/sandbox-procs.js';
import { useServerAndSandbox, type TestServer } from '../helpers/server.js';

/** Everything of a process's own view that crun exec sets up, from its own /proc and a few tries. */
const VIEW = [
  'echo ids $(id -u) $(id -g) groups $(id -G)',
  "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|Seccomp_filters):' /proc/self/status",
  'cat /proc/self/limits',
  'for n in user mnt pid net ipc uts cgroup time; do echo ns $n $(readlink /proc/self/ns/$n); done',
  // The cgroup2 line differs by design: see SAME_BUT.
  "grep -v '^0::' /proc/self/cgroup",
  'echo umask $(umask) home $HOME cwd $(pwd)',
  // The edge tags each command's environment (DSEC_EXEC_ID, for kill): see SAME_BUT.
  "env | grep -v '^DSEC_EXEC_ID=' | sort",
  // Landlock: beneath a writable path, outside it, and a block device node (refused by any dsec domain).
  'touch /tmp/view-inside 2>&1 && echo inside-ok; rm -f /tmp/view-inside',
  'touch /etc/view-outside 2>&1 && echo outside-ok; rm -f /etc/view-outside',
  'mknod /tmp/view-blk b 7 0 2>&1 && echo mknod-ok; rm -f /tmp/view-blk',
  'true',
].join('; ');

/**
 * What differs between the two on purpose, and is left out of VIEW: the edge's command starts in
 * its own command cgroup below the sandbox's (the cgroup2 line of /proc/self/cgroup: 0::/cmd-<tag>
 * where crun exec's reads 0::/), and its environment carries the edge's DSEC_EXEC_ID tag.
 */
const SAME_BUT = ['0:: line of /proc/self/cgroup', 'DSEC_EXEC_ID'];

describe('engine: a command started by the edge sees what one started by crun exec sees', { timeout: 180_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  useServerAndSandbox({ resources: { memoryMiB: 128 } }, (s, b) => {
    server = s;
    sb = b;
  });

  /** The same VIEW through crun exec, dsec-landlock in front with `landlock` as the edge would give it. */
  async function viaCrun(landlock: string[]): Promise<string> {
    const env = (await sb.commands.run(['/bin/sh', '-c', 'env -0'])).stdout
      .split('\0')
      .filter((kv) => kv && !/^(HOME|PWD|SHLVL|DSEC_EXEC_ID)=/.test(kv));
    const dir = mkdtempSync(join(tmpdir(), 'dsec-view-'));
    try {
      const spec = join(dir, 'process.json');
      const args = [LANDLOCK_PATH, ...landlock, '--', '/bin/sh', '-c', VIEW];
      writeFileSync(spec, JSON.stringify(processBlock({ args, env, cwd: '/', user: { uid: 0, gid: 0 } })));
      const r = await runTool('crun', ['--root', join(server.dataDir, 'node', 'crun'), 'exec', '--process', spec, sb.id]);
      assert.equal(r.code, 0, r.stderr);
      return r.stdout;
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  test(`with writablePaths: equal, but for ${SAME_BUT.join(' and ')}`, async () => {
    const edge = await sb.commands.run(['/bin/sh', '-c', VIEW], { writablePaths: ['/tmp'] });
    assert.equal(edge.exitCode, 0, edge.stderr);
    const crun = await viaCrun(['--rw', '/tmp']);
    assert.equal(edge.stdout, crun);
    // And what the two agree on is what dsec means a command to have.
    assert.match(edge.stdout, /^inside-ok$/m);
    assert.doesNotMatch(edge.stdout, /^outside-ok$/m, 'a write outside writablePaths went through');
    assert.match(edge.stdout, /view-outside.*Permission denied/);
    assert.match(edge.stdout, /^Seccomp:\s+2$/m);
    assert.match(edge.stdout, /^NoNewPrivs:\s+1$/m);
    assert.match(edge.stdout, /^CapAmb:\s+0+$/m);
    assert.match(edge.stdout, /^Max open files\s+20000\s+20000/m);
  });

  test(`without writablePaths (the --isolate domain): equal, but for ${SAME_BUT.join(' and ')}; the same from the process made ahead`, async () => {
    // Started on demand (no standby waits), then from the sandbox's standby (exec-standby.ts):
    // set up before its command was known, it must end up exactly as the one started on demand.
    dropExecStandby(sb.id);
    const edge = await sb.commands.run(['/bin/sh', '-c', VIEW]);
    assert.equal(edge.exitCode, 0, edge.stderr);
    assert.ok(await pollUntil(() => execStandbyWaiting(sb.id)), 'no exec standby was made after the command');
    const fromStandby = await sb.commands.run(['/bin/sh', '-c', VIEW]);
    assert.equal(fromStandby.exitCode, 0, fromStandby.stderr);
    const crun = await viaCrun(['--isolate']);
    assert.equal(edge.stdout, crun);
    assert.equal(fromStandby.stdout, crun, 'the command run by the standby sees another view');
    assert.match(edge.stdout, /^outside-ok$/m, 'the isolate domain refuses no ordinary write');
    assert.doesNotMatch(edge.stdout, /^mknod-ok$/m, 'a block device node was made');
  });

  test("the edge's command is in its own command cgroup, crun exec's in the sandbox's", async () => {
    const edge = await sb.commands.run(['/bin/sh', '-c', "grep '^0::' /proc/self/cgroup"]);
    assert.match(edge.stdout, /^0::\/cmd-[0-9a-f]+\n$/);
  });
});
