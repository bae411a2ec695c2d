import { chmodSync, chownSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ImageConfig } from '@dsec/sdk/schema';
import {
  Crun,
  type SandboxLimits,
  tryUnmount,
  buildOciConfig,
  cgroupNames,
  MASKED_PATHS,
  existingDirs,
  prepareMountStubs,
  type MountStubs,
  mountOverlay,
  unmountSandboxDir,
  makeUserns,
  mountIdmappedRoot,
  SandboxPaths,
} from 'dsec/container';
import { mountsUnder, type UidRangePool, cloneCpusetIntoSandboxes, removeCgroupTree, v1Hierarchies, runTool } from 'dsec/host';
import type { CgroupScope } from '../cgroup-memory.js';
import { STEPS, type Spans } from '../profile.js';
import type { Peer } from './peer.js';

/**
 * The floor: what dsec's edge does to start a sandbox, with nothing else. The same code builds
 * it: a fresh overlay over the same shared EROFS layer mount (edge/overlay.ts), dsec's OCI
 * config (edge/oci-config.ts: namespaces, memory+pids+cpu limits, catatonit -P bind-mounted as
 * init) and the same `crun run -d` invocation (edge/crun.ts: own --root, stdio on /dev/null,
 * errors in a --log file, --pid-file). No HTTP, no SQLite, no state files.
 */
export class CrunRawPeer implements Peer {
  readonly name = 'crun' as const;
  readonly description =
    "raw `crun run -d`: mkdir + overlay mount + dsec's config.json + crun run -d (edge/crun.ts), same layer, same limits";
  readonly execDescription = 'raw `crun exec ID true` on a raw crun container (stdout/stderr piped, as dsec does)';
  readonly cgroupScope: CgroupScope;
  readonly crun: Crun;
  readonly #containers: string;
  readonly #live = new Set<string>();
  /** As dsec's edge binds them (the floor runs dsec's config). */
  readonly #hierarchies = v1Hierarchies();
  readonly #stubs: MountStubs;
  #n = 0;

