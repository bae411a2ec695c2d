/**
 * An edge daemon closed twice at once: a drained edge leaving the cluster (it closes itself) as a
 * SIGTERM arrives (`dsec edge` closes it again, then exits). The second close must wait for the
 * first; when it returned at once, the process exited mid-shutdown and left the user namespaces
 * the edge had made ahead bound in its data dir (CI's leak check found them after the migration
 * test's drained edge left).
 */
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { compileOptions } from '../../src/config/options.js';
import { startControlPlane } from '../../src/runtime/all-in-one.js';
import { startEdgeDaemon } from '../../src/runtime/edge-daemon.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, mountsBelow, newEdgeId } from '../helpers/server.js';

test(
  'a second close of an edge daemon returns only when the first has finished: no namespace bind is left',
  { skip: integrationSkipReason() },
  async () => {
    const controlDir = makeDataDir();
    const edgeDir = makeDataDir();
    const edgeId = newEdgeId();
    const control = await startControlPlane(compileOptions({ dataDir: controlDir, listen: '127.0.0.1:0', logLevel: 'silent' }, {}));
    try {
      const daemon = await startEdgeDaemon({
        join: control.url,
        token: control.joinToken,
        listen: '127.0.0.1:0',
        dataDir: edgeDir,
        id: edgeId,
        pool: 'default',
        labels: {},
        cpuOvercommit: 0,
        maxSandboxes: 4,
        layerCacheMiB: 256,
        usernsPool: 2,
        logLevel: 'silent',
      });
      const poolDir = join(edgeDir, 'node', 'userns-pool');
      const pool = daemon.edge.usernsPool;
      for (let i = 0; i < 600 && pool.ready < 2; i++) await new Promise((r) => setTimeout(r, 50));
      assert.equal(pool.ready, 2, 'the edge made its two namespaces ahead');
      assert.equal(mountsBelow(poolDir).length, 2);
      const first = daemon.close();
      await daemon.close();
      assert.deepEqual(mountsBelow(poolDir), [], 'the second close returned with the pool still bound');
      assert.equal(existsSync(poolDir), false);
      await first;
    } finally {
      await control.close();
    }
    await assertCleanAndRemove(edgeDir, edgeId);
    await assertCleanAndRemove(controlDir, 'none');
  },
);
