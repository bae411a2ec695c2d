import { chmodSync, chownSync, closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import type { Socket } from 'node:net';
import { Readable, type Duplex } from 'node:stream';
import { join } from 'node:path';
import type { Logger } from 'pino';
import type {
  FileStat,
  Encoding,
  ExecRequest,
  ExecResult,
  OpenSessionRequest,
  ProcessInfo,
  ProcessOutput,
  SessionExecRequest,
  SessionInfo,
  StartProcessRequest,
} from '@dsec/sdk/schema';
import type { ExecTarget } from './exec/exec-target.js';
import { ProcessTable } from '../shared/process-table.js';
import { ExecJournal } from '../shared/exec-journal.js';
import { SessionTable } from '../shared/session-table.js';
import { killTagged } from './exec/sandbox-process.js';
import { startProcess } from './exec/start-process.js';
import { runCommand, streamCommand } from './exec/run-command.js';
import type { ExecEvent } from '../../protocol/exec-event.js';
import { openContainerSession } from './exec/container-session.js';
import { PtyProcess, type PtyOptions } from './exec/pty-process.js';
import { ApiError } from '../../../api-error.js';
import {
  CGROUP_PARENT,
  cgroupPids,
  cloneCpusetIntoSandboxes,
  killCgroupProcesses,
  listSandboxCgroups,
  removeCgroupTreeSettled,
  removeEmptyCgroup,
  sandboxCgroupDirs,
  sandboxUsage,
  v1Hierarchies,
} from '../../../host/cgroups.js';
import { mountsUnder } from '../../../host/mounts.js';
import type { Link } from '../../../net/address-pool.js';
import { NodeLinks } from '../../../net/node-links.js';
import { NetnsConnectError, NetnsConnector } from '../../../net/netns-connect.js';
import { NodeVolumes } from '../../node/node-volumes.js';
import { volumeMountsError } from '../../protocol/volume-paths.js';
import type { NetworkPolicy } from '../../../net/policy.js';
import { detachLink } from '../../../net/sandbox-network.js';
import { FreezerPin, freeze, thaw } from '../../../host/freezer.js';
import { syncfs } from '../../../host/syscalls.js';
import { DEFAULT_DIFF_LIMITS, DEFAULT_SCRUB, DiffLimitError, type DiffStats } from '../../../image/pack-diff.js';
import { packSnapshotLayer, SNAPSHOT_COPY_TIMEOUT_MS } from '../../node/snapshot-layer.js';
import { DiffCancelledError, stageUpperDiffOffThread } from '../../../image/stage-worker.js';
import { ToolError, startToolsThrough } from '../../../host/run-tool.js';
import type { BlobSource } from '../../node/blob-source.js';
import { EDGE_PROTOCOL_VERSION } from '../../protocol/schemas.js';
import { nodeCapacity } from '../../node/node-capacity.js';
import { DSEC_VERSION } from '../../../version.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import { sandboxRuleset } from '../../../net/policy.js';
import { resolvePolicy } from '../../node/network-request.js';
import { Crun } from './crun.js';
import { ensurePrivateNull } from '../../../host/private-null.js';
import { SpawnHelper } from '../../../host/spawn-helper.js';
import { SPAWN_HELPER_BINARY } from '../../../host/native-helpers.js';
import { createEach } from '../../protocol/create-each.js';
import type { EdgeCreateOutcome } from '../../protocol/edge-api.js';
import type {
  EdgeApi,
  EdgeCreateRequest,
  EdgeInfo,
  EdgeNetworkRequest,
  EdgeSandbox,
  EdgeSnapshot,
  TerminalChannel,
  TerminalRequest,
} from '../../protocol/edge-api.js';
import { DEFAULT_LAYER_CACHE_BYTES, LayerCache } from '../../node/layer-cache.js';
import { LayerMounts, tryUnmount } from '../../node/layer-mounts.js';
import { LazyLayers } from '../../node/lazy/lazy-layers.js';
import { clearDeadDaemonMount, liveDaemonPid, type ChunkSource } from '../../node/lazy/chunk-daemon.js';
import { buildOciConfig, cgroupNames, LANDLOCK_PATH, MASKED_PATHS } from './oci-config.js';
import { existingDirs, prepareMountStubs, type MountStubs } from './mount-stubs.js';
import { unmountSandboxDir } from './sandbox-unmount.js';
import { refreshLandlockBinary } from './helper-binds.js';
import { defaultSeccompProfile } from './seccomp.js';
import { compileSeccompProfile } from './seccomp-bpf.js';
import { mountOverlay } from './overlay.js';
import { makeUserns, mountIdmappedRoot } from './idmapped-root.js';
import { DEFAULT_USERNS_POOL, type PooledUserns, UsernsPool } from './userns-pool.js';
import { UidRangePool, toSandboxId } from '../../../host/uid-ranges.js';
import { releaseSandboxesDir, secureSandboxesDir } from './sandboxes-mount.js';
import { removeTree } from '../../../host/remove-tree.js';
import { lockEdgeId } from '../../../host/host-claims.js';
import { FREE_SPACE_HINT, freeBytes, isDiskFull } from '../../../host/disk-space.js';
import { memoryAdmissionError, type MemoryAdmission } from '../../node/memory-admission.js';
import { mountUpperDisk } from './upper-disk.js';
import {
  type FileOwner,
  isRegularFileInRoot,
  listDirInRoot,
  mkdirInRoot,
  readFileInRoot,
  removeInRoot,
  renameInRoot,
  statInRoot,
  writeFileInRoot,
} from './sandbox-files.js';
import { sandboxPath } from '../shared/sandbox-path.js';
import { extractTar, packTar, removeRecursive } from './exec/sandbox-tar.js';
import { type SandboxRecord, SandboxRecords } from '../../node/sandbox-record.js';

export interface EdgeOptions {
  id: string;
  /** Node-local directory: layer mounts, sandbox dirs, crun state. */
  nodeDir: string;
  /** Where layer blobs come from and snapshot layers go: the local store or the control plane. */
  blobs: BlobSource;
  maxSandboxes: number;
  /** A create is refused (NODE_DISK_FULL) while nodeDir's filesystem has less than this free (bytes); 0 or unset: never. */
  minFreeDiskBytes?: number;
  /** A create is refused (NODE_MEMORY_PRESSURE) while the node's memory is short or thrashing; unset: never. */
  memoryAdmission?: MemoryAdmission;
  /** Budget of the node's layer cache; default DEFAULT_LAYER_CACHE_BYTES. */
  layerCacheBytes?: number;
  /** Whether another backend (VMs) holds a layer, so the cache keeps it. */
  layerInUse?: (digest: LayerDigest) => boolean;
  /**
   * Lazy layers (`--layer-fetch lazy`): layers are mounted from dsec-chunk-fuse, whose chunks come
   * from this blob store on first read, instead of being brought in whole. Unset: eager.
   */
  lazy?: { source: () => ChunkSource; retries?: number; attemptTimeoutMs?: number; connectTimeoutMs?: number };
  /** A sandbox the edge had to end on its own (its lazy layers' daemon died), with why. */
  onSandboxFailed?: (id: string, reason: string) => void;
  /**
   * Run each container sandbox in a user namespace of its own (DSEC_USERNS): its root is a host
   * uid range of its own (host/uid-ranges.ts), not host root; layers and volumes are mounted
   * id-mapped (edge/idmapped-root.ts). Default on; `false` opts out (DSEC_USERNS=false).
   */
  userns?: boolean;
  /**
   * User namespaces kept made ahead for creates (edge/userns-pool.ts; DSEC_USERNS_POOL), each with
   * its uid range claimed; default DEFAULT_USERNS_POOL, 0: none. None without `userns`.
   */
  usernsPool?: number;
  log: Logger;
}

type EdgeState = 'starting' | 'running' | 'draining' | 'stopped';

/**
 * One per node: the final word on admission, and owner of the node's layer mounts and of every
 * sandbox's overlay, cgroups and crun container. All state lives on disk, so a restarted edge
 * adopts running sandboxes and cleans up what a crash left half-made.
 */
export class Edge implements EdgeApi {
  readonly id: string;
  readonly crun: Crun;
  readonly layerCache: LayerCache;
  readonly layerMounts: LayerMounts;
  /** Set in lazy mode: the node's lazy layer store. */
  readonly lazyLayers: LazyLayers | undefined;
  readonly records: SandboxRecords;
  readonly #live = new Map<string, LiveSandbox>();
  /** Ids being created or killed, so a kill waits for a create to finish and vice versa. */
  readonly #busy = new Map<string, Promise<unknown>>();
  #state: EdgeState = 'starting';
  #releaseEdgeId: (() => void) | undefined;
  readonly #ports = new NetnsConnector();
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

  constructor(private readonly opts: EdgeOptions) {
    this.id = opts.id;
    this.links = new NodeLinks(opts.id);
    // 0700: nothing under the node dir is any host user's business but root's (see sandboxes-mount.ts).
    mkdirSync(opts.nodeDir, { recursive: true, mode: 0o700 });
    chmodSync(opts.nodeDir, 0o700);
    this.layerCache = new LayerCache({
      nodeDir: opts.nodeDir,
      source: opts.blobs,
      budgetBytes: opts.layerCacheBytes ?? DEFAULT_LAYER_CACHE_BYTES,
      inUse: (d) => this.layerMounts.inUse(d) || (opts.layerInUse?.(d) ?? false),
      log: opts.log,
    });
    this.lazyLayers = opts.lazy
      ? new LazyLayers({
          nodeDir: opts.nodeDir,
          source: opts.lazy.source,
          budgetBytes: opts.layerCacheBytes ?? DEFAULT_LAYER_CACHE_BYTES,
          otherChargedBytes: () => this.layerCache.stats().chargedBytes,
          inUse: (d) => this.layerMounts.inUse(d),
          onDaemonDeath: (reason) => void this.#lazyLayersLost(reason),
          ...(opts.lazy.retries !== undefined ? { retries: opts.lazy.retries } : {}),
          ...(opts.lazy.attemptTimeoutMs !== undefined ? { attemptTimeoutMs: opts.lazy.attemptTimeoutMs } : {}),
          ...(opts.lazy.connectTimeoutMs !== undefined ? { connectTimeoutMs: opts.lazy.connectTimeoutMs } : {}),
          log: opts.log,
        })
      : undefined;
    this.layerMounts = new LayerMounts(opts.nodeDir, this.lazyLayers ?? this.layerCache);
    this.records = new SandboxRecords(join(opts.nodeDir, 'sandboxes'));
    // crun runs in a copy of the helper's template mount namespace, which leaves out the node's
    // sandboxes and layers (their mounts grow with the node; crun would copy them all per create)
    // and the pooled user namespaces (a copy kept in the template would outlive their removal).
    const usernsPoolDir = join(opts.nodeDir, 'userns-pool');
    // The helper starts, and makes it, at first use: after start()'s mounts and doctor's.
    // Its tools' "null" stdio is dsec's own null node, never the host's /dev/null, which crun
    // would chown to a user-namespaced sandbox's root (host/private-null.ts).
    const privateNull = ensurePrivateNull();
    if (privateNull.path === undefined)
      opts.log.warn(
        { why: privateNull.why },
        "crun gets the host's /dev/null as stdio: with user namespaces, each create makes it owned by that sandbox's root (crun 1.8.1)",
      );
    this.#spawner = new SpawnHelper(SPAWN_HELPER_BINARY, {
      ...(privateNull.path ? { nullDevice: privateNull.path } : {}),
      template: [this.records.dir, this.layerMounts.dir, usernsPoolDir],
      onCarryFailed: (why) =>
        opts.log.warn({ why }, "crun runs in the edge's own mount namespace (a create there costs more as the node fills)"),
    });
    // Without the helper built (scripts/setup not run since it was added), crun is spawned from here as before.
    const spawner = existsSync(SPAWN_HELPER_BINARY) ? this.#spawner : undefined;
    if (!spawner)
      opts.log.warn(
        { binary: SPAWN_HELPER_BINARY },
        'dsec-spawn is not built; crun is started with a fork of the edge (run scripts/setup)',
      );
    this.crun = new Crun(join(opts.nodeDir, 'crun'), spawner);
    if (spawner) this.#stopStartingTools = startToolsThrough(spawner);
    this.volumes = new NodeVolumes(join(opts.nodeDir, 'volumes'));
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

  /** Whether new sandboxes run in a user namespace (EdgeOptions.userns). */
  get userns(): boolean {
    return this.opts.userns !== false;
  }

  get state(): EdgeState {
    return this.#state;
  }

  /** Adopts sandboxes that are still running; removes whatever else a previous run left. */
  async start(): Promise<{ adopted: string[]; cleaned: string[] }> {
    const adopted: string[] = [];
    const cleaned: string[] = [];
    // First: a second edge with this id on this host would take over the first one's sandboxes,
    // host guard table and cgroups. It refuses to start instead (EdgeIdTakenError).
    this.#releaseEdgeId ??= lockEdgeId(this.id);
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
    const lazyDead = this.#deadLazyLayers();
    const failed: { id: string; reason: string }[] = [];
    for (const { id, record } of this.records.scan()) {
      const c = running.get(id);
      running.delete(id);
      const lostLayer = record?.layers.find((l) => lazyDead.has(l));
      if (lostLayer && record?.phase === 'running') {
        failed.push({ id, reason: `its layer ${lostLayer} was served by a lazy layer daemon that died while the edge was down` });
      }
      // A paused sandbox is adopted too (crun reports its frozen cgroup as paused): the kernel's
      // freezer, not state.json, says whether it is paused.
      if (record?.phase === 'running' && !lostLayer && (c?.status === 'running' || c?.status === 'paused')) {
        const live = this.#liveSandbox({ ...record, pid: c.pid, paused: c.status === 'paused' });
        this.#live.set(id, live);
        await this.#endExecsOfOldEdge(live);
        await this.#refreshHelpers(live, c.pid);
        if (record.userns && !this.uidRanges.adopt(id, record.userns)) {
          this.opts.log.error({ sandbox: id, range: record.userns }, "another sandbox on this host claims this sandbox's uid range");
        }
        adopted.push(id);
        continue;
      }
      // A sandbox's leftovers are its own to shape; failing to clean one must not keep the edge
      // (and every other sandbox) down. It stays for the next start or an operator, logged.
      try {
        await this.#teardown(id, record?.layers ?? [], false);
        cleaned.push(id);
      } catch (err) {
        this.opts.log.error(
          { sandbox: id, err: (err as Error).message },
          'could not clean up a dead sandbox; leaving it and starting anyway',
        );
      }
    }
    // Containers in our crun root without a sandbox dir: a crash between crun run and state save.
    for (const id of running.keys()) {
      await this.crun.delete(id);
      await removeCgroupTreeSettled(`${CGROUP_PARENT}/${id}`);
      cleaned.push(id);
    }
    // Cgroups of sandboxes that nothing above accounted for (crun state lost), recognised as this
    // edge's by their processes' root being under this edge's directory.
    for (const cg of listSandboxCgroups()) {
      if (!this.#live.has(cg) && cgroupPids(`${CGROUP_PARENT}/${cg}`).some((pid) => rootOf(pid).startsWith(this.records.dir + '/'))) {
        await killCgroupProcesses(`${CGROUP_PARENT}/${cg}`);
        await removeCgroupTreeSettled(`${CGROUP_PARENT}/${cg}`);
        cleaned.push(cg);
      }
    }
    // Namespaces a previous run made ahead (also with the pool or userns off now): their binds
    // and files go here, their claims with the reconcile below.
    const pooled = this.usernsPool.clearLeftovers();
    if (pooled) this.opts.log.info({ namespaces: pooled }, 'removed the user namespaces a previous run had made ahead');
    // Ranges claimed for sandboxes that are gone (cleaned up above, or never started), or for
    // namespaces made ahead (their holder is never a live sandbox).
    // A sandbox whose clean-up failed above keeps its dir (for the next start): its files are
    // still owned by its range, which must not go to a new sandbox meanwhile.
    this.uidRanges.reconcile((id) => this.#live.has(id) || existsSync(this.records.paths(id).dir));
    this.layerMounts.reconcile([...this.#live.values()].map((l) => l.record.layers));
    this.layerCache.reconcile();
    this.lazyLayers?.reconcile();
    if (!this.lazyLayers && lazyDead.size) clearDeadDaemonMount(join(this.opts.nodeDir, 'lazy'));
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
      const why = err instanceof ToolError ? err.result.stderr.trim() : (err as Error).message;
      throw new Error(
        `edge ${this.id} cannot start: crun cannot list its containers under ${this.crun.root} (${why}); no sandbox was adopted or removed. Fix crun's state and start again`,
      );
    }
  }

  async info(): Promise<EdgeInfo> {
    return {
      id: this.id,
      protocol: EDGE_PROTOCOL_VERSION,
      version: DSEC_VERSION,
      state: this.#state,
      sandboxes: this.#live.size,
      maxSandboxes: this.opts.maxSandboxes,
      capacity: nodeCapacity([...this.#live.values()].map((l) => l.record.limits)),
      layerCache: this.#layerCacheStats(),
      cachedLayers: this.layerCache.digests(),
    };
  }

  /** The eager cache's stats, with the lazy chunk cache counted against the same budget. */
  #layerCacheStats(): EdgeInfo['layerCache'] {
    const eager = this.layerCache.stats();
    if (!this.lazyLayers) return eager;
    const all = this.lazyLayers.stats();
    const lazy = { ...all, sandboxes: all.sandboxes.filter((sb) => this.#live.has(sb.id)) };
    const chargedBytes = eager.chargedBytes + lazy.chunkBytes;
    return { ...eager, bytes: eager.bytes + lazy.chunkBytes, chargedBytes, overBudget: chargedBytes > eager.budgetBytes, lazy };
  }

  /**
   * Lazy layers mounted from a daemon that is gone (found at start): readable no more. Their
   * mounts' source is a file on the lazy mount, and that mount has no live daemon behind it.
   */
  #deadLazyLayers(): Set<LayerDigest> {
    const lazyMount = join(this.opts.nodeDir, 'lazy', 'mnt') + '/';
    const onLazy = mountsUnder(this.layerMounts.dir).filter((m) => m.source.startsWith(lazyMount));
    if (onLazy.length === 0) return new Set();
    if (this.lazyLayers ? this.lazyLayers.daemon.adopt() : liveDaemonPid(join(this.opts.nodeDir, 'lazy')) !== undefined) return new Set();
    return new Set(onLazy.map((m) => `sha256:${m.mountPoint.slice(this.layerMounts.dir.length + 1)}` as LayerDigest));
  }

  /**
   * The lazy layer daemon died: every sandbox on a lazy layer has lost its image (reads fail), so
   * each is ended and reported failed with the reason; its layer mounts go with it, then the dead
   * daemon's own mount. The next create that needs a lazy layer starts a new daemon.
   */
  async #lazyLayersLost(reason: string): Promise<void> {
    const lazy = this.lazyLayers;
    if (!lazy || this.#state === 'stopped') return;
    const lazyLayers = new Set(
      mountsUnder(this.layerMounts.dir)
        .filter((m) => lazy.isLazySource(m.source))
        .map((m) => `sha256:${m.mountPoint.slice(this.layerMounts.dir.length + 1)}`),
    );
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
    if (this.#state !== 'running') throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.id} is ${this.#state}, not accepting sandboxes`);
    if (this.#live.size + this.#busy.size >= this.opts.maxSandboxes) {
      throw new ApiError('CAPACITY_EXCEEDED', `edge ${this.id} is full (${this.opts.maxSandboxes} sandboxes)`, {
        maxSandboxes: this.opts.maxSandboxes,
      });
    }
    const minFree = this.opts.minFreeDiskBytes ?? 0;
    if (minFree > 0) {
      const free = freeBytes(this.opts.nodeDir);
      if (free < minFree) {
        throw new ApiError(
          'NODE_DISK_FULL',
          `edge ${this.id}: ${free >> 20} MiB free under ${this.opts.nodeDir}, below the ${minFree >> 20} MiB a create needs (--min-free-disk-mib); ${FREE_SPACE_HINT}`,
          { edge: this.id, freeMiB: free >> 20, minFreeMiB: minFree >> 20, admission: true },
        );
      }
    }
    const memoryRefusal = this.opts.memoryAdmission && memoryAdmissionError(this.id, this.opts.memoryAdmission);
    if (memoryRefusal) throw memoryRefusal;
    if (this.#live.has(req.id) || this.#busy.has(req.id) || existsSync(this.records.paths(req.id).dir)) {
      throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} already exists on edge ${this.id}`);
    }
    for (const layer of req.layers as LayerDigest[]) {
      if (!this.layerCache.has(layer) && this.opts.blobs.has(layer) === false) {
        throw new ApiError('IMAGE_NOT_FOUND', `layer ${layer} is not in the layer store`, { layer });
      }
    }
    const volumes = req.volumes ?? [];
    const badMount = volumeMountsError(volumes);
    if (badMount) throw new ApiError('INVALID_REQUEST', badMount, { field: 'volumes' });
    for (const v of volumes)
      if (!this.volumes.has(v.name)) throw new ApiError('VOLUME_NOT_FOUND', `no volume ${v.name} on edge ${this.id}`, { name: v.name });
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
      return await this.#createWith(req, network, record, pooled);
    } finally {
      if (pooled) this.usernsPool.done(pooled); // its bind in the pool's dir is removed right after, off this create's path
    }
  }

  /** The create proper; `pooled`: the namespace taken from the pool, its range already this sandbox's. */
  async #createWith(
    req: EdgeCreateRequest,
    network: NetworkPolicy | undefined,
    record: SandboxRecord,
    pooled: PooledUserns | undefined,
  ): Promise<EdgeSandbox> {
    if (this.userns) {
      try {
        record.userns = pooled?.range ?? this.uidRanges.take(req.id);
      } catch (err) {
        throw new ApiError('CAPACITY_EXCEEDED', (err as Error).message);
      }
    }
    const paths = this.records.paths(req.id, record);
    try {
      mkdirSync(paths.dir, { mode: 0o700 });
      // crun sets up the root from inside the user namespace, as the range's root: it must be
      // able to pass through the bundle dir (group: the range's base gid, search only).
      if (record.userns) {
        chownSync(paths.dir, 0, record.userns.base);
        chmodSync(paths.dir, 0o710);
      }
    } catch (err) {
      this.uidRanges.release(req.id);
      throw err;
    }
    mkdirSync(paths.scratch);
    // The record names the range before anything of the sandbox a crash could leave half-made.
    this.records.save(record);
    const acquired: LayerDigest[] = [];
    try {
      const lowers: string[] = [];
      for (const layer of record.layers) {
        lowers.push(await this.layerMounts.acquire(layer));
        acquired.push(layer);
      }
      if (req.limits.diskMiB !== undefined) await mountUpperDisk(paths.dir, req.limits.diskMiB);
      const range = record.userns;
      const volumes = req.volumes ?? [];
      if (range) {
        if (pooled) this.usernsPool.bindTo(pooled, paths.userns);
        else await makeUserns(range, paths.userns, this.crun.spawner);
        mountIdmappedRoot({
          lowersBottomFirst: lowers,
          upper: paths.upper,
          work: paths.work,
          target: paths.rootfs,
          range,
          usernsFile: paths.userns,
          volumes: volumes.map((v, i) => ({ source: this.volumes.dataDir(v.name), dest: paths.volume(i) })),
        });
      } else {
        mountOverlay(lowers, paths.upper, paths.work, paths.rootfs);
      }
      // In a user namespace crun binds each volume from its id-mapped mount in the sandbox dir.
      const binds = volumes.map((v, i) => ({
        source: range ? paths.volume(i) : this.volumes.dataDir(v.name),
        path: v.path,
        readOnly: v.readOnly,
      }));
      const userns = range ? { userns: { path: paths.userns, base: range.base, size: range.size } } : {};
      const cgroupHierarchies = (this.#cgroupHierarchies ??= v1Hierarchies());
      this.#stubs ??= prepareMountStubs(cgroupNames(cgroupHierarchies));
      const stubs = { ...this.#stubs, maskedDirs: existingDirs(MASKED_PATHS) };
      writeFileSync(
        paths.config,
        JSON.stringify(
          buildOciConfig({
            id: req.id,
            config: req.config,
            env: req.env,
            limits: req.limits,
            binds,
            seccompBpf: this.#seccompBpf,
            cgroupHierarchies,
            stubs,
            ...userns,
          }),
        ),
      );
      if (this.#seccompBpf) writeFileSync(paths.seccompBpf, Buffer.from(this.#seccompBpf, 'base64'), { mode: 0o600 });
      record.pid = await this.crun.run(
        req.id,
        paths.dir,
        paths.crunLog,
        paths.pidFile,
        binds.map((b) => b.source),
      );
      if (range) tryUnmount(paths.userns); // the container's processes hold the namespace now
      if (network) await this.#applyNetwork(record, network);
      record.phase = 'running';
      this.records.save(record);
      this.#live.set(req.id, this.#liveSandbox(record));
      return toEdgeSandbox(record);
    } catch (err) {
      await this.#teardown(req.id, acquired, true);
      if (err instanceof ToolError) {
        throw new ApiError('SANDBOX_CREATE_FAILED', `crun could not start the sandbox: ${err.result.stderr.trim()}`, {
          tool: 'crun',
          stderr: err.result.stderr,
        });
      }
      if (isDiskFull(err))
        throw new ApiError(
          'NODE_DISK_FULL',
          `could not create the sandbox, the node's disk is full: ${(err as Error).message}; ${FREE_SPACE_HINT}`,
          { edge: this.id },
        );
      if (err instanceof ApiError) throw err;
      throw new ApiError('SANDBOX_CREATE_FAILED', `could not create the sandbox: ${(err as Error).message}`);
    }
  }

  createSandboxes(reqs: EdgeCreateRequest[]): Promise<EdgeCreateOutcome[]> {
    return createEach((r) => this.createSandbox(r), reqs, 8);
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
    this.links.release(live.record.network?.link);
  }

  /** Removes everything of a sandbox, in reverse order of creation; safe on half-made ones. */
  async #teardown(id: string, layers: SandboxRecord['layers'], releaseLayers: boolean, onReleased?: () => void): Promise<void> {
    const paths = this.records.paths(id);
    await this.crun.delete(id);
    const stray = await killCgroupProcesses(`${CGROUP_PARENT}/${id}`);
    if (stray) this.opts.log.warn({ sandbox: id, killed: stray }, 'killed processes crun no longer tracked');
    const stuck = unmountSandboxDir(paths.dir);
    const left = await removeCgroupTreeSettled(`${CGROUP_PARENT}/${id}`);
    if (left.length) this.opts.log.warn({ sandbox: id, cgroups: left }, 'cgroups still busy after the teardown');
    await detachLink(id); // normally gone with the netns; a crash may leave the host end
    // Never a recursive delete through a mount still there (a volume's data is bound in it).
    if (stuck.length) throw new Error(`still mounted after unmounting: ${stuck.join(', ')}`);
    if (releaseLayers) {
      for (const l of layers) this.layerMounts.release(l);
      onReleased?.(); // a retried teardown must not release them twice
    }
    await removeTree(paths.dir);
    this.uidRanges.release(id); // only once nothing of the sandbox is left: its files are the range's
  }

  #liveSandbox(record: SandboxRecord): LiveSandbox {
    const paths = this.records.paths(record.id);
    // Commands start through dsec-enter when the sandbox's seccomp program is at hand to load into
    // each (a sandbox whose profile crun compiled, or one from before, goes through crun exec).
    const cgroupDirs = record.pid && this.crun.spawner && existsSync(paths.seccompBpf) ? sandboxCgroupDirs(record.id) : [];
    const enter = record.pid && cgroupDirs.length ? { initPid: record.pid, seccompFile: paths.seccompBpf, cgroupDirs } : undefined;
    const target: ExecTarget = {
      crun: this.crun,
      id: record.id,
      scratchDir: paths.scratch,
      rootfs: paths.rootfs,
      config: record.config,
      env: record.env,
      enter,
    };
    const journal = new ExecJournal(join(paths.scratch, 'journal'));
    return {
      record,
      target,
      journal,
      processes: new ProcessTable(record.id, journal),
      sessions: new SessionTable(record.id, journal),
      ptys: new Set(),
      ports: new Set(),
      stop: new AbortController(),
    };
  }

  /**
   * An adopted sandbox's sessions and background processes lived in the edge process that ended:
   * each is reported as ended, with the reason, and what is left of it in the sandbox is killed
   * (a process that lost its output pipes, a session's background jobs).
   */
  async #endExecsOfOldEdge(live: LiveSandbox): Promise<void> {
    live.processes.restore(new Date(), (tag) => killTagged(live.record.id, tag));
    await live.sessions.endNotedByOldEdge((tag) => void killTagged(live.record.id, tag));
  }

  /**
   * An adopted sandbox made by an older build keeps that build's dsec-landlock (helper-binds.ts):
   * the current one is bound over it. When that fails, its commands fail with the reason
   * (ExecTarget.unusable) rather than with the old binary's usage error, and it is logged here.
   */
  async #refreshHelpers(live: LiveSandbox, pid: number): Promise<void> {
    try {
      if (await refreshLandlockBinary(pid, this.crun.spawner)) {
        this.opts.log.info({ sandbox: live.record.id }, "sandbox from an older dsec: its dsec-landlock was replaced with this build's");
      }
    } catch (err) {
      const why = (err as Error).message;
      live.target.unusable = `sandbox ${live.record.id} was made by an older dsec and its command starter (${LANDLOCK_PATH}) could not be replaced with this build's (${why}), so commands cannot run in it: recreate it`;
      this.opts.log.error(
        { sandbox: live.record.id, err: why },
        "could not replace an adopted sandbox's dsec-landlock with this build's; its commands will fail until it is recreated",
      );
    }
  }

  #running(id: string): LiveSandbox {
    const l = this.#live.get(id);
    if (!l) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on edge ${this.id}`);
    if (l.killing) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is being killed`, { id });
    return l;
  }

  /** How to start processes in a running sandbox from outside: for backends built on containers (FnCall's workers). */
  execTarget(id: string): ExecTarget {
    return this.#running(id).target;
  }

  // --- commands ------------------------------------------------------------------------------

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    return runCommand(this.#running(id).target, req, signal);
  }

  execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncIterable<ExecEvent> {
    return streamCommand(this.#running(id).target, req, signal);
  }

  // --- background processes ------------------------------------------------------------------

  async startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    const l = this.#running(id);
    return startProcess(l.processes, l.target, req);
  }

  async listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#running(id).processes.list();
  }

  async processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#running(id).processes.output(pid, offsets, encoding);
  }

  async waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#running(id).processes.wait(pid, timeoutMs);
  }

  async signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const { proc } = this.#running(id).processes.entry(pid);
    await proc.signal(signal);
    if (signal === 'SIGKILL') await proc.done;
    return this.#running(id).processes.info(pid);
  }

  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    const { proc } = this.#running(id).processes.entry(pid);
    if (proc.exit) throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has exited`, { pid });
    if (data.length && !proc.writeStdin(data)) {
      throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has no open stdin (start it with stdin: true)`, { pid });
    }
    if (eof) proc.endStdin();
  }

  // --- sessions ------------------------------------------------------------------------------

  async openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const l = this.#running(id);
    l.sessions.checkRoom();
    return l.sessions.add(openContainerSession(l.target, req));
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    return this.#running(id).sessions.list();
  }

  async sessionExec(
    id: string,
    sid: string,
    req: SessionExecRequest,
    signal?: AbortSignal,
  ): Promise<ExecResult & { sessionAlive: boolean }> {
    return this.#running(id).sessions.exec(sid, req, signal);
  }

  async closeSession(id: string, sid: string): Promise<void> {
    await this.#running(id).sessions.close(sid);
  }

  // --- pause, resume, snapshot ------------------------------------------------------------------

  async sandboxUsage(id: string): Promise<{ oomKills: number; memoryBytes: number; pids: number }> {
    this.#running(id);
    return sandboxUsage(id);
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
  }

  /**
   * pack_diff: freeze, sync, copy the upper dir to a staging tree (overlay-internal xattrs
   * stripped, scrub paths left out), thaw, then build an EROFS layer from the staging tree. The
   * sandbox is frozen only for the copy. Returns no layer when the sandbox changed nothing.
   */
  async snapshotSandbox(id: string, opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean } = {}): Promise<EdgeSnapshot> {
    const l = this.#running(id);
    if (opts.memory)
      throw new ApiError(
        'BACKEND_UNSUPPORTED',
        `sandbox ${id} is a container: its snapshot is an image (memory state is saved for VMs only)`,
        { id },
      );
    // Stopped when the sandbox is killed or the caller goes away: nobody would get the layer.
    const stop = opts.signal ? AbortSignal.any([l.stop.signal, opts.signal]) : l.stop.signal;
    const paths = this.records.paths(id, l.record);
    const stage = mkdtempSync(join(this.#tmpDir, 'snap-'));
    try {
      const wasPaused = l.record.paused === true;
      const t0 = performance.now();
      if (!wasPaused) await freeze(id);
      let stats: DiffStats;
      try {
        const fd = openSync(paths.upper, 'r');
        try {
          syncfs(fd);
        } finally {
          closeSync(fd);
        }
        // Off the event loop, bounded, and stopped if the sandbox is killed meanwhile.
        // A user-namespaced sandbox's files are its range's host ids: the layer gets its own ids.
        stats = await stageUpperDiffOffThread(paths.upper, stage, opts.scrub ?? DEFAULT_SCRUB, DEFAULT_DIFF_LIMITS, {
          timeoutMs: SNAPSHOT_COPY_TIMEOUT_MS,
          signal: stop,
          ids: l.record.userns,
        });
      } catch (err) {
        if (err instanceof DiffLimitError) throw new ApiError('PAYLOAD_TOO_LARGE', err.message, err.details);
        if (err instanceof DiffCancelledError && opts.signal?.aborted && !l.stop.signal.aborted) throw opts.signal.reason;
        if (err instanceof DiffCancelledError)
          throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
        throw err;
      } finally {
        if (!wasPaused) await thaw(id);
      }
      const frozenMs = performance.now() - t0;
      if (stats.entries === 0) return { layer: null, stats, frozenMs, baseLayers: l.record.layers, config: l.record.config };
      const layer = await packSnapshotLayer(id, stage, {
        tmpDir: this.#tmpDir,
        blobs: this.opts.blobs,
        sparse: stats.sparseFiles > 0,
        killed: l.stop.signal,
        cancelled: opts.signal,
      });
      return { layer, stats, frozenMs, baseLayers: l.record.layers, config: l.record.config };
    } finally {
      await removeTree(stage);
    }
  }

  // --- network -------------------------------------------------------------------------------

  /** Replaces the egress policy of a running sandbox; takes effect in one nft transaction. */
  async setNetwork(id: string, req: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    const l = this.#running(id);
    const policy = await resolvePolicy(req);
    const t0 = performance.now();
    await this.#applyNetwork(l.record, policy);
    this.records.save(l.record);
    const out: { policy: NetworkPolicy; link?: Link; appliedMs: number } = {
      policy,
      appliedMs: Math.round((performance.now() - t0) * 100) / 100,
    };
    if (l.record.network?.link) out.link = l.record.network.link;
    return out;
  }

  async getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    const { network } = this.#running(id).record;
    const out: { policy: NetworkPolicy; link?: Link } = { policy: network?.policy ?? { mode: 'none', allow: [] } };
    if (network?.link) out.link = network.link;
    return out;
  }

  /** See NodeLinks.apply: the link on first use, then one nft transaction per switch. */
  async #applyNetwork(record: SandboxRecord, policy: NetworkPolicy): Promise<void> {
    record.network = await this.links.apply(record.id, record.pid ?? 0, record.network, policy, sandboxRuleset);
  }

  // --- terminals ---------------------------------------------------------------------------

  async openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    const l = this.#running(id);
    const cmd = req.cmd?.length ? req.cmd : [isRegularFileInRoot(l.target.rootfs, '/bin/bash') ? '/bin/bash' : '/bin/sh'];
    const opts: PtyOptions = { cmd, cols: req.cols, rows: req.rows };
    if (req.cwd !== undefined) opts.cwd = req.cwd;
    if (req.env !== undefined) opts.env = req.env;
    const p = new PtyProcess(l.target, opts);
    l.ptys.add(p);
    void p.exit.then(() => l.ptys.delete(p));
    return {
      exit: p.exit,
      onData: (listener) => p.onData((s) => listener(Buffer.from(s, 'utf8'))),
      write: (data) => p.write(data),
      resize: (cols, rows) => p.resize(cols, rows),
      kill: () => p.kill(),
    };
  }

  // --- volumes -------------------------------------------------------------------------------

  async createVolume(name: string): Promise<void> {
    this.volumes.create(name);
  }

  async deleteVolume(name: string): Promise<void> {
    const users = [...this.#live.values()].filter((l) => l.record.volumes?.some((v) => v.name === name)).map((l) => l.record.id);
    for (const [id, names] of this.#mountingVolumes) if (names.includes(name)) users.push(id);
    if (users.length)
      throw new ApiError('VOLUME_IN_USE', `volume ${name} is mounted by ${users.join(', ')}: kill them first`, { name, sandboxes: users });
    await this.volumes.remove(name);
  }

  async volumeUsage(name: string): Promise<{ bytes: number }> {
    return { bytes: await this.volumes.bytes(name) };
  }

  // --- ports ---------------------------------------------------------------------------------

  async openPort(id: string, port: number): Promise<Duplex> {
    const l = this.#running(id);
    if (l.record.paused)
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is paused: nothing in it can answer on port ${port}; resume it first`, {
        id,
        status: 'paused',
      });
    let socket: Socket;
    try {
      socket = await this.#ports.connect(l.record.pid ?? 0, `${CGROUP_PARENT}/${id}`, port);
    } catch (err) {
      if (!(err instanceof NetnsConnectError)) throw err;
      if (err.code === 'ECONNREFUSED' || err.code === 'ETIMEDOUT') throw new ApiError('PORT_NOT_LISTENING', err.message, { id, port });
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id}: ${err.message}`, { id });
    }
    // A kill ends the sandbox's connections with it, rather than leaving them to the kernel.
    l.ports.add(socket);
    socket.once('close', () => l.ports.delete(socket));
    return socket;
  }

  // --- files ---------------------------------------------------------------------------------

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    const l = this.#running(id);
    return readFileInRoot(l.target.rootfs, sandboxPath(path, l.record.config.cwd), maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    const l = this.#running(id);
    return writeFileInRoot(l.target.rootfs, sandboxPath(path, l.record.config.cwd), data, mode, ownerOf(l.record));
  }

  #path(id: string, path: string): { l: LiveSandbox; p: string } {
    const l = this.#running(id);
    return { l, p: sandboxPath(path, l.record.config.cwd) };
  }

  async statPath(id: string, path: string): Promise<FileStat> {
    const { l, p } = this.#path(id, path);
    return asSeenInside(l.record, statInRoot(l.target.rootfs, p));
  }

  async listDir(id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }> {
    const { l, p } = this.#path(id, path);
    const out = listDirInRoot(l.target.rootfs, p);
    return { ...out, entries: out.entries.map((e) => asSeenInside(l.record, e)) };
  }

  async makeDir(id: string, path: string, parents: boolean): Promise<void> {
    const { l, p } = this.#path(id, path);
    mkdirInRoot(l.target.rootfs, p, parents, undefined, ownerOf(l.record));
  }

  async removePath(id: string, path: string, recursive: boolean): Promise<void> {
    const { l, p } = this.#path(id, path);
    const st = statInRoot(l.target.rootfs, p); // 404 for a missing path, either way
    if (recursive && st.type === 'dir') await removeRecursive(l.target, p);
    else removeInRoot(l.target.rootfs, p);
  }

  async renamePath(id: string, from: string, to: string): Promise<void> {
    const { l, p } = this.#path(id, from);
    renameInRoot(l.target.rootfs, p, sandboxPath(to, l.record.config.cwd));
  }

  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const { l, p } = this.#path(id, dir);
    mkdirInRoot(l.target.rootfs, p, true, undefined, ownerOf(l.record));
    return extractTar(l.target, p, Readable.from(body));
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const { l, p } = this.#path(id, path);
    statInRoot(l.target.rootfs, p);
    return packTar(l.target, p);
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
    if (opts.killAll) {
      await Promise.allSettled([...this.#live.keys()].map((id) => this.killSandbox(id)));
      removeEmptyCgroup(CGROUP_PARENT); // other dsec instances may share the parent
    }
    if (this.#live.size === 0) releaseSandboxesDir(this.records.dir);
    // The lazy layer daemon outlives the edge while sandboxes read from it (the next edge adopts it).
    if (this.lazyLayers && this.layerMounts.mounted().length === 0) await this.lazyLayers.stop();
    else this.lazyLayers?.detach();
    this.#stopStartingTools?.();
    await this.#spawner.close();
    await this.links.close(); // the guard stays while sandboxes (of any backend) that outlive the edge have links
    await this.#ports.close();
    this.#releaseEdgeId?.();
    this.#releaseEdgeId = undefined;
    this.#state = 'stopped';
  }
}

/** A running sandbox as the edge holds it in memory: its record and its exec engine state. */
interface LiveSandbox {
  record: SandboxRecord;
  target: ExecTarget;
  processes: ProcessTable;
  /** Where its sessions and processes are noted, so a restarted edge reports them (exec-journal.ts). */
  journal: ExecJournal;
  /** Open sessions, and those a restart ended (listed until closed). */
  sessions: SessionTable;
  ptys: Set<PtyProcess>;
  /** Open connections to the sandbox's ports (openPort). */
  ports: Set<Socket>;
  /** Set once a kill started: no new work; the sandbox stays here until its teardown succeeds. */
  killing?: boolean;
  /** Aborted when a kill starts: stops work in flight on the sandbox (a snapshot's copy). */
  stop: AbortController;
  layersReleased?: boolean;
}

/**
 * The overlay upper dir of a process's root filesystem ('' when unreadable). /proc/<pid>/root
 * reads as "/" for a process in another mount namespace, but its mountinfo names the upper dir.
 */
function rootOf(pid: number): string {
  try {
    const line = readFileSync(`/proc/${pid}/mountinfo`, 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === '/');
    return /upperdir=([^,\s]+)/.exec(line ?? '')?.[1] ?? '';
  } catch {
    return '';
  }
}

/** What the files API creates belongs to the sandbox's root: its range's base in a user namespace. */
function ownerOf(r: SandboxRecord): FileOwner | undefined {
  return r.userns ? { uid: r.userns.base, gid: r.userns.base } : undefined;
}

/** A stat's owner as the sandbox sees it (its own ids, not the host's). */
function asSeenInside(r: SandboxRecord, st: FileStat): FileStat {
  return r.userns ? { ...st, uid: toSandboxId(r.userns, st.uid), gid: toSandboxId(r.userns, st.gid) } : st;
}

function toEdgeSandbox(r: SandboxRecord): EdgeSandbox {
  return { id: r.id, status: r.paused ? 'paused' : 'running', pid: r.pid ?? 0, createdAt: r.createdAt };
}
