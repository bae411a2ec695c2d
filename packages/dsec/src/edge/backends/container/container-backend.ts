import type { SandboxUsage } from '@dsec/sdk/schema';
import { existsSync, mkdirSync, rmSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import { join } from 'node:path';
import { ApiError } from '../../../api-error.js';
import { CGROUP_PARENT, cloneCpusetIntoSandboxes, removeEmptyCgroup, v1Hierarchies } from '../../../host/cgroups.js';
import { memoryPeaks } from '../../../host/memory-peaks.js';
import { FreezerPin, freeze, thaw } from '../../../host/freezer.js';
import { lockEdgeId } from '../../../host/host-claims.js';
import { removeTree } from '../../../host/remove-tree.js';
import { ToolError, startToolsThrough } from '../../../host/run-tool.js';
import type { SpawnHelper } from '../../../host/spawn-helper.js';
import { UidRangePool } from '../../../host/uid-ranges.js';
import type { Link } from '../../../net/address-pool.js';
import type { NodeLinks } from '../../../net/node-links.js';
import type { NetworkPolicy } from '../../../net/policy.js';
import { admit, checkCreateInputs } from '../../node/admission.js';
import type { LayerCache } from '../../node/layer-cache.js';
import type { LayerMounts } from '../../node/layer-mounts.js';
import type { LazyLayers } from '../../node/lazy/lazy-layers.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { NodeLayers } from '../../node/node-layers.js';
import type { NodeVolumes } from '../../node/node-volumes.js';
import { resolvePolicy } from '../../node/network-request.js';
import type {
  EdgeCreateRequest,
  EdgeNetworkRequest,
  EdgeQuiesce,
  EdgeSandbox,
  EdgeSnapshot,
  SandboxLimits,
} from '../../protocol/edge-api.js';
import type { SandboxBackend } from '../backend.js';
import { adoptOrClean } from './container-adoption.js';
import { settleCrunCalls } from './crun-stragglers.js';
import type { ContainerOptions } from './container-options.js';
import { applyNetwork, getNetwork, setNetwork } from './container-network.js';
import { ContainerPorts } from './container-ports.js';
import { ContainerCommands } from './container-commands.js';
import { createContainer, type CreateContext } from './container-create.js';
import { ContainerFiles } from './container-files.js';
import { openContainerSession } from './exec/container-session.js';
import { quiesceContainer } from './container-quiesce.js';
import { snapshotContainer } from './container-snapshot.js';
import { Crun } from './crun.js';
import { teardownContainer } from './container-teardown.js';
import { containerUsage } from './container-usage.js';
import { crunSpawner } from './crun-spawner.js';
import type { ExecTarget } from './exec/exec-target.js';
import { forgetSpareCgroup } from './exec/sandbox-process.js';
import { dropExecStandby } from './exec/exec-standby.js';
import { newLiveSandbox, standbyAllowed, toEdgeSandbox, type LiveSandbox } from './live-sandbox.js';
import { prepareMountStubs, type MountStubs } from './mount-stubs.js';
import { cgroupNames } from './oci-config.js';
import { releaseSandboxesDir, secureSandboxesDir } from './sandboxes-mount.js';
import { type SandboxRecord, SandboxRecords } from './sandbox-record.js';
import { compileSeccompProfile } from './seccomp-bpf.js';
import { defaultSeccompProfile } from './seccomp.js';
import { DEFAULT_USERNS_POOL, UsernsPool } from './userns-pool.js';
import { HostNotReadyError } from '../../../host/host-not-ready.js';

type EdgeState = 'starting' | 'running' | 'draining' | 'stopped';

/**
 * The container backend: every container sandbox's overlay, cgroups and crun container, and the
 * commands, files, ports and terminals of each. It admits creates with the node's rules
 * (node/admission.ts) and mounts the node's layers. All state lives on disk, so a restarted edge
 * adopts running sandboxes and cleans up what a crash left half-made (its start()).
 * Why over 500 lines: ~30 of them are the one-line delegations SandboxBackend asks for, to
 * container-commands.ts and container-files.ts; the rest is one concept, a container's life.
 */
export class ContainerBackend implements SandboxBackend {
  readonly id: string;
  readonly crun: Crun;
  readonly layers: NodeLayers;
  readonly records: SandboxRecords;
  readonly #live = new Map<string, LiveSandbox>();
  readonly #commands = new ContainerCommands((id) => this.#serving(id));
  readonly #files = new ContainerFiles((id) => this.#serving(id));
  /** Ids being created or killed, so a kill waits for a create to finish and vice versa. */
  readonly #busy = new Map<string, Promise<unknown>>();
  #state: EdgeState = 'starting';
  #releaseEdgeId: (() => void) | undefined;
  readonly #ports = new ContainerPorts();
  readonly volumes: NodeVolumes;
  /** Volumes of creates in flight (not yet in #live), so a delete cannot race a mount. */
  readonly #mountingVolumes = new Map<string, string[]>();
  #freezerPin: FreezerPin | undefined;
  /** The node's sandbox links (address pool, host guard, dsec-nft), shared with the VM backend. */
  readonly links: NodeLinks;
  /** Node-local scratch for snapshot staging trees and blobs before they go to the blob source. */
  readonly #tmpDir: string;
  /** Starts crun on the create and kill path, and the process's other tools (runTool), without a fork of this process (host/spawn-helper.ts). */
  readonly #spawner: SpawnHelper;
  #stopStartingTools: (() => void) | undefined;
  /** The seccomp profile compiled once, at start (base64 BPF for crun), or undefined: crun compiles it per create. */
  #seccompBpf: string | undefined;
  /** The v1 cgroup hierarchies bound into each sandbox (host/cgroups.ts v1Hierarchies), read at start. */
  #cgroupHierarchies: string[] | undefined;
  /** Shared read-only dirs bound where a sandbox would get a tmpfs of its own (mount-stubs.ts). */
  #stubs: MountStubs | undefined;
  /** Host uid ranges of this edge's user-namespaced sandboxes, claimed host-wide. */
  readonly uidRanges: UidRangePool;
  /** User namespaces made ahead, so a create need not wait for dsec-idmap (empty without `userns`). */
  readonly usernsPool: UsernsPool;

  constructor(private readonly opts: ContainerOptions) {
    this.id = opts.id;
    this.links = opts.links;
    this.layers = opts.layers;
    this.records = new SandboxRecords(join(opts.nodeDir, 'sandboxes'));
    const usernsPoolDir = join(opts.nodeDir, 'userns-pool');
    const { helper, spawner } = crunSpawner([this.records.dir, this.layerMounts.dir, usernsPoolDir], opts.log);
    this.#spawner = helper;
    this.crun = new Crun(join(opts.nodeDir, 'crun'), spawner);
    if (spawner) this.#stopStartingTools = startToolsThrough(spawner);
    this.volumes = opts.volumes;
    this.#tmpDir = join(opts.nodeDir, 'tmp');
    mkdirSync(this.#tmpDir, { recursive: true });
    this.uidRanges = new UidRangePool(opts.id);
    this.usernsPool = new UsernsPool({
      dir: usernsPoolDir,
      size: this.userns ? (opts.usernsPool ?? DEFAULT_USERNS_POOL) : 0,
      ranges: this.uidRanges,
      spawner,
      log: opts.log,
    });
  }

  get layerCache(): LayerCache {
    return this.layers.cache;
  }

  get layerMounts(): LayerMounts {
    return this.layers.mounts;
  }

  /** Set in lazy mode: the node's lazy layer store. */
  get lazyLayers(): LazyLayers | undefined {
    return this.layers.lazy;
  }

  get maxSandboxes(): number {
    return this.opts.maxSandboxes;
  }

  /** Sandboxes running here. */
  get count(): number {
    return this.#live.size;
  }

  owns(id: string): boolean {
    return this.#live.has(id);
  }

  /** The limits of the sandboxes running here (for the node's capacity). */
  limits(): SandboxLimits[] {
    return [...this.#live.values()].map((l) => l.record.limits);
  }

  /** The sandboxes that mount volume `name`, running or being created. */
  volumeUsers(name: string): string[] {
    const users = [...this.#live.values()].filter((l) => l.record.volumes?.some((v) => v.name === name)).map((l) => l.record.id);
    for (const [id, names] of this.#mountingVolumes) if (names.includes(name)) users.push(id);
    return users;
  }

  /** Whether new sandboxes run in a user namespace (EdgeOptions.userns). */
  get userns(): boolean {
    return this.opts.userns !== false;
  }

  get state(): EdgeState {
    return this.#state;
  }

  /** Adopts sandboxes that are still running; removes whatever else a previous run left. */
  async start(): Promise<{ adopted: string[]; cleaned: string[] }> {
    // First: a second edge with this id on this host would take over the first one's sandboxes,
    // host guard table and cgroups. It refuses to start instead (EdgeIdTakenError).
    this.#releaseEdgeId ??= lockEdgeId(this.id);
    // Then the previous run's crun calls, still going after a crash, finish (or are killed):
    // a create that finishes after the listing below would start a container nothing knows.
    const stragglers = await settleCrunCalls(this.crun.root);
    if (stragglers.waited.length)
      this.opts.log.warn(stragglers, "waited for the previous run's crun calls on this edge's state before reading it");
    // Then, before anything is touched: without crun's listing every live sandbox would look dead.
    const running = new Map((await this.#listContainers()).map((c) => [c.id, c]));
    await this.#compileSeccomp();
    // After doctor's mounts (it mounts a v1 hierarchy crun would look for and not find).
    this.#cgroupHierarchies = v1Hierarchies();
    this.#stubs = prepareMountStubs(cgroupNames(this.#cgroupHierarchies));
    if (this.#cgroupHierarchies.includes('cpuset') && !cloneCpusetIntoSandboxes()) {
      this.opts.log.warn("could not set cgroup.clone_children on dsec's cpuset parent: creates cost more as the node fills");
    }
    // Staging left by a crash (a snapshot's copy of a tree the sandbox shaped: any depth).
    await removeTree(this.#tmpDir);
    mkdirSync(this.#tmpDir, { recursive: true });
    if (!secureSandboxesDir(this.records.dir)) {
      this.opts.log.warn(
        { dir: this.records.dir },
        'sandboxes from an older dsec are mounted here: the directory is made nosuid,nodev at the first start without them',
      );
    }
    // Lazy layers whose daemon did not survive are unreadable: their sandboxes cannot be adopted.
    const lazyDead = this.layers.deadLazyLayers();
    const { adopted, cleaned, failed } = await adoptOrClean(
      {
        records: this.records,
        crun: this.crun,
        uidRanges: this.uidRanges,
        live: this.#live,
        teardown: (id, layers) => this.#teardown(id, layers, false),
        log: this.opts.log,
      },
      running,
      lazyDead,
    );
    // Namespaces a previous run made ahead (also with the pool or userns off now): their binds
    // and files go here, their claims with the reconcile below.
    const pooled = this.usernsPool.clearLeftovers();
    if (pooled) this.opts.log.info({ namespaces: pooled }, 'removed the user namespaces a previous run had made ahead');
    // Ranges claimed for sandboxes that are gone (cleaned up above, or never started), or for
    // namespaces made ahead (their holder is never a live sandbox).
    // A sandbox whose clean-up failed above keeps its dir (for the next start): its files are
    // still owned by its range, which must not go to a new sandbox meanwhile.
    this.uidRanges.reconcile((id) => this.#live.has(id) || existsSync(this.records.paths(id).dir));
    this.layers.reconcile(
      [...this.#live.values()].map((l) => l.record.layers),
      lazyDead,
    );
    for (const f of failed) this.opts.onSandboxFailed?.(f.id, f.reason);
    const linked = [...this.#live.values()].filter((l) => l.record.network?.link);
    for (const l of linked) {
      if (!this.links.adopt(l.record.network!.link!)) {
        this.opts.log.error(
          { sandbox: l.record.id, link: l.record.network!.link },
          "another edge on this host claims this sandbox's link block",
        );
      }
    }
    await this.links.settleGuard(); // removes this edge's own table, left by a crash, when nothing is linked
    this.#freezerPin = new FreezerPin(`freezer-pin-${this.id}`);
    this.#state = 'running';
    this.usernsPool.refill();
    if (adopted.length || cleaned.length) this.opts.log.info({ adopted, cleaned }, 'edge reconciled sandboxes from disk');
    return { adopted, cleaned };
  }

  async #listContainers(): Promise<Awaited<ReturnType<Crun['list']>>> {
    try {
      return await this.crun.list();
    } catch (err) {
      // Nothing was taken over: the id is free for the next start, in this process or another.
      this.#releaseEdgeId?.();
      this.#releaseEdgeId = undefined;
      // One line: crun's parse errors draw a caret under the text over several.
      const why = (err instanceof ToolError ? err.result.stderr : (err as Error).message).replace(/\s+/g, ' ').trim();
      throw new HostNotReadyError(
        `edge ${this.id} cannot start: crun cannot list its containers under ${this.crun.root} (${why}); no sandbox was adopted or removed. Fix crun's state and start again`,
      );
    }
  }

  /**
   * The lazy layer daemon died: every sandbox on a lazy layer has lost its image (reads fail), so
   * each is ended and reported failed with the reason; its layer mounts go with it, then the dead
   * daemon's own mount. The next create that needs a lazy layer starts a new daemon.
   */
  async lazyLayersLost(reason: string): Promise<void> {
    const lazy = this.lazyLayers;
    if (!lazy || this.#state === 'stopped') return;
    const lazyLayers = this.layers.mountedLazyLayers();
    const victims = [...this.#live.values()].filter((l) => l.record.layers.some((d) => lazyLayers.has(d))).map((l) => l.record.id);
    await Promise.allSettled(
      victims.map(async (id) => {
        await this.killSandbox(id);
        this.opts.onSandboxFailed?.(id, `failed: ${reason}; the sandbox's image layers became unreadable`);
      }),
    );
    this.opts.log.error({ sandboxes: victims }, `ended sandboxes on lazy layers: ${reason}`);
    if (!lazy.daemon.running) lazy.daemon.clearMount();
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    return [...this.#live.values()].map((l) => toEdgeSandbox(l.record));
  }

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    admit({
      edgeId: this.id,
      nodeDir: this.opts.nodeDir,
      state: this.#state,
      count: this.#live.size + this.#busy.size,
      maxSandboxes: this.opts.maxSandboxes,
      minFreeDiskBytes: this.opts.minFreeDiskBytes,
      memoryAdmission: this.opts.memoryAdmission,
    });
    if (this.#live.has(req.id) || this.#busy.has(req.id) || existsSync(this.records.paths(req.id).dir)) {
      throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} already exists on edge ${this.id}`);
    }
    checkCreateInputs(req, { edgeId: this.id, layerCache: this.layerCache, blobs: this.opts.blobs, volumes: this.volumes });
    const volumes = req.volumes ?? [];
    if (volumes.length)
      this.#mountingVolumes.set(
        req.id,
        volumes.map((v) => v.name),
      );
    // Host names are resolved here, on the node that will enforce the rules.
    let network: NetworkPolicy | undefined;
    try {
      network = req.network && req.network.mode !== 'none' ? await resolvePolicy(req.network) : undefined;
    } catch (err) {
      this.#mountingVolumes.delete(req.id);
      throw err;
    }
    const work = this.#create(req, network);
    this.#busy.set(req.id, work);
    try {
      return await work;
    } finally {
      this.#busy.delete(req.id);
      this.#mountingVolumes.delete(req.id);
      this.usernsPool.refill(); // after the create, so its dsec-idmap does not compete with this create's crun
    }
  }

  /**
   * Compiles the seccomp profile once for every create of this edge. Should the compiler be
   * missing (scripts/setup not run since it was added), crun compiles the profile per create as
   * before: the same filter, a little slower, and said in the log.
   */
  async #compileSeccomp(): Promise<void> {
    if (this.#seccompBpf) return;
    try {
      this.#seccompBpf = (await compileSeccompProfile(defaultSeccompProfile())).toString('base64');
    } catch (err) {
      this.opts.log.warn({ err: (err as Error).message }, 'cannot precompile the seccomp profile; crun compiles it on every create');
    }
  }

  async #create(req: EdgeCreateRequest, network: NetworkPolicy | undefined): Promise<EdgeSandbox> {
    const record: SandboxRecord = {
      id: req.id,
      phase: 'creating',
      layers: req.layers as LayerDigest[],
      config: req.config,
      env: req.env,
      limits: req.limits,
      createdAt: new Date().toISOString(),
      ...(req.volumes?.length ? { volumes: req.volumes } : {}),
    };
    // A namespace made ahead, with its range's claim handed over to this sandbox; else one made here.
    const pooled = this.userns ? this.usernsPool.take(req.id) : undefined;
    try {
      const made = await createContainer(this.#createContext(), req, network, record, pooled);
      // A moved sandbox's sessions, reopened with their ids and state (nothing of theirs moves but the state).
      const l = this.#live.get(req.id);
      if (l) for (const c of req.sessions ?? []) l.sessions.add(openContainerSession(l.target, c.request, standbyAllowed(l), c));
      return made;
    } finally {
      if (pooled) this.usernsPool.done(pooled); // its bind in the pool's dir is removed right after, off this create's path
    }
  }

  /** What the create proper (container-create.ts) uses of this backend. */
  #createContext(): CreateContext {
    return {
      edgeId: this.id,
      userns: this.userns,
      uidRanges: this.uidRanges,
      records: this.records,
      layerMounts: this.layerMounts,
      usernsPool: this.usernsPool,
      crun: this.crun,
      volumes: this.volumes,
      runtimeInputs: () => {
        const cgroupHierarchies = (this.#cgroupHierarchies ??= v1Hierarchies());
        this.#stubs ??= prepareMountStubs(cgroupNames(cgroupHierarchies));
        return { cgroupHierarchies, stubs: this.#stubs, seccompBpf: this.#seccompBpf };
      },
      applyNetwork: (record, policy) => applyNetwork(this.links, record, policy),
      teardown: (id, layers) => this.#teardown(id, layers, true),
      register: (record) => void this.#live.set(record.id, newLiveSandbox(record, this.records, this.crun)),
    };
  }

  async killSandbox(id: string): Promise<void> {
    const inflight = this.#busy.get(id);
    if (inflight) await inflight.catch(() => undefined);
    const live = this.#live.get(id);
    if (!live) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on edge ${this.id}`);
    // The sandbox stays known until its teardown has really finished: a teardown that fails leaves
    // it listed (and a kill retries it), never forgotten with its mounts and cgroups still there.
    live.killing = true;
    live.stop.abort();
    live.journal.close(); // before the processes it notes end: their exits must not write into a dir being removed
    live.processes.killAll();
    live.sessions.closeAll();
    dropExecStandby(id); // the teardown's kill of the sandbox's cgroups ends it anyway
    for (const p of live.ptys) p.kill();
    for (const s of live.ports) s.destroy();
    if (live.record.network) await this.links.forget(live.record.pid);
    const work = this.#teardown(id, live.record.layers, !live.layersReleased, () => (live.layersReleased = true));
    this.#busy.set(id, work);
    try {
      await work;
    } catch (err) {
      const why = err instanceof ToolError ? `${err.tool}: ${err.result.stderr.trim()}` : (err as Error).message;
      this.opts.log.error({ sandbox: id, err: why }, 'teardown failed; the sandbox stays listed until a kill succeeds');
      throw new ApiError('SANDBOX_KILL_FAILED', `could not remove everything of sandbox ${id}: ${why}; kill it again to retry`, { id });
    } finally {
      this.#busy.delete(id);
    }
    this.#live.delete(id);
    memoryPeaks.forget(id);
    forgetSpareCgroup(id);
    this.links.release(live.record.network?.link);
  }

  #teardown(id: string, layers: SandboxRecord['layers'], releaseLayers: boolean, onReleased?: () => void): Promise<void> {
    const node = { records: this.records, crun: this.crun, layerMounts: this.layerMounts, uidRanges: this.uidRanges, log: this.opts.log };
    return teardownContainer(node, id, layers, releaseLayers, onReleased);
  }

  #running(id: string): LiveSandbox {
    const l = this.#live.get(id);
    if (!l) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on edge ${this.id}`);
    if (l.killing) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is being killed`, { id });
    return l;
  }

  /**
   * A sandbox a caller's command, file call or port connection may reach: not one held still for
   * a move (quiesceSandbox), whose files are being packed. A call that reaches it then was let
   * through by the control plane just before the move began: refused as retryable, it is sent
   * again once the move is over, to wherever the sandbox is then.
   */
  #serving(id: string): LiveSandbox {
    const l = this.#running(id);
    if (l.quiesced)
      throw new ApiError(
        'SANDBOX_MIGRATING',
        `sandbox ${id} is held still to move to another edge; retry: the call succeeds once it has moved`,
        {
          id,
          retryable: true,
        },
      );
    return l;
  }

  /** How to start processes in a running sandbox from outside: for backends built on containers (FnCall's workers). */
  execTarget(id: string): ExecTarget {
    return this.#running(id).target;
  }

  // --- commands, processes, sessions, terminals (container-commands.ts); files (container-files.ts) ---

  // Commands are counted while their call runs, as file calls are (below): a command still
  // starting is not yet a process a move's quiesce could see.
  readonly exec: SandboxBackend['exec'] = (id, req, signal) => this.#counted(id, () => this.#commands.exec(id, req, signal));
  readonly execStream: SandboxBackend['execStream'] = (id, req, signal) =>
    this.#countedStream(id, () => this.#commands.execStream(id, req, signal));
  readonly startProcess: SandboxBackend['startProcess'] = (id, req) => this.#counted(id, () => this.#commands.startProcess(id, req));
  readonly listProcesses: SandboxBackend['listProcesses'] = (id) => this.#commands.listProcesses(id);
  readonly processOutput: SandboxBackend['processOutput'] = (id, pid, offsets, encoding) =>
    this.#commands.processOutput(id, pid, offsets, encoding);
  readonly waitProcess: SandboxBackend['waitProcess'] = (id, pid, timeoutMs) => this.#commands.waitProcess(id, pid, timeoutMs);
  readonly signalProcess: SandboxBackend['signalProcess'] = (id, pid, signal) => this.#commands.signalProcess(id, pid, signal);
  readonly writeProcessStdin: SandboxBackend['writeProcessStdin'] = (id, pid, data, eof) =>
    this.#commands.writeProcessStdin(id, pid, data, eof);
  readonly openSession: SandboxBackend['openSession'] = (id, req) => this.#commands.openSession(id, req);
  readonly listSessions: SandboxBackend['listSessions'] = (id) => this.#commands.listSessions(id);
  readonly sessionExec: SandboxBackend['sessionExec'] = (id, sid, req, signal) =>
    this.#counted(id, () => this.#commands.sessionExec(id, sid, req, signal));
  readonly closeSession: SandboxBackend['closeSession'] = (id, sid) => this.#commands.closeSession(id, sid);
  readonly openPty: SandboxBackend['openPty'] = (id, req) => this.#counted(id, () => this.#commands.openPty(id, req));

  // File calls are counted while they run: a move's quiesce waits for those in flight (one that
  // wrote after the pack would be lost), and #serving refuses new ones.
  readonly readFile: SandboxBackend['readFile'] = (id, path, maxBytes, opts) =>
    this.#counted(id, () => this.#files.readFile(id, path, maxBytes, opts));
  readonly writeFile: SandboxBackend['writeFile'] = (id, path, data, mode, opts) =>
    this.#counted(id, () => this.#files.writeFile(id, path, data, mode, opts));
  readonly statPath: SandboxBackend['statPath'] = (id, path, opts) => this.#counted(id, () => this.#files.statPath(id, path, opts));
  readonly listDir: SandboxBackend['listDir'] = (id, path, opts) => this.#counted(id, () => this.#files.listDir(id, path, opts));
  readonly makeDir: SandboxBackend['makeDir'] = (id, path, parents, opts) =>
    this.#counted(id, () => this.#files.makeDir(id, path, parents, opts));
  readonly removePath: SandboxBackend['removePath'] = (id, path, recursive, opts) =>
    this.#counted(id, () => this.#files.removePath(id, path, recursive, opts));
  readonly renamePath: SandboxBackend['renamePath'] = (id, from, to, opts) =>
    this.#counted(id, () => this.#files.renamePath(id, from, to, opts));
  readonly uploadTar: SandboxBackend['uploadTar'] = (id, dir, body) => this.#counted(id, () => this.#files.uploadTar(id, dir, body));
  readonly downloadTar: SandboxBackend['downloadTar'] = (id, path) => this.#files.downloadTar(id, path);

  async #counted<T>(id: string, call: () => Promise<T>): Promise<T> {
    const l = this.#serving(id);
    l.calls = (l.calls ?? 0) + 1;
    try {
      return await call();
    } finally {
      l.calls--;
    }
  }

  async *#countedStream<T>(id: string, stream: () => AsyncIterable<T>): AsyncIterable<T> {
    const l = this.#serving(id);
    l.calls = (l.calls ?? 0) + 1;
    try {
      yield* stream();
    } finally {
      l.calls--;
    }
  }

  // --- pause, resume, snapshot ------------------------------------------------------------------

  async sandboxUsage(id: string): Promise<SandboxUsage> {
    const { record } = this.#running(id);
    return containerUsage(id, this.records.paths(id, record).upper, record.network?.link !== undefined);
  }

  /** Pause and resume write no state: after a restart the freezer itself says (see start()). */
  async pauseSandbox(id: string): Promise<void> {
    const l = this.#running(id);
    await freeze(id);
    l.record.paused = true;
  }

  async resumeSandbox(id: string): Promise<void> {
    const l = this.#running(id);
    await thaw(id);
    l.record.paused = false;
    l.quiesced = false; // a move that did not happen
    rmSync(this.records.paths(id, l.record).held, { force: true });
  }

  /** Frozen for a move, its other processes listed or ended (container-quiesce.ts). */
  async quiesceSandbox(id: string, opts: { endProcesses: boolean }): Promise<EdgeQuiesce> {
    const l = this.#running(id);
    return quiesceContainer(l, opts.endProcesses, this.records.paths(id, l.record).held);
  }

  /** pack_diff (container-snapshot.ts). */
  async snapshotSandbox(id: string, opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean } = {}): Promise<EdgeSnapshot> {
    const l = this.#running(id);
    return snapshotContainer(l, opts, { paths: this.records.paths(id, l.record), tmpDir: this.#tmpDir, blobs: this.opts.blobs });
  }

  // --- network (container-network.ts), ports (container-ports.ts) --------------------------------

  /** Replaces the egress policy of a running sandbox; takes effect in one nft transaction. */
  async setNetwork(id: string, req: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    return setNetwork(this.#running(id), req, { links: this.links, records: this.records });
  }

  async getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    return getNetwork(this.#running(id));
  }

  async openPort(id: string, port: number): Promise<Duplex> {
    return this.#ports.open(this.#serving(id), port);
  }

  /**
   * Stops accepting work. Sandboxes keep running (they outlive the edge process and are adopted
   * at the next start) unless `killAll`, which tears every one down and unmounts all layers.
   */
  async shutdown(opts: { killAll?: boolean } = {}): Promise<void> {
    this.#state = 'draining';
    await Promise.allSettled([...this.#busy.values()]);
    // Its namespaces and their ranges' claims: nothing of it outlives the edge. A failure is
    // logged and the stop goes on (the helper, links and the edge id's lock must still be let go);
    // the next start clears what is left in the pool's dir.
    await this.usernsPool
      .close()
      .catch((err: Error) =>
        this.opts.log.error({ err: err.message }, 'could not remove the pooled user namespaces; the next start clears them'),
      );
    this.#freezerPin?.release();
    for (const l of this.#live.values()) l.sessions.flushNotes(); // sandboxes outlive the edge; no note may come after it
    // Nor a process of this edge's waiting in one for a command that will not come.
    for (const l of this.#live.values()) {
      l.sessions.dropStandbys();
      dropExecStandby(l.record.id);
    }
    if (opts.killAll) {
      await Promise.allSettled([...this.#live.keys()].map((id) => this.killSandbox(id)));
      removeEmptyCgroup(CGROUP_PARENT); // other dsec instances may share the parent
    }
    if (this.#live.size === 0) releaseSandboxesDir(this.records.dir);
    await this.layers.close();
    this.#stopStartingTools?.();
    await this.#spawner.close();
    await this.links.close(); // the guard stays while sandboxes (of any backend) that outlive the edge have links
    await this.#ports.close();
    this.#releaseEdgeId?.();
    this.#releaseEdgeId = undefined;
    this.#state = 'stopped';
  }
}
