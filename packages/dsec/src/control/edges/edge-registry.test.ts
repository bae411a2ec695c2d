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

test("cached layers travel as changes: the store's list is written when it changes, and another replica follows it without the whole list", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-unit-edges-'));
  const location = await testStoreLocation(join(dir, 'state.db'));
  const storeA = await StateStore.open(location);
  const storeB = await StateStore.open(location);
  try {
    const log = pino({ level: 'silent' });
    const a = await EdgeRegistry.open({ replicaId: 'a', store: storeA, token: 't', log, lostAfterMs: 60_000 });
    const b = await EdgeRegistry.open({ replicaId: 'b', store: storeB, token: 't', log, lostAfterMs: 60_000 });
    const touched: boolean[] = [];
    const touch = storeA.edges.touch.bind(storeA.edges);
    storeA.edges.touch = async (id, info, at, layers) => {
      touched.push(layers !== undefined);
      await touch(id, info, at, layers);
    };
    const info = { ...(await new SimulatedEdge('e1').info()), cachedLayers: ['sha256:a'] };
    await a.register({ id: 'e1', url: 'http://127.0.0.1:9', pool: 'default', labels: {}, cpuOvercommit: 0, info });
    const layersOf = (r: EdgeRegistry): string[] => r.candidates().find((c) => c.id === 'e1')!.info.cachedLayers;
    // the whole list, with a version: held
    assert.equal((await a.heartbeat('e1', info, { version: 1 })).layersVersion, 1);
    // nothing changed: no list, nothing written but the facts
    const { cachedLayers: _, ...bare } = info;
    assert.equal((await a.heartbeat('e1', bare, { version: 1, base: 1, added: [], removed: [] })).layersVersion, 1);
    assert.deepEqual(layersOf(a), ['sha256:a']);
    // a change as a delta
    assert.equal((await a.heartbeat('e1', bare, { version: 2, base: 1, added: ['sha256:b'], removed: [] })).layersVersion, 2);
    assert.deepEqual(layersOf(a), ['sha256:a', 'sha256:b']);
    assert.deepEqual(touched, [true, false, true], 'the list is written only when it changed');
    // B reads A's heartbeats from the store, list included, and can take the next delta itself
    await b.tick(Date.now() + 10);
    assert.deepEqual(layersOf(b), ['sha256:a', 'sha256:b']);
    assert.equal((await b.heartbeat('e1', bare, { version: 3, base: 2, added: [], removed: ['sha256:a'] })).layersVersion, 3);
    assert.deepEqual(layersOf(b), ['sha256:b']);
    // a delta against a version A does not hold now: no version in the answer, the list kept
    assert.equal((await a.heartbeat('e1', bare, { version: 4, base: 3, added: ['sha256:c'], removed: [] })).layersVersion, undefined);
    assert.deepEqual(layersOf(a), ['sha256:a', 'sha256:b']);
  } finally {
    await storeA.close();
    await storeB.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
