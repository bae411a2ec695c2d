/**
 * The host's /dev/null against user-namespaced sandboxes (found beside red team round three):
 * Debian's crun 1.8.1 chowns its stdio to the container's root when the container has a user
 * namespace, and the edge gave `crun run` the host's /dev/null, so each create made the host's
 * null device owned by the new sandbox's root. A sandbox's /dev/null is a bind of the host's
 * node, so root in that sandbox could then `chmod 000 /dev/null` and break every program on the
 * host. The edge now gives crun a null node of its own (host/private-null.ts), never bound into a
 * sandbox, and doctor gives a chowned /dev/null back to root.
 */
import assert from 'node:assert/strict';
import { chmodSync, chownSync, lstatSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { Crun } from '../../src/edge/backends/container/crun.js';
import { PRIVATE_NULL, restoreHostNull } from '../../src/host/private-null.js';
import { runTool } from '../../src/host/run-tool.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const owner = (path: string): string => {
  const st = lstatSync(path);
  return `${st.uid}:${st.gid} ${(st.mode & 0o7777).toString(8)}`;
};

describe("red team: the host's /dev/null is never a sandbox's", { skip: integrationSkipReason(), timeout: 180_000 }, () => {
  let server: TestServer;

  before(async () => {
    restoreHostNull();
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
    restoreHostNull();
  });

  test("creates leave the host's /dev/null root's; root in the sandbox cannot chmod it", async () => {
    const sandboxes = await Promise.all([1, 2].map(() => Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } })));
    assert.equal(owner('/dev/null'), '0:0 666', "a create made the host's /dev/null another owner's");
    for (const sb of sandboxes) {
      const r = await sb.commands.run(['sh', '-c', 'id -u; chmod 600 /dev/null; echo chmod=$?; ls -ln /dev/null'], { timeoutMs: 20_000 });
      assert.match(r.stdout, /chmod=1/, `chmod of /dev/null inside ${sb.id} must fail: ${r.stdout}${r.stderr}`);
    }
    assert.equal(owner('/dev/null'), '0:0 666');
    // crun was given dsec's own node instead (the edge made it at its start).
    assert.ok(lstatSync(PRIVATE_NULL).isCharacterDevice());
  });

  // The hardening bench's raw crun peer (no dsec-spawn) ran `crun run` of a user-namespaced
  // container on the host's /dev/null and chowned it to that container's root, again and again.
  test("tools this process spawns itself get dsec's null node, never the host's /dev/null", async () => {
    // runTool in a process of its own: in this one the test server's dsec-spawn starts its tools.
    const runToolJs = new URL('../../src/host/run-tool.js', import.meta.url).href;
    const viaRunTool = await runTool(process.execPath, [
      '--input-type=module',
      '-e',
      `const { runTool } = await import(${JSON.stringify(runToolJs)}); process.stdout.write((await runTool('readlink', ['/proc/self/fd/0'])).stdout)`,
    ]);
    assert.equal(viaRunTool.stdout.trim(), PRIVATE_NULL, viaRunTool.stderr);
    // Crun without a dsec-spawn (the bench's raw crun floor): a crun that tells what its stdio is.
    const dir = mkdtempSync(join(tmpdir(), 'dsec-null-'));
    const path = process.env['PATH'];
    try {
      writeFileSync(
        join(dir, 'crun'),
        `#!/bin/sh\nfds="$(readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2)"\necho "$fds" > ${dir}/stdio\nwhile [ "$1" != --pid-file ]; do shift; done\necho 4242 > "$2"\n`,
      );
      chmodSync(join(dir, 'crun'), 0o755);
      process.env['PATH'] = `${dir}:${path}`;
      const pid = await new Crun(join(dir, 'root')).run('sb-x', dir, join(dir, 'log'), join(dir, 'pid'));
      assert.equal(pid, 4242);
      assert.deepEqual(readFileSync(join(dir, 'stdio'), 'utf8').trim().split('\n'), [PRIVATE_NULL, PRIVATE_NULL, PRIVATE_NULL]);
    } finally {
      process.env['PATH'] = path;
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('doctor gives a chowned /dev/null back to root', () => {
    chownSync('/dev/null', 1234567, 1234567);
    try {
      const r = restoreHostNull();
      assert.equal(r.ok, true);
      assert.match(r.fixed ?? '', /was 1234567:1234567 666/);
      assert.equal(owner('/dev/null'), '0:0 666');
    } finally {
      chownSync('/dev/null', 0, 0);
    }
  });
});
