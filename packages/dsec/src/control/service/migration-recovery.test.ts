import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import pino from 'pino';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { testStoreLocation } from '../../../test/helpers/postgres.js';
import { sandboxRow } from '../../../test/helpers/sandbox-row.js';
import type { EdgeApi } from '../../edge/protocol/edge-api.js';
import type { EdgeRegistry } from '../edges/edge-registry.js';
import { StateStore } from '../state-store.js';
import { MigrationService } from './migration.js';

/** A running sandbox's row on edge `a`. */
const row = (id: string): SandboxInfo => sandboxRow(id, { edge: 'a', layers: ['sha256:base'] });

/** Edges as recoverAbandoned asks them: what each runs, and what it was told; `down` ones cannot be listed. */
class FakeEdges {
  readonly runs = new Map<string, Set<string>>();
  readonly down = new Set<string>();
  readonly calls: string[] = [];

  has(edge: string): boolean {
    return this.runs.has(edge);
  }

  apiEvenIfLost(edge: string): EdgeApi {
    const runs = this.runs.get(edge)!;
    return {
      listSandboxes: async () => {
        if (this.down.has(edge)) throw new Error(`edge ${edge} does not answer`);
        return [...runs].map((id) => ({ id }));
      },
      killSandbox: async (id: string) => {
        this.calls.push(`kill ${edge} ${id}`);
        runs.delete(id);
      },
      resumeSandbox: async (id: string) => {
        this.calls.push(`resume ${edge} ${id}`);
      },
    } as unknown as EdgeApi;
  }
}

/**
 * A replica that died mid-move leaves its moves' leases to lapse; the replica holding the expiry
 * lease settles them by where each sandbox runs now (MigrationService.recoverAbandoned): nothing
 * lost, never on two edges, a sandbox on neither failed with a reason, an edge that does not
 * answer asked again at the next sweep. On the real store (SQLite, or PostgreSQL in its pass).
 */
describe('abandoned moves of a replica that died', () => {
  let dir: string;
  let store: StateStore;
  const edges = new FakeEdges();
  const t0 = 5_000_000;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-moves-'));
    store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('on its target: committed (a copy left on the source removed); on its source: given up and resumed unless paused; on neither: failed with why', async () => {
    const service = new MigrationService({ store, edges: edges as unknown as EdgeRegistry, log: pino({ level: 'silent' }) } as never);
    edges.runs.set('a', new Set(['sb-on-target', 'sb-on-both', 'sb-on-source', 'sb-paused', 'sb-to-c']));
    edges.runs.set('b', new Set());
    edges.runs.set('c', new Set());
    const moves: [string, string][] = [
      ['sb-on-target', 'b'],
      ['sb-on-both', 'b'],
      ['sb-on-source', 'b'],
      ['sb-paused', 'b'],
      ['sb-nowhere', 'b'],
      ['sb-to-c', 'c'],
      ['sb-alive-lease', 'b'],
    ];
    for (const [id] of moves) await store.sandboxes.insert(row(id));
    await store.sandboxes.setStatus('sb-paused', 'paused');
    for (const [id, to] of moves) {
      const owner = id === 'sb-alive-lease' ? 'live-replica' : 'dead-replica';
      const until = id === 'sb-alive-lease' ? t0 + 60_000 : t0 + 1_000;
      assert.equal(await store.moves.begin(id, to, { owner, until }, t0), true, id);
    }
    // Where the dead replica had got to: the target's copy started (and the source's removed, or not yet).
    await store.moves.stage('sb-on-target', 'b', ['sha256:base', 'sha256:packed']);
    edges.runs.get('a')!.delete('sb-on-target');
    edges.runs.get('b')!.add('sb-on-target').add('sb-on-both');
    edges.runs.get('a')!.delete('sb-nowhere');
    edges.down.add('c');

    const out = await service.recoverAbandoned(t0 + 5_000);
    assert.deepEqual(
      { committed: out.committed.sort(), givenUp: out.givenUp.sort(), failed: out.failed },
      { committed: ['sb-on-both', 'sb-on-target'], givenUp: ['sb-on-source', 'sb-paused'], failed: ['sb-nowhere'] },
    );
    assert.deepEqual(edges.calls.sort(), ['kill a sb-on-both', 'resume a sb-on-source'], 'a paused sandbox stays paused');
    const get = async (id: string): Promise<Partial<SandboxInfo>> => {
      const s = await store.sandboxes.get(id);
      return { edge: s?.edge, status: s?.status, layers: s?.layers };
    };
    assert.deepEqual(await get('sb-on-target'), { edge: 'b', status: 'running', layers: ['sha256:base', 'sha256:packed'] });
    assert.equal((await get('sb-on-both')).edge, 'b');
    assert.deepEqual(await get('sb-on-source'), { edge: 'a', status: 'running', layers: ['sha256:base'] });
    assert.deepEqual(await get('sb-paused'), { edge: 'a', status: 'paused', layers: ['sha256:base'] });
    const failed = await store.sandboxes.get('sb-nowhere');
    assert.equal(failed?.status, 'failed');
    assert.match(
      failed?.reason ?? '',
      /replica dead-replica stopped while moving it from edge a to edge b, after its copy there was removed/,
    );
    for (const id of ['sb-on-target', 'sb-on-both', 'sb-on-source', 'sb-paused', 'sb-nowhere'])
      assert.equal(await store.moves.get(id), undefined, `${id}'s move is settled`);
    // An edge that does not answer: its move waits for the next sweep; a live replica's move is not touched.
    assert.equal((await store.moves.get('sb-to-c'))?.to, 'c');
    assert.equal((await store.moves.get('sb-alive-lease'))?.owner, 'live-replica');

    edges.down.delete('c');
    const again = await service.recoverAbandoned(t0 + 6_000);
    assert.deepEqual(again, { committed: [], givenUp: ['sb-to-c'], failed: [] });
    assert.equal(await store.moves.get('sb-to-c'), undefined);
    assert.equal((await store.moves.get('sb-alive-lease'))?.owner, 'live-replica');
  });
});
