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
import { chownSync, lstatSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { PRIVATE_NULL, restoreHostNull } from '../../src/host/private-null.js';
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
