/**
 * Red team, what a sandbox learns about its host from its mount table (issue 10, Low 10):
 * /proc/self/mountinfo inside used to show the overlay's options with the host's data-dir paths
 * (`upperdir=/var/lib/dsec/node/sandboxes/<id>/upper`, and without user namespaces every layer's
 * `lowerdir=…/node/layers/<digest>`), so an agent learnt where the node keeps its state and which
 * layers (digests) it runs on. Both ways a sandbox can run are tried: in a user namespace (the
 * default) and with the opt-out (`userns: false`, host root), each with a size-limited upper (its
 * own loop-mounted filesystem). Volumes are not covered: a bind's root field is its source's path
 * inside the source's filesystem, which for a volume is the data dir's (docs/SECURITY.md).
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { SandboxRecord } from '../../src/edge/backends/container/sandbox-record.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { must } from './support/harness.js';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

for (const userns of [true, false]) {
  describe(
    `red team: mountinfo inside shows no host path or layer digest (${userns ? 'user namespace' : 'opt-out, host root'})`,
    { skip: integrationSkipReason(), timeout: 180_000 },
    () => {
      let server: TestServer;
      let sb: Sandbox;
      const record = (id: string): SandboxRecord =>
        JSON.parse(readFileSync(join(server.dataDir, 'node', 'sandboxes', id, 'state.json'), 'utf8')) as SandboxRecord;

      before(async () => {
        server = await startTestServer({ userns });
        sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64, diskMiB: 16 } });
      });
      after(async () => {
        await sb?.kill().catch(() => undefined);
        await server?.close();
      });

      test('no line of /proc/self/mountinfo or /proc/mounts names the data dir or a layer digest', async () => {
        assert.equal(Boolean(record(sb.id).userns), userns, 'the sandbox did not run the way this test means to try');
        const r = await must(server, sb, ['cat', '/proc/self/mountinfo', '/proc/mounts']);
        const text = r.stdout;
        const root = text.split('\n').find((l) => l.split(' ')[4] === '/') ?? '';
        assert.match(root, / - overlay /, `no overlay root in:\n${text}`);
        // The overlay still works as one: written through, read back.
        await must(server, sb, 'echo ok > /tmp/f && cat /tmp/f && mv /bin /bin2 && mv /bin2 /bin');
        const leaks = text
          .split('\n')
          .filter(
            (l) =>
              l.includes(server.dataDir) || l.includes('/node/sandboxes/') || l.includes('/node/layers/') || l.includes('/node/volumes/'),
          );
        assert.deepEqual(leaks, [], 'host data-dir paths show inside');
        for (const layer of record(sb.id).layers) {
          const hex = layer.slice('sha256:'.length);
          assert.ok(!text.includes(hex.slice(0, 16)), `layer digest ${layer} shows inside`);
        }
        assert.ok(!text.includes(sb.id), 'the sandbox id (its host dir name) shows inside');
      });
    },
  );
}
