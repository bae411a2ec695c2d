/**
 * The cluster harness's bridge keeps its MAC while ports join. A bridge left to pick its own takes
 * the lowest MAC of its ports, so a port joining with a lower one moved it: a namespace that had
 * learnt the old MAC (another port's by then) sent frames the bridge passed up as not its own,
 * and the kernel dropped them until the namespace's ARP entry expired. For an edge that was 15–55 s
 * without heartbeats: lost, and the cluster test's batch landed on two of its three edges.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import { test } from 'node:test';
import { integrationSkipReason } from '../helpers/server.js';
import { ClusterHarness } from './support/cluster-harness.js';

function skipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (spawnSync('busybox', ['ping', '-h'], { stdio: 'ignore' }).error) return 'needs busybox ping (busybox-static)';
  return undefined;
}

/** One ping from namespace `ns` to `address`: whether it was answered within 2 s. */
function pingFrom(ns: string, address: string): boolean {
  return spawnSync('ip', ['netns', 'exec', ns, 'busybox', 'ping', '-c', '1', '-W', '2', address], { stdio: 'ignore' }).status === 0;
}

test(
  'a namespace that learnt the bridge MAC still reaches the control address after a port with a lower MAC joins',
  { skip: skipReason() },
  async () => {
    const h = new ClusterHarness();
    try {
      h.addBridge();
      const first = h.addNetns('e0', 10);
      const second = h.addNetns('e1', 11);
      const mac = (): string => readFileSync(`/sys/class/net/${h.bridge}/address`, 'utf8').trim();
      const before = mac();
      // Both learn the bridge's MAC, as a joined edge has.
      assert.ok(pingFrom(first, h.controlAddress) && pingFrom(second, h.controlAddress), 'both reach the bridge');
      // A port with the lowest MAC there is joins (as the third edge, or the stranger, does).
      const low = h.addNetns('x', 99);
      execFileSync('ip', ['link', 'set', `dsv${h.tag}x`, 'address', '02:00:00:00:00:01']);
      assert.equal(mac(), before, 'the bridge kept its MAC');
      for (const ns of [first, second]) assert.ok(pingFrom(ns, h.controlAddress), `${ns} still reaches ${h.controlAddress}`);
      assert.ok(pingFrom(low, h.controlAddress));
    } finally {
      await h.close();
      rmSync(h.controlDir, { recursive: true, force: true });
    }
  },
);
