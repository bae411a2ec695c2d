import assert from 'node:assert/strict';
import { test } from 'node:test';
import { applyLayerSync, LayerDeltaSender } from './layer-delta.js';

/** A control plane's copy: what it holds for the edge and the version. */
function holder(): {
  layers: string[];
  version: number | undefined;
  beat: (s: ReturnType<LayerDeltaSender['next']>) => number | undefined;
} {
  const h = {
    layers: [] as string[],
    version: undefined as number | undefined,
    beat(sent: ReturnType<LayerDeltaSender['next']>): number | undefined {
      const next = applyLayerSync(h.layers, h.version, sent.cachedLayers, sent.layers);
      if (next) h.layers = next.layers;
      h.version = next?.version;
      return h.version;
    },
  };
  return h;
}

test('the whole list goes once, then only what changed; an unchanged set sends an empty delta', () => {
  const edge = new LayerDeltaSender();
  const cp = holder();
  const first = edge.next(['a', 'b']);
  assert.deepEqual(first.cachedLayers, ['a', 'b']);
  edge.held(cp.beat(first));
  assert.deepEqual(cp.layers, ['a', 'b']);
  const same = edge.next(['b', 'a']);
  assert.equal(same.cachedLayers, undefined);
  assert.deepEqual([same.layers.added, same.layers.removed], [[], []]);
  edge.held(cp.beat(same));
  const changed = edge.next(['b', 'c', 'd']);
  assert.equal(changed.cachedLayers, undefined);
  assert.deepEqual([changed.layers.added, changed.layers.removed], [['c', 'd'], ['a']]);
  edge.held(cp.beat(changed));
  assert.deepEqual([...cp.layers].sort(), ['b', 'c', 'd']);
});

test('a delta against a version the control plane does not hold is refused, and the whole list follows', () => {
  const edge = new LayerDeltaSender();
  const cp = holder();
  edge.held(cp.beat(edge.next(['a'])));
  // another replica (or a restarted one) holds nothing for this edge
  const other = holder();
  const delta = edge.next(['a', 'b']);
  assert.equal(delta.cachedLayers, undefined);
  edge.held(other.beat(delta));
  assert.equal(other.version, undefined, 'no version held: the answer asks for the whole list');
  const whole = edge.next(['a', 'b']);
  assert.deepEqual(whole.cachedLayers, ['a', 'b']);
  edge.held(other.beat(whole));
  assert.deepEqual(other.layers, ['a', 'b']);
  assert.notEqual(other.version, undefined);
});

test('an answer lost in flight (the control plane moved on, the edge did not hear) heals with the whole list', () => {
  const edge = new LayerDeltaSender();
  const cp = holder();
  edge.held(cp.beat(edge.next(['a'])));
  cp.beat(edge.next(['a', 'b'])); // held by the control plane, answer lost
  edge.held(undefined); // the edge's heartbeat failed
  const next = edge.next(['a', 'b', 'c']);
  assert.deepEqual(next.cachedLayers, ['a', 'b', 'c']);
  edge.held(cp.beat(next));
  assert.deepEqual(cp.layers, ['a', 'b', 'c']);
});
