import type { ProjectImages } from './project-images.js';
import type { ProjectQuotas } from './project-quotas.js';
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { EdgeInfo } from '../edge/protocol/edge-api.js';
import pino from 'pino';
import { ApiError } from '../api-error.js';
import type { ImageStore } from '../image/image-store.js';
import type { EdgeRegistry } from './edges/edge-registry.js';
import { Metrics } from './metrics.js';
import { infeasible, place, poolUtilisation, score, type PlacementCandidate, type PlacementRequest } from './placement.js';
import type { Volumes } from './service/volumes.js';
import { SandboxCreation } from './service/sandbox-creation.js';
import type { StateStore } from './state-store.js';

const GiB = 1024 ** 3;

function edge(
  id: string,
  o: {
    pool?: string;
    sandboxes?: number;
    max?: number;
    memAvail?: number;
    cpuCommitted?: number;
    cached?: string[];
    state?: PlacementCandidate['state'];
    labels?: Record<string, string>;
    cpuOvercommit?: number;
  } = {},
): PlacementCandidate {
  const info: EdgeInfo = {
    id,
    protocol: 1,
    version: 'test',
    state: 'running',
    sandboxes: o.sandboxes ?? 0,
    maxSandboxes: o.max ?? 100,
    capacity: {
      cpus: 4,
      memoryBytes: 16 * GiB,
      memoryAvailableBytes: o.memAvail ?? 12 * GiB,
      cpuCommitted: o.cpuCommitted ?? 0,
      memoryCommittedMiB: 0,
      pidsCommitted: 0,
      pidMax: 4_194_304,
      pidsInUse: 300,
    },
    layerCache: { entries: 0, bytes: 0, chargedBytes: 0, budgetBytes: 0, mounted: 0, evictions: 0, overBudget: false },
    cachedLayers: o.cached ?? [],
  };
  return {
    id,
    pool: o.pool ?? 'default',
    labels: o.labels ?? {},
    state: o.state ?? 'ready',
    info,
    pending: { count: 0, cpu: 0, memoryMiB: 0, pids: 0 },
    cpuOvercommit: o.cpuOvercommit ?? 0,
  };
}

const req = (o: Partial<PlacementRequest> = {}): PlacementRequest => ({
  limits: { cpu: 1, memoryMiB: 512, pids: 512 },
  layers: ['sha256:a', 'sha256:b'],
  pool: 'default',
  ...o,
});

