import type { SandboxLimits } from '../../edge/protocol/edge-api.js';
import { runTool, type ToolResult } from '../../host/run-tool.js';
import type { CgroupScope } from '../cgroup-memory.js';
import { pool } from '../rounds.js';
import type { Peer, PeerName, SnapshotOps } from './peer.js';

/** What starting podman or docker needs from the benchmark. */
export interface CliPeerSetup {
  dir: string;
  rootfsTar: () => Promise<string>;
  limits: SandboxLimits;
  cgroupParent: string;
  say: (m: string) => void;
}

/** `run -d` flags giving a podman or docker container the same limits as every other peer's sandbox. */
export function limitFlags(limits: SandboxLimits): string[] {
  return [
    '--pull=never',
    '--network=none',
    `--memory=${limits.memoryMiB}m`,
    `--memory-swap=${limits.memoryMiB}m`,
    `--pids-limit=${limits.pids}`,
    `--cpus=${limits.cpu}`,
  ];
}

/** Imports the busybox rootfs tar as the peer's image; on failure the peer is closed and the CLI's error thrown. */
export async function importRootfs(peer: CliPeer, tar: string, image: string): Promise<CliPeer> {
  const imported = await peer.run(['import', tar, image]);
  if (imported.code !== 0) {
    await peer.close();
    throw new Error(`${peer.name} import of the busybox rootfs failed: ${imported.stderr.trim()}`);
  }
  return peer;
}

/** How to drive a docker-compatible CLI (podman, docker) on a private store. */
export interface CliPeerSpec {
  name: PeerName;
  description: string;
  version: string;
  bin: string;
  /** Flags before the subcommand: a private root, socket, config… */
  globalArgs: string[];
  env: NodeJS.ProcessEnv;
  image: string;
  /** `run -d` flags between `run -d` and the image. */
  runArgs: string[];
  /** The cgroup parent its containers are put under. */
  cgroupParent: string;
  /** `rm -f` flags (podman needs `--time 0`: busybox sleep as PID 1 ignores SIGTERM). */
  rmArgs: string[];
}

/** podman and docker through their own CLI, as a user runs them: `run -d`, `exec`, `rm -f`. */
export class CliPeer implements Peer {
  readonly name: PeerName;
  readonly description: string;
  readonly execDescription: string;
  readonly version: string;
  readonly cgroupScope: CgroupScope;
  readonly pauseDescription: string;
  readonly snapshots: { ops: SnapshotOps };
  readonly #live = new Set<string>();

  constructor(
    private readonly spec: CliPeerSpec,
    private readonly onClose: () => Promise<void>,
  ) {
    this.name = spec.name;
    this.description = spec.description;
    this.execDescription = `${spec.name} exec ID true`;
    this.cgroupScope = { parent: spec.cgroupParent };
    this.version = spec.version;
    this.pauseDescription = `${spec.name} pause ID / ${spec.name} unpause ID`;
    this.snapshots = { ops: this.#snapshotOps() };
  }

  run(args: string[]): Promise<ToolResult> {
    return runTool(this.spec.bin, [...this.spec.globalArgs, ...args], { env: this.spec.env });
  }

  async #ok(args: string[]): Promise<ToolResult> {
    const r = await this.run(args);
    if (r.code !== 0) throw new Error(`${this.spec.name} ${args.join(' ')} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`);
    return r;
  }

  create(): Promise<string> {
    return this.#runDetached(this.spec.image);
  }

  async #runDetached(image: string): Promise<string> {
    const r = await this.#ok(['run', '-d', ...this.spec.runArgs, image, '/bin/sleep', 'infinity']);
    const id = r.stdout.trim().split('\n').pop() ?? '';
    this.#live.add(id);
    return id;
  }

  async exec(id: string, cmd: string[] = ['true']): Promise<string> {
    return (await this.#ok(['exec', id, ...cmd])).stdout;
  }

  async pause(id: string): Promise<void> {
    await this.#ok(['pause', id]);
  }

  async resume(id: string): Promise<void> {
    await this.#ok(['unpause', id]);
  }

  /** `commit` (the CLI's default: the container is paused while its diff is copied), then `run -d` of that image. */
  #snapshotOps(): SnapshotOps {
    const n = this.spec.name;
    const commit = async (id: string): Promise<string> => (await this.#ok(['commit', id])).stdout.trim().split('\n').pop() ?? '';
    return {
      description: `${n} commit ID / ${n} run -d IMAGE (same flags as create); fork = commit + N × run -d, 8 in flight`,
      snapshot: commit,
      createFrom: (image) => this.#runDetached(image),
      fork: async (id, count) => {
        const image = await commit(id);
        const ids: string[] = [];
        await pool(count, 8, async () => void ids.push(await this.#runDetached(image)));
        return { ids, image };
      },
      removeImage: async (image) => void (await this.#ok(['rmi', '-f', image])),
    };
  }

  async remove(id: string): Promise<void> {
    await this.#ok(['rm', '-f', ...this.spec.rmArgs, id]);
    this.#live.delete(id);
  }

  /** Every container on the private store (also ones a crash kept from being recorded). */
  async listAll(): Promise<string[]> {
    const r = await this.run(['ps', '-aq', '--no-trunc']);
    return r.code === 0 ? r.stdout.split('\n').filter(Boolean) : [...this.#live];
  }

  #closed = false;
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    const ids = [...new Set([...this.#live, ...(await this.listAll())])];
    for (let i = 0; i < ids.length; i += 50) await this.run(['rm', '-f', ...this.spec.rmArgs, ...ids.slice(i, i + 50)]);
    this.#live.clear();
    await this.onClose();
  }
}
