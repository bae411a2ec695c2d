import { join } from 'node:path';
import { runTool, which } from 'dsec/host';
import type { SandboxLimits } from 'dsec/container';
import type { Cleanup } from '../cleanup.js';
import type { Spans } from '../profile.js';
import { BENCH_IMAGE, type BenchFixture } from '../fixture.js';
import { CrunRawPeer } from './crun-raw.js';
import { DsecApiPeer } from './dsec-api.js';
import { installed } from './apt.js';
import { startDocker } from './docker.js';
import type { Peer, PeerName, PeerUnavailable } from './peer.js';
import { startPodman } from './podman.js';

/** The Debian package each optional peer needs; `--peers` installs it when missing. */
const PACKAGE: Partial<Record<PeerName, string>> = { podman: 'podman', docker: 'docker.io' };

/**
 * Why `name` cannot run here without an install, or undefined when it can: for a scenario that
 * runs podman and docker wherever they are installed, asked for or not, and never installs them
 * (`--peers` does). A CLI on PATH without its daemon or package is named, so the reason is exact.
 */
export async function notInstalledReason(name: PeerName): Promise<string | undefined> {
  const pkg = PACKAGE[name];
  if (!pkg || (await installed(pkg))) return undefined;
  const cli = which(name);
  const found = cli ? ` (a \`${name}\` CLI is at ${cli}${name === 'docker' && !which('dockerd') ? ', with no dockerd' : ''})` : '';
  return `not installed: Debian's ${pkg} is not on this host${found}; \`--peers ${name}\` installs it with apt-get`;
}

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
