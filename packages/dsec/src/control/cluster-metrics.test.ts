import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Registry } from 'prom-client';
import type { EdgeInfo } from '../edge/protocol/schemas.js';
import { ClusterMetrics, type ClusterView } from './cluster-metrics.js';

const MiB = 1 << 20;

function edgeInfo(id: string, lazyFetched?: number): EdgeInfo {
  return {
    id,
    protocol: 1,
    version: 'test',
    state: 'running',
    sandboxes: 3,
    maxSandboxes: 10,
    capacity: {
      cpus: 4,
      memoryBytes: 1000 * MiB,
      memoryAvailableBytes: 600 * MiB,
      cpuCommitted: 3,
      memoryCommittedMiB: 1536,
      pidsCommitted: 1536,
      pidMax: 4_194_304,
      pidsInUse: 300,
      cpuUsage: 0.25,
    },
    layerCache: {
      entries: 2,
      bytes: 5 * MiB,
      chargedBytes: MiB,
      budgetBytes: 100 * MiB,
      mounted: 1,
      evictions: 1,
      hits: 7,
      misses: 2,
      fetchedBytes: 3 * MiB,
      overBudget: false,
      ...(lazyFetched === undefined
        ? {}
        : {
            lazy: {
              daemon: 'running' as const,
              chunkBytes: 2 * MiB,
              fetchedBytes: lazyFetched,
              evictedChunks: 0,
              layers: [
                {
                  digest: 'sha256:aa',
                  sizeBytes: 8 * MiB,
                  cachedBytes: 2 * MiB,
                  fetchedBytes: lazyFetched,
                  fetchedChunks: 2,
                  readBytes: lazyFetched / 2,
                  readChunks: 1,
                  prefetchedBytes: lazyFetched / 2,
                  failedFetches: 1,
                  digestMismatches: 0,
                  mounted: true,
                },
                {
                  digest: 'sha256:bb',
                  sizeBytes: 4 * MiB,
                  cachedBytes: MiB,
                  fetchedBytes: MiB,
                  fetchedChunks: 1,
                  readBytes: MiB,
                  readChunks: 1,
                  prefetchedBytes: 0,
                  failedFetches: 0,
                  digestMismatches: 0,
                  mounted: true,
                },
              ],
              sandboxes: [],
            },
          }),
    },
    cachedLayers: [],
  };
}

describe('cluster metrics', () => {
  test('sandboxes by state, pool and edge and by project; edge capacity; layer caches; lazy bytes; running batches', async () => {
    const registry = new Registry();
    let batches = [{ id: 'batch-1', count: 100, placed: 40, running: 30, failed: 2 }];
    const view: ClusterView = {
      edges: async () => [
        { id: 'a', pool: 'default', state: 'ready', info: edgeInfo('a', 2 * MiB) },
        { id: 'b', pool: 'burst', state: 'lost', info: edgeInfo('b') },
      ],
      // The store's grouped count: by state, edge and project.
      sandboxCounts: async () => [
        { status: 'running', edge: 'a', project: 'default', count: 1 },
        { status: 'running', edge: 'a', project: 'team-a', count: 1 },
        { status: 'failed', edge: 'a', project: 'team-a', count: 1 },
        { status: 'lost', edge: 'b', project: 'team-a', count: 1 },
      ],
      batches: () => batches,
      images: () => [
        { id: 'sha256:i1', names: ['py:latest'], layers: ['sha256:aa', 'sha256:bb'], sizeBytes: 12 * MiB },
        { id: 'sha256:i2', names: [], layers: ['sha256:aa', 'sha256:cc'], sizeBytes: 16 * MiB },
        { id: 'sha256:i3', names: ['never-read'], layers: ['sha256:dd'], sizeBytes: MiB },
      ],
    };
    const metrics = new ClusterMetrics(registry, view);
    await metrics.refresh();
    const text = await registry.metrics();
    const has = (line: string): void => assert.ok(text.split('\n').includes(line), `missing ${line} in\n${text}`);
    has('dsec_sandboxes{state="running",pool="default",edge="a"} 2');
    has('dsec_sandboxes{state="failed",pool="default",edge="a"} 1');
    has('dsec_sandboxes{state="lost",pool="burst",edge="b"} 1');
    has('dsec_project_sandboxes{project="team-a",state="running"} 1');
    has('dsec_project_sandboxes{project="team-a",state="lost"} 1');
    has('dsec_project_sandboxes{project="default",state="running"} 1');
    has('dsec_edge_up{edge="b",pool="burst",state="lost"} 1');
    has('dsec_edge_utilisation_ratio{edge="a",pool="default"} 0.4');
    has('dsec_edge_cpu_usage_ratio{edge="a",pool="default"} 0.25');
    has(`dsec_edge_memory_committed_bytes{edge="a",pool="default"} ${1536 * MiB}`);
    has('dsec_layer_cache_hits_total{edge="a",pool="default"} 7');
    has('dsec_layer_cache_misses_total{edge="a",pool="default"} 2');
    has(`dsec_layer_cache_fetched_bytes_total{edge="a",pool="default"} ${3 * MiB}`);
    has(`dsec_lazy_fetched_bytes_total{edge="a",pool="default"} ${2 * MiB}`);
    // Per image: its layers' bytes summed (read: aa 1 MiB + bb 1 MiB; fetched: 2 + 1 MiB), a shared layer counting in each image.
    has(`dsec_lazy_image_read_bytes_total{edge="a",pool="default",image="sha256:i1",name="py:latest"} ${2 * MiB}`);
    has(`dsec_lazy_image_fetched_bytes_total{edge="a",pool="default",image="sha256:i1",name="py:latest"} ${3 * MiB}`);
    has(`dsec_lazy_image_read_ratio{edge="a",pool="default",image="sha256:i1",name="py:latest"} ${2 / 12}`);
    has(`dsec_lazy_image_read_bytes_total{edge="a",pool="default",image="sha256:i2",name=""} ${MiB}`);
    has(`dsec_lazy_image_fetched_bytes_total{edge="a",pool="default",image="sha256:i2",name=""} ${2 * MiB}`);
    has('dsec_lazy_image_read_ratio{edge="a",pool="default",image="sha256:i2",name=""} 0.0625');
    assert.doesNotMatch(text, /image="sha256:i3"/, 'an image none of whose layers the edge read has no series');
    assert.doesNotMatch(text, /dsec_lazy_image_fetched_bytes_total\{edge="b"/, 'nor an edge without lazy layers');
    has('dsec_lazy_failed_fetches_total{edge="a",pool="default"} 1');
    assert.doesNotMatch(text, /dsec_lazy_fetched_bytes_total\{edge="b"/, 'an edge without lazy layers has no lazy series');
    has('dsec_batches_running 1');
    has('dsec_batch_items{batch="batch-1",state="count"} 100');
    has('dsec_batch_items{batch="batch-1",state="failed"} 2');

    // The next scrape shows what is there then: counters mirrored from edges are not summed twice,
    // and a finished batch's series go.
    batches = [];
    await metrics.refresh();
    const next = await registry.metrics();
    assert.ok(next.split('\n').includes('dsec_layer_cache_hits_total{edge="a",pool="default"} 7'));
    assert.doesNotMatch(next, /dsec_batch_items\{/);
    assert.ok(next.split('\n').includes('dsec_batches_running 0'));
  });
});
