import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pino from 'pino';
import { SimulatedEdge } from '../../bench/simulated-edge.js';
import { StateStore } from '../state-store.js';
import { testStoreLocation } from '../../../test/helpers/postgres.js';
import { EdgeRegistry } from './edge-registry.js';

test('a replica that loaded an edge at start takes the loss another replica recorded (it does not hold the watcher lease)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-edges-'));
  const location = await testStoreLocation(join(dir, 'state.db'));
  const storeA = await StateStore.open(location);
  const storeB = await StateStore.open(location);
  try {
    const log = pino({ level: 'silent' });
    const a = await EdgeRegistry.open({ replicaId: 'a', store: storeA, token: 't', log, lostAfterMs: 1000 });
    await a.register({ id: 'gone', url: 'http://127.0.0.1:9', pool: 'default', labels: {}, cpuOvercommit: 0, info: await new SimulatedEdge('gone').info() });
    // B starts while the edge is still ready in the store, and loads it.
    const b = await EdgeRegistry.open({ replicaId: 'b', store: storeB, token: 't', log, lostAfterMs: 1000 });
    assert.equal(b.state('gone'), 'ready');
    const later = Date.now() + 5000;
    await a.tick(later); // A holds the watcher lease: the silent edge is lost
    assert.equal(a.state('gone'), 'lost');
    await b.tick(later); // B cannot take the lease (A holds it) and reads A's verdict
    assert.equal(b.state('gone'), 'lost');
  } finally {
    await storeA.close();
    await storeB.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
