import { join } from 'node:path';
import { runTool } from '../../host/run-tool.js';
import type { SandboxLimits } from '../../edge/protocol/edge-api.js';
import type { Cleanup } from '../cleanup.js';
import type { Spans } from '../profile.js';
import { BENCH_IMAGE, type BenchFixture } from '../fixture.js';
import { CrunRawPeer } from './crun-raw.js';
import { DsecApiPeer } from './dsec-api.js';
import { startDocker } from './docker.js';
import type { Peer, PeerName, PeerUnavailable } from './peer.js';
import { startPodman } from './podman.js';

/** The sandbox every peer starts: what `dsec bench` asks of each. */
export const BENCH_LIMITS: SandboxLimits = { memoryMiB: 64, pids: 512, cpu: 1 };

/**
 * Sets up dsec and each asked-for peer, then proves each works with one create, exec and
 * remove. A peer that fails either step is reported with the reason and left out.
 */
export async function setupPeers(
  names: PeerName[],
  fixture: BenchFixture,
  ctx: { cleanup: Cleanup; say: (m: string) => void; dsecVersion: string; runLabel: string; spans: Spans },
): Promise<{ peers: Peer[]; unavailable: PeerUnavailable[] }> {
  const { say } = ctx;
  const peers: Peer[] = [];
  const unavailable: PeerUnavailable[] = [];
  const add = async (name: PeerName, start: () => Promise<Peer>): Promise<void> => {
    let peer: Peer;
    try {
      say(`setting up ${name}…`);
      peer = await start();
    } catch (err) {
      unavailable.push({ name, reason: `set-up failed: ${(err as Error).message}` });
      say(`${name} cannot run: ${(err as Error).message}`);
      return;
    }
    ctx.cleanup.add(`remove ${name}'s containers and set-up`, () => peer.close());
    try {
      const id = await peer.create();
      await peer.exec(id);
      await peer.remove(id);
      peers.push(peer);
    } catch (err) {
      unavailable.push({ name, reason: `a first create/exec/remove failed: ${(err as Error).message}` });
      say(`${name} cannot run: ${(err as Error).message}`);
      await peer.close().catch(() => undefined);
    }
  };

  const { dsec } = fixture;
  await add(
    'dsec',
    async () =>
      new DsecApiPeer(
        { url: dsec.url, apiKey: dsec.apiKey },
        BENCH_IMAGE,
        BENCH_LIMITS,
        { bench: ctx.runLabel },
        ctx.dsecVersion,
        fixture.names.sandboxPrefix,
      ),
  );
  for (const name of names) {
    if (name === 'crun') {
      const version = (await runTool('crun', ['--version'])).stdout.split('\n')[0] ?? 'crun';
      await add(
        'crun',
        async () =>
          new CrunRawPeer(
            {
              dir: join(fixture.dir, 'crun'),
              lowerDir: fixture.lowerDir,
              config: fixture.config,
              limits: BENCH_LIMITS,
              spans: ctx.spans,
              cgroupParent: fixture.names.cgroupParent('crun'),
            },
            version,
          ),
      );
    } else if (name === 'podman') {
      await add('podman', () =>
        startPodman({
          dir: join(fixture.dir, 'podman'),
          rootfsTar: () => fixture.rootfsTar(),
          limits: BENCH_LIMITS,
          cgroupParent: fixture.names.cgroupParent('podman'),
          say,
        }),
      );
    } else if (name === 'docker') {
      await add('docker', () =>
        startDocker({
          dir: join(fixture.dir, 'docker'),
          rootfsTar: () => fixture.rootfsTar(),
          limits: BENCH_LIMITS,
          cgroupParent: fixture.names.cgroupParent('docker'),
          say,
        }),
      );
    }
  }
  return { peers, unavailable };
}
