import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pino from 'pino';
import { SimulatedEdge } from '../../edge/simulated/simulated-edge.js';
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
    await a.register({
      id: 'gone',
      url: 'http://127.0.0.1:9',
      pool: 'default',
      labels: {},
      cpuOvercommit: 0,
      info: await new SimulatedEdge('gone').info(),
    });
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

test('an edge is reconciled when it registers again (it restarted) and at the report after a call whose outcome is unknown, not at every heartbeat', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-edges-'));
  const store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
  try {
    const log = pino({ level: 'silent' });
    const registry = await EdgeRegistry.open({ replicaId: 'a', store, token: 't', log, lostAfterMs: 60_000 });
    const reconciled: string[] = [];
    registry.onBack = async (id) => {
      reconciled.push(id);
    };
    const settle = (): Promise<void> => new Promise((r) => setImmediate(r)); // onBack runs in the background
    const info = await new SimulatedEdge('e1').info();
    const reg = { id: 'e1', url: 'http://127.0.0.1:9', pool: 'default', labels: {}, cpuOvercommit: 0, info };
    await registry.register(reg);
    await registry.heartbeat('e1', info);
    await settle();
    assert.deepEqual([...reconciled], [], 'a first join and its heartbeats need no reconcile');
    await registry.register(reg); // the edge process started again, well inside lostAfterMs
    await settle();
    assert.deepEqual([...reconciled], ['e1']);
    registry.reconcileAtNextReport('e1');
    await registry.heartbeat('e1', info);
    await registry.heartbeat('e1', info);
    await settle();
    assert.deepEqual([...reconciled], ['e1', 'e1'], 'once at the report after the unknown outcome, then not again');
    registry.reconcileAtNextReport('no-such-edge'); // an edge removed meanwhile: nothing to do
    // A reconcile that fails (the edge did not answer its list) is tried again at the next report.
    let failOnce = true;
    registry.onBack = async (id) => {
      reconciled.push(id);
      if (failOnce) {
        failOnce = false;
        throw new Error('edge did not answer');
      }
    };
    await registry.register(reg);
    await settle();
    await registry.heartbeat('e1', info);
    await settle();
    await registry.heartbeat('e1', info);
    await settle();
    assert.deepEqual([...reconciled], ['e1', 'e1', 'e1', 'e1'], 'the failed one, its retry at the next heartbeat, and no more');
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
