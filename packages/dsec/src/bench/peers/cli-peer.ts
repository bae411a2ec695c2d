import { runTool, type ToolResult } from '../../host/run-tool.js';
import type { CgroupScope } from '../cgroup-memory.js';
import type { Peer, PeerName } from './peer.js';

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
  }

  run(args: string[]): Promise<ToolResult> {
    return runTool(this.spec.bin, [...this.spec.globalArgs, ...args], { env: this.spec.env });
  }

  async #ok(args: string[]): Promise<ToolResult> {
    const r = await this.run(args);
    if (r.code !== 0) throw new Error(`${this.spec.name} ${args.join(' ')} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`);
    return r;
  }

  async create(): Promise<string> {
    const r = await this.#ok(['run', '-d', ...this.spec.runArgs, this.spec.image, '/bin/sleep', 'infinity']);
    const id = r.stdout.trim().split('\n').pop() ?? '';
    this.#live.add(id);
    return id;
  }

  async exec(id: string): Promise<void> {
    await this.#ok(['exec', id, 'true']);
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