describe('placement', () => {
  test('filters by state, pool, labels, slots, memory and exclusions, and says why', () => {
    assert.match(infeasible(edge('a', { state: 'lost' }), req()) ?? '', /lost/);
    assert.match(infeasible(edge('a', { state: 'draining' }), req()) ?? '', /draining/);
    assert.match(infeasible(edge('a', { pool: 'burst' }), req()) ?? '', /pool/);
    assert.match(infeasible(edge('a', { labels: { gpu: 'no' } }), req({ labels: { gpu: 'yes' } })) ?? '', /label gpu/);
    assert.match(infeasible(edge('a', { sandboxes: 100 }), req()) ?? '', /slots/);
    assert.match(infeasible(edge('a', { memAvail: 100 << 20 }), req()) ?? '', /memory/);
    assert.match(infeasible(edge('a'), req({ limits: { cpu: 1, memoryMiB: 32 * 1024, pids: 1 } })) ?? '', /less memory than the limit/);
    assert.match(infeasible(edge('a'), req({ exclude: new Set(['a']) })) ?? '', /refused/);
    assert.match(infeasible(edge('a', { cpuOvercommit: 2, cpuCommitted: 7.5 }), req()) ?? '', /overcommit/);
    assert.equal(infeasible(edge('a', { cpuCommitted: 1000 }), req()), undefined, 'no CPU cap unless the edge sets one');
    assert.equal(infeasible(edge('a'), req()), undefined);
  });

  test('microvm/vm: only edges that run VMs, with a VM slot and free memory for the guest RAM plus overhead', () => {
    const vm = (o: { running?: number; slots?: number; memAvail?: number } = {}): PlacementCandidate => {
      const e = edge('v', o.memAvail === undefined ? {} : { memAvail: o.memAvail });
      e.info.capacity.vms = { slots: o.slots ?? 8, running: o.running ?? 0, memoryCommittedMiB: 0, overheadMiB: 256 };
      return e;
    };
    const microvm = req({ backend: 'microvm', limits: { cpu: 1, memoryMiB: 1024, pids: 64 } });
    assert.match(infeasible(edge('c'), microvm) ?? '', /no microVM\/VM/);
    assert.equal(infeasible(edge('c'), req({ backend: 'container' })), undefined, 'containers go anywhere');
    assert.equal(infeasible(vm(), microvm), undefined);
    assert.match(infeasible(vm({ running: 8 }), microvm) ?? '', /no VM slots/);
    // 1 GiB guest + 256 MiB overhead + the 256 MiB floor do not fit in 1.4 GiB available.
    assert.match(infeasible(vm({ memAvail: 1400 << 20 }), microvm) ?? '', /free memory for the VM/);
    assert.equal(infeasible(vm({ memAvail: 1600 << 20 }), microvm), undefined);
    const busy = vm({ memAvail: 1600 << 20 });
    busy.pending = { count: 1, cpu: 1, memoryMiB: 512, pids: 64 };
    assert.match(infeasible(busy, microvm) ?? '', /free memory/, 'memory placed since the heartbeat counts');
  });

  test('pending placements count until the next heartbeat', () => {
    const e = edge('a', { sandboxes: 99 });
    assert.equal(infeasible(e, req()), undefined);
    e.pending.count = 1;
    assert.match(infeasible(e, req()) ?? '', /slots/);
  });

  test('scores free CPU, layer locality and spread', () => {
    assert.ok(score(edge('warm', { cached: ['sha256:a', 'sha256:b'] }), req()) > score(edge('cold'), req()));
    assert.ok(score(edge('idle'), req()) > score(edge('busy', { sandboxes: 80, cpuCommitted: 40 }), req()));
  });

  test('best of two random candidates; undefined when nothing fits', () => {
    const edges = [edge('a', { sandboxes: 90 }), edge('b'), edge('c', { pool: 'burst' })];
    // random() = 0 picks a then b: b wins on spread.
    assert.equal(place(edges, req(), () => 0)?.id, 'b');
    assert.equal(place(edges, req({ pool: 'gpu' })), undefined);
    assert.equal(place([edge('x', { state: 'lost' })], req()), undefined);
  });

  test('random sampling spreads a burst over equal edges within 10 %', () => {
    const edges = [edge('a', { max: 5000 }), edge('b', { max: 5000 }), edge('c', { max: 5000 })];
    const counts = new Map<string, number>();
    let seed = 42; // a fixed LCG, so the test is the same every run
    const random = (): number => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
    for (let i = 0; i < 3000; i++) {
      const chosen = place(edges, req(), random)!;
      counts.set(chosen.id, (counts.get(chosen.id) ?? 0) + 1);
      chosen.pending.count++; // as the registry reserves it until the next heartbeat
      chosen.pending.cpu += 1;
    }
    const n = [...counts.values()];
    assert.ok(Math.max(...n) / Math.min(...n) <= 1.1, JSON.stringify([...counts]));
  });

  test('a warm edge does not starve a cold one: a few creates of load outweigh locality', () => {
    const edges = [edge('a', { cached: ['sha256:a', 'sha256:b'] }), edge('b', { cached: ['sha256:a', 'sha256:b'] }), edge('c')];
    const counts = new Map<string, number>();
    let seed = 7;
    const random = (): number => (seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31;
    for (let i = 0; i < 30; i++) {
      const chosen = place(edges, req(), random)!;
      counts.set(chosen.id, (counts.get(chosen.id) ?? 0) + 1);
      chosen.pending.count++;
      chosen.pending.cpu += 1;
    }
    assert.ok((counts.get('c') ?? 0) >= 6, `the cold edge got its share: ${JSON.stringify([...counts])}`);
    // Equal load: the warm edge still wins.
    assert.ok(score(edge('warm', { cached: ['sha256:a', 'sha256:b'] }), req()) > score(edge('cold'), req()));
  });

  test('pool utilisation is the larger of slots and memory in use', () => {
    const edges = [edge('a', { sandboxes: 85, max: 100 }), edge('b', { sandboxes: 75, max: 100 }), edge('c', { pool: 'burst' })];
    assert.equal(poolUtilisation(edges, 'default'), 0.8);
    assert.equal(poolUtilisation([edge('m', { memAvail: 1 * GiB })], 'default'), 15 / 16);
    assert.equal(poolUtilisation([], 'default'), 1, 'a pool with no edges is full');
  });
});

test('a sandbox with volumes is placed only on the edge that holds them', () => {
  const edges = [edge('a'), edge('b'), edge('c')];
  const req = (e: string): PlacementRequest => ({ limits: { cpu: 1, memoryMiB: 64, pids: 64 }, layers: [], pool: 'default', edge: e });
  for (let i = 0; i < 20; i++) assert.equal(place(edges, req('b'))?.id, 'b');
  assert.match(infeasible(edges[0]!, req('b')) ?? '', /not edge b, which holds the sandbox's volumes/);
  assert.equal(place([edge('a'), edge('b', { sandboxes: 100, max: 100 })], req('b')), undefined, 'full: no other edge will do');
});

describe('bursting (SandboxCreation.place)', () => {
  const creation = (edges: PlacementCandidate[]): SandboxCreation =>
    new SandboxCreation({
      store: undefined as unknown as StateStore,
      volumes: undefined as unknown as Volumes,
      images: undefined as unknown as ImageStore,
      edges: { candidates: () => edges } as unknown as EdgeRegistry,
      log: pino({ level: 'silent' }),
      metrics: new Metrics(),
      projectImages: undefined as unknown as ProjectImages,
      quotas: undefined as unknown as ProjectQuotas,
      burstPool: 'burst',
      createLease: () => ({ owner: 'test', until: 0 }),
      burstThreshold: 0.8,
    });
  const limits = { cpu: 1, memoryMiB: 512, pids: 512 };
  const spec = (burst: boolean) => ({ image: 'busybox', placement: { burst } });

  test('above the threshold a burstable sandbox goes to the burst pool; a plain one stays', () => {
    const c = creation([edge('d1', { sandboxes: 90 }), edge('d2', { sandboxes: 85 }), edge('b1', { pool: 'burst' })]);
    assert.equal(c.place(spec(true), limits, [], new Set()), 'b1');
    assert.match(c.place(spec(false), limits, [], new Set()), /^d[12]$/);
  });

  test('below the threshold it stays in its pool; when its pool is full it bursts', () => {
    assert.equal(creation([edge('d1', { sandboxes: 10 }), edge('b1', { pool: 'burst' })]).place(spec(true), limits, [], new Set()), 'd1');
    const full = creation([edge('d1', { sandboxes: 100 }), edge('b1', { pool: 'burst' })]);
    assert.equal(full.place(spec(true), limits, [], new Set()), 'b1');
    assert.throws(
      () => full.place(spec(false), limits, [], new Set()),
      (err: unknown) => err instanceof ApiError && err.code === 'CAPACITY_EXCEEDED' && /d1: no sandbox slots/.test(err.message),
    );
  });
});