  constructor(
    /** cgroupParent: raw crun's cgroups live apart from dsec's (`dsec/`), so a leak is told apart and swept. */
    private readonly opts: {
      dir: string;
      lowerDir: string;
      config: ImageConfig;
      limits: SandboxLimits;
      spans: Spans;
      cgroupParent: string;
      /** Changes dsec's OCI config before each run (the hardening benchmark strips defences with it). */
      configure?: (config: Record<string, unknown>) => void;
      /** Each container in a user namespace of its own, as dsec's edge option `userns` makes them. */
      uidRanges?: UidRangePool;
    },
    readonly version: string,
  ) {
    this.cgroupScope = { parent: opts.cgroupParent };
    cloneCpusetIntoSandboxes(opts.cgroupParent); // as dsec's edge sets up its parent
    this.crun = new Crun(join(opts.dir, 'crun-state'));
    this.#containers = join(opts.dir, 'containers');
    // dsec's config as the edge makes it, its shared stub dirs included (masked dirs read per create, as there).
    this.#stubs = prepareMountStubs(cgroupNames(this.#hierarchies));
    mkdirSync(this.#containers, { recursive: true });
  }

  /** Another raw crun peer on the same layer with a changed config, in its own dir and cgroup parent. */
  variant(suffix: string, configure: (config: Record<string, unknown>) => void): CrunRawPeer {
    return new CrunRawPeer(
      { ...this.opts, dir: `${this.opts.dir}-${suffix}`, cgroupParent: `${this.opts.cgroupParent}-${suffix}`, configure },
      this.version,
    );
  }

  /** Another raw crun peer whose containers run in user namespaces (dsec-idmap, as the edge does it). */
  usernsVariant(suffix: string, uidRanges: UidRangePool): CrunRawPeer {
    return new CrunRawPeer(
      { ...this.opts, dir: `${this.opts.dir}-${suffix}`, cgroupParent: `${this.opts.cgroupParent}-${suffix}`, uidRanges },
      this.version,
    );
  }

  async create(): Promise<string> {
    const id = `${this.opts.cgroupParent}-${++this.#n}`;
    const paths = new SandboxPaths(join(this.#containers, id));
    const t0 = performance.now();
    mkdirSync(paths.dir);
    this.#live.add(id);
    const range = this.opts.uidRanges?.take(id);
    if (range) {
      chownSync(paths.dir, 0, range.base);
      chmodSync(paths.dir, 0o710);
      await makeUserns(range, paths.userns, undefined);
      mountIdmappedRoot({
        lowersBottomFirst: [this.opts.lowerDir],
        upper: paths.upper,
        work: paths.work,
        target: paths.rootfs,
        range,
        usernsFile: paths.userns,
        volumes: [],
      });
    } else {
      mountOverlay([this.opts.lowerDir], paths.upper, paths.work, paths.rootfs);
    }
    const t1 = performance.now();
    const userns = range ? { userns: { path: paths.userns, base: range.base, size: range.size } } : {};
    const config = buildOciConfig({
      id,
      config: this.opts.config,
      env: {},
      limits: this.opts.limits,
      cgroupParent: this.opts.cgroupParent,
      cgroupHierarchies: this.#hierarchies,
      stubs: { ...this.#stubs, maskedDirs: existingDirs(MASKED_PATHS) },
      ...userns,
    });
    this.opts.configure?.(config);
    writeFileSync(paths.config, JSON.stringify(config));
    const t2 = performance.now();
    await this.crun.run(id, paths.dir, paths.crunLog, paths.pidFile);
    if (range) tryUnmount(paths.userns);
    const t3 = performance.now();
    this.opts.spans.record(STEPS.rawOverlay, t1 - t0);
    this.opts.spans.record(STEPS.rawConfig, t2 - t1);
    this.opts.spans.record(STEPS.rawCrunRun, t3 - t2);
    return id;
  }

  readonly pauseDescription = 'raw `crun pause ID` / `crun resume ID` (cgroup freezer)';
  readonly snapshots = {
    unavailable: 'not applicable: raw crun runs a bundle and has no image or snapshot format (that is what dsec adds on top of it)',
  };

  async exec(id: string, cmd: string[] = ['true']): Promise<string> {
    return (await this.#crun(['exec', id, ...cmd])).stdout;
  }

  /** The host pid of a container's init (its pid file), for the exec floor peer (exec-floor.ts). */
  initPid(id: string): number {
    const pid = Number(readFileSync(new SandboxPaths(join(this.#containers, id)).pidFile, 'utf8').trim());
    if (!Number.isInteger(pid) || pid <= 0) throw new Error(`container ${id} has no init pid in its pid file`);
    return pid;
  }

  async pause(id: string): Promise<void> {
    await this.#crun(['pause', id]);
  }

  async resume(id: string): Promise<void> {
    await this.#crun(['resume', id]);
  }

  async #crun(args: string[]): Promise<{ stdout: string }> {
    const r = await runTool('crun', [...this.crun.globalArgs(), ...args]);
    if (r.code !== 0) throw new Error(`crun ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
    return r;
  }

  async remove(id: string): Promise<void> {
    const paths = new SandboxPaths(join(this.#containers, id));
    await this.crun.delete(id);
    unmountSandboxDir(paths.dir);
    removeCgroupTree(`${this.opts.cgroupParent}/${id}`);
    rmSync(paths.dir, { recursive: true, force: true });
    this.opts.uidRanges?.release(id);
    this.#live.delete(id);
  }

  async close(): Promise<void> {
    const ids = new Set([...this.#live, ...(await this.crun.list()).map((c) => c.id)]);
    for (const id of ids) await this.remove(id);
    for (const m of mountsUnder(this.#containers).reverse()) tryUnmount(m.mountPoint);
    removeCgroupTree(this.opts.cgroupParent);
  }
}
