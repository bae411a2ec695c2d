import type { Duplex } from 'node:stream';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import {
  DEFAULT_EXEC_TIMEOUT_MS,
  DEFAULT_MAX_OUTPUT_BYTES,
  type Encoding,
  type ExecRequest,
  type ExecResult,
  type FileStat,
  type OpenSessionRequest,
  type ProcessInfo,
  type ProcessOutput,
  type SessionExecRequest,
  type SessionInfo,
  type StartProcessRequest,
} from '@dsec/sdk/schema';
import { ApiError } from '../../../api-error.js';
import { ExecJournal } from '../shared/exec-journal.js';
import { SessionTable } from '../shared/session-table.js';
import { rejectNul } from '../../protocol/reject-nul.js';
import { ProcessTable } from '../shared/process-table.js';
import { ShellSession } from '../shared/shell-session.js';
import { iterateOutput } from '../shared/output-stream.js';
import { tarCreateArgs, tarOutput } from '../container/exec/sandbox-tar.js';
import type { ExecEvent } from '../../protocol/exec-event.js';
import type { ProcessExit } from '../shared/command-process.js';
import { sandboxUsage } from '../../../host/cgroups.js';
import { removeTree } from '../../../host/remove-tree.js';
import { runToolOrThrow, ToolError } from '../../../host/run-tool.js';
import { DEFAULT_DIFF_LIMITS, DEFAULT_SCRUB, DiffLimitError } from '../../../image/pack-diff.js';
import { TarFormatError } from '../../../image/oci/tar-reader.js';
import { UnsafeArchiveError } from '../../../image/oci/safe-extract.js';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { Link } from '../../../net/address-pool.js';
import type { NodeLinks, SandboxNetwork } from '../../../net/node-links.js';
import { vmRuleset, type NetworkPolicy } from '../../../net/policy.js';
import { detachLink } from '../../../net/sandbox-network.js';
import { prepareVmNetns } from '../../../net/vm-network.js';
import { resolvePolicy } from '../../node/network-request.js';
import type {
  EdgeCreateRequest,
  EdgeNetworkRequest,
  EdgeSandbox,
  EdgeSnapshot,
  SandboxLimits,
  TerminalChannel,
  TerminalRequest,
} from '../../protocol/edge-api.js';
import type { BlobSource } from '../../node/blob-source.js';
import type { LayerCache } from '../../node/layer-cache.js';
import { packSnapshotLayer, SNAPSHOT_COPY_TIMEOUT_MS } from '../../node/snapshot-layer.js';
import { mergeEnv, parseUser } from '../shared/user-env.js';
import { sandboxPath } from '../shared/sandbox-path.js';
import { unsupported, type BackendKind, type SandboxBackend } from '../backend.js';
import { AgentClient, AgentError, newAgentKey } from './agent-client.js';
import { chooseAccel, type AccelChoice } from './accel-probe.js';
import { guestAssets, type GuestAssets } from './guest-assets.js';
import { isQemuOf, launchQemu, VmPaths, type VmMachine } from './qemu-launch.js';
import { QmpClient } from './qmp-client.js';
import { VmProcess, type GuestCommand } from './vm-process.js';
import { makeVmCgroup, removeVmCgroup, VM_MEMORY_OVERHEAD_MIB } from './vm-cgroup.js';
import { loadVmState, saveVmState } from './vm-state.js';
import { openGuestPort } from './vm-port.js';
import { checkWritablePaths, vmSessionHost } from './vm-session.js';
import { openVmTerminal } from './vm-terminal.js';
import { GuestDiffError, stageGuestUpper } from './vm-disk-diff.js';
import type { ImageConfig } from '@dsec/sdk/schema';

/** Size of a VM's writable disk when the request sets no diskMiB (sparse: unused space costs nothing). */
export const DEFAULT_VM_DISK_MIB = 2048;
/**
 * VM sandboxes a node takes at most: DSEC_MAX_VMS, else 4 per CPU (an idle guest's timer ticks
 * still cost host CPU under TCG; the sandbox budget, maxSandboxes, holds as well).
 */
export function maxVms(): number {
  const env = Number(process.env['DSEC_MAX_VMS']);
  return Number.isInteger(env) && env > 0 ? env : 4 * availableParallelism();
}
/** How long a guest may take from QEMU's start to the agent's ready (TCG on a loaded host is slow). */
const BOOT_TIMEOUT_MS = Number(process.env['DSEC_VM_BOOT_TIMEOUT_MS'] ?? 180_000);

/** A VM as the edge remembers it on disk (`node/vms/<id>/state.json`), to adopt or clean it up. */
interface VmRecord {
  id: string;
  backend: Exclude<BackendKind, 'container'>;
  phase: 'creating' | 'running';
  layers: LayerDigest[];
  config: ImageConfig;
  env: Record<string, string>;
  limits: SandboxLimits;
  createdAt: string;
  accel?: AccelChoice;
  pid?: number;
  paused?: boolean;
  /** The egress policy in force in the VM's netns, and its link once a policy other than none gave it one. */
  network?: SandboxNetwork;
  /**
   * The key of the VM's agent channel (hex; AgentClient): every frame the guest agent writes
   * carries its MAC. Given to the guest right after it boots; a restore keeps its source's.
   * Records written before keys have none, and such a VM is not adopted.
   */
  agentKey?: string;
}

interface LiveVm {
  record: VmRecord;
  paths: VmPaths;
  agent: AgentClient;
  qmp: QmpClient;
  processes: ProcessTable;
  terminals: Set<TerminalChannel>;
  /** Open sessions, and those an edge restart ended (listed until closed). */
  sessions: SessionTable;
  /** Where its sessions are noted (in the VM's directory), so a restarted edge reports them ended. */
  journal: ExecJournal;
  /** Open connections to the guest's ports (openPort), ended with the VM. */
  ports: Set<Duplex>;
  /** Aborted when a kill starts: stops a snapshot's read of the guest's disk. */
  stop: AbortController;
  /** A snapshot reading the guest's disk (frozen meanwhile): file writes and other snapshots wait for it. */
  diffing?: Promise<unknown> | undefined;
}

export interface VmBackendOptions {
  nodeDir: string;
  layerCache: LayerCache;
  /** The node's sandbox links, shared with the container edge. */
  links: NodeLinks;
  /** Where snapshot layers go (the edge's blob source). */
  blobs: BlobSource;
  log: Logger;
}

/**
 * microVM and VM sandboxes: one QEMU process each, booting Debian's kernel with the dsec guest
 * agent as PID 1; the image's EROFS layers are read-only virtio-blk disks, the writable layer an
 * ext4 disk of its own, composed with overlayfs inside the guest. Every call goes to the agent
 * over the VM's virtio-serial port. QEMU runs detached, so an edge restart adopts running VMs.
 */
export class VmBackend implements SandboxBackend {
  readonly dir: string;
  readonly guest: GuestAssets;
  readonly #live = new Map<string, LiveVm>();
  /** Creates in flight, so a kill of one waits for it to finish (or fail) first. */
  readonly #creating = new Map<string, Promise<unknown>>();
  /** The limits of creates in flight: their memory is committed from the start. */
  readonly #creatingLimits = new Map<string, SandboxLimits>();
  readonly slots = maxVms();
  #accel: Promise<AccelChoice> | undefined;

  constructor(
    private readonly opts: VmBackendOptions,
    guest: GuestAssets,
  ) {
    this.guest = guest;
    this.dir = join(opts.nodeDir, 'vms');
    mkdirSync(this.dir, { recursive: true });
  }

  /** A backend when the guest was built, else undefined and why (VM creates are then refused). */
  static create(opts: VmBackendOptions): { backend?: VmBackend; missing?: string } {
    const g = guestAssets();
    if ('missing' in g) return { missing: g.missing };
    return { backend: new VmBackend(opts, g) };
  }

  get count(): number {
    return this.#live.size + this.#creating.size;
  }

  /** What placement needs to know (capacity.vms): slots, VMs, and the host memory they are allowed. */
  capacity(): { slots: number; running: number; memoryCommittedMiB: number; overheadMiB: number; cpuCommitted: number } {
    const limits = [...[...this.#live.values()].map((v) => v.record.limits), ...this.#creatingLimits.values()];
    return {
      slots: this.slots,
      running: limits.length,
      memoryCommittedMiB: limits.reduce((n, l) => n + l.memoryMiB + VM_MEMORY_OVERHEAD_MIB, 0),
      overheadMiB: VM_MEMORY_OVERHEAD_MIB,
      cpuCommitted: limits.reduce((n, l) => n + l.cpu, 0),
    };
  }

  owns(id: string): boolean {
    return this.#live.has(id) || this.#creating.has(id);
  }

  /** Whether a VM holds this layer (the layer cache must not evict a disk QEMU has open). */
  layerInUse(digest: LayerDigest): boolean {
    for (const v of this.#live.values()) if (v.record.layers.includes(digest)) return true;
    return false;
  }

  accel(): Promise<AccelChoice> {
    this.#accel ??= chooseAccel(this.guest);
    return this.#accel;
  }

  /** Adopts VMs whose QEMU still runs; removes whatever else a previous run left. */
  async start(): Promise<{ adopted: string[]; cleaned: string[] }> {
    const adopted: string[] = [];
    const cleaned: string[] = [];
    for (const id of readdirSync(this.dir)) {
      const paths = new VmPaths(join(this.dir, id));
      const record = readRecord(paths);
      if (record?.phase === 'running' && record.pid && isQemuOf(record.pid, paths, { adopting: true })) {
        try {
          if (!record.agentKey) throw new Error('its record predates keyed agent channels');
          const agent = await AgentClient.open(paths.agentSocket, record.agentKey);
          await agent.call('ping', {});
          const qmp = await QmpClient.open(paths.qmpSocket);
          const status = (await qmp.execute('query-status')) as { status?: string };
          record.paused = status.status === 'paused';
          if (record.network?.link && !this.opts.links.adopt(record.network.link)) {
            this.opts.log.error({ sandbox: id, link: record.network.link }, "another edge on this host claims this VM's link block");
          }
          await this.#endSessionsOfOldEdge(this.#adopt(record, paths, agent, qmp));
          adopted.push(id);
          continue;
        } catch (err) {
          this.opts.log.warn({ sandbox: id, err: (err as Error).message }, 'could not reattach to a VM; removing it');
        }
      }
      await this.#teardown(id, record?.pid);
      cleaned.push(id);
    }
    if (adopted.length || cleaned.length) this.opts.log.info({ adopted, cleaned }, 'VM backend reconciled VMs from disk');
    return { adopted, cleaned };
  }

  #adopt(record: VmRecord, paths: VmPaths, agent: AgentClient, qmp: QmpClient): LiveVm {
    const journal = new ExecJournal(join(paths.dir, 'journal'));
    const live: LiveVm = {
      record,
      paths,
      agent,
      qmp,
      processes: new ProcessTable(record.id),
      terminals: new Set(),
      sessions: new SessionTable(record.id, journal),
      journal,
      ports: new Set(),
      stop: new AbortController(),
    };
    this.#live.set(record.id, live);
    agent.onRefused((reason) => this.opts.log.error({ sandbox: record.id, reason }, "refused a frame on a VM's agent channel"));
    agent.onClose((err) => {
      if (this.#live.get(record.id) === live) this.opts.log.warn({ sandbox: record.id, err: err.message }, 'VM agent channel closed');
    });
    return live;
  }

  /**
   * An adopted VM's sessions lived in the edge process that ended (their state with it): each is
   * reported ended, with the reason, and the jobs its commands left in the guest are killed (its
   * guest cgroup), as for a container (exec/exec-journal.ts).
   */
  async #endSessionsOfOldEdge(v: LiveVm): Promise<void> {
    await v.sessions.endNotedByOldEdge(async (tag) => {
      await v.agent.call('kill_group', { group: tag }).catch(() => undefined);
    });
  }

  async listSandboxes(): Promise<EdgeSandbox[]> {
    return [...this.#live.values()].map((v) => toEdgeSandbox(v.record));
  }

  async createSandbox(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    if (this.owns(req.id)) throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} already exists`);
    if (req.volumes?.length) unsupported(req.backend ?? 'vm', 'Volumes');
    if (this.count >= this.slots) {
      throw new ApiError('CAPACITY_EXCEEDED', `this edge runs at most ${this.slots} VM sandboxes (DSEC_MAX_VMS) and has ${this.count}`, {
        maxVms: this.slots,
      });
    }
    const work = this.#create(req);
    this.#creating.set(req.id, work);
    this.#creatingLimits.set(req.id, req.limits);
    try {
      return await work;
    } finally {
      this.#creating.delete(req.id);
      this.#creatingLimits.delete(req.id);
    }
  }

  async #create(req: EdgeCreateRequest): Promise<EdgeSandbox> {
    const kind = req.backend;
    if (kind !== 'microvm' && kind !== 'vm') throw new ApiError('INTERNAL', `VM backend asked for a ${String(kind)} sandbox`);
    // Host names are resolved here, on the node that enforces the rules.
    const policy: NetworkPolicy = req.network ? await resolvePolicy(req.network) : { mode: 'none', allow: [] };
    if (req.layers.length === 0) throw new ApiError('INVALID_REQUEST', 'a VM sandbox needs at least one layer');
    if (req.layers.length > 60)
      throw new ApiError('INVALID_REQUEST', `a VM sandbox takes at most 60 layers (one disk each); this one has ${req.layers.length}`);
    const paths = new VmPaths(join(this.dir, req.id));
    if (this.#live.has(req.id) || existsSync(paths.dir)) throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} already exists`);
    // A restore takes everything the guest was made with from the snapshot: its RAM size and
    // vCPUs must match the saved state, its disks the saved disk.
    const source = req.restoreFrom === undefined ? undefined : this.#snapshotOf(req.restoreFrom);
    // The restored guest's agent has its source's channel key in its memory.
    const made = source?.record ?? {
      backend: kind,
      layers: req.layers as LayerDigest[],
      config: req.config,
      env: req.env,
      limits: req.limits,
      agentKey: newAgentKey(),
    };
    const agentKey = made.agentKey;
    if (!agentKey)
      throw new ApiError('INVALID_REQUEST', `the snapshot of ${req.restoreFrom} predates keyed agent channels; snapshot the VM again`, {
        restoreFrom: req.restoreFrom,
      });
    const record: VmRecord = { id: req.id, phase: 'creating', ...made, createdAt: new Date().toISOString() };
    mkdirSync(paths.dir, { mode: 0o700 });
    saveRecord(paths, record);
    let agent: AgentClient | undefined;
    try {
      const layerFiles: string[] = [];
      for (const l of record.layers) layerFiles.push(await this.opts.layerCache.ensure(l));
      if (source) await copySparse(source.paths.snapshotDisk, paths.disk);
      else await makeDisk(paths.disk, record.limits.diskMiB ?? DEFAULT_VM_DISK_MIB);
      record.accel = await this.accel();
      const cgroupProcs = makeVmCgroup(req.id, record.limits);
      const pid = launchQemu({
        machine: record.backend as VmMachine,
        accel: record.accel.accel,
        guest: this.guest,
        paths,
        layers: layerFiles,
        vcpus: Math.max(1, Math.ceil(record.limits.cpu)),
        memoryMiB: record.limits.memoryMiB,
        cgroupProcs,
        ...(source ? { incoming: paths.migrationSocket } : {}),
      });
      record.pid = pid;
      saveRecord(paths, record);
      let qmp: QmpClient;
      if (source) {
        qmp = await loadVmState(
          paths.migrationSocket,
          source.paths.snapshotMemory,
          () => QmpClient.open(paths.qmpSocket),
          () => isQemuOf(pid, paths),
        );
        agent = await this.#reconnect(paths, agentKey).catch((err: Error) => {
          qmp.close();
          throw err;
        });
      } else {
        agent = await this.#boot(pid, paths, record.limits.memoryMiB, agentKey);
        qmp = await QmpClient.open(paths.qmpSocket);
      }
      await prepareVmNetns(pid);
      record.network = await this.opts.links.apply(req.id, pid, undefined, policy, vmRuleset);
      record.phase = 'running';
      saveRecord(paths, record);
      this.#adopt(record, paths, agent, qmp);
      return toEdgeSandbox(record);
    } catch (err) {
      agent?.close();
      await this.#teardown(req.id, record.pid);
      this.opts.links.release(record.network?.link);
      if (err instanceof ApiError) throw err;
      if (err instanceof ToolError)
        throw new ApiError('SANDBOX_CREATE_FAILED', `could not make the VM's disk: ${err.result.stderr.trim()}`, { tool: err.tool });
      throw new ApiError('SANDBOX_CREATE_FAILED', `the ${kind} did not start: ${(err as Error).message}`);
    }
  }

  /** The agent of a restored guest: it runs already (no ready event comes) and has its key, so it is pinged. */
  async #reconnect(paths: VmPaths, agentKey: string): Promise<AgentClient> {
    const agent = await AgentClient.open(paths.agentSocket, agentKey);
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        agent.call('ping', {}),
        new Promise<never>(
          (_, reject) => (timer = setTimeout(() => reject(new Error("the restored guest's agent did not answer within 60 s")), 60_000)),
        ),
      ]);
      return agent;
    } catch (err) {
      agent.close();
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  /** The latest snapshot of VM `id` on this edge, to restore from. */
  #snapshotOf(id: string): { paths: VmPaths; record: SnapshotRecord } {
    const v = this.#live.get(id);
    const record = v && readJson<SnapshotRecord>(v.paths.snapshotRecord);
    if (!v || !record) {
      throw new ApiError(
        'INVALID_REQUEST',
        `no VM snapshot of sandbox ${id} on this edge (a VM's snapshot lives on its edge until the VM is killed)`,
        { restoreFrom: id },
      );
    }
    return { paths: v.paths, record };
  }

  /**
   * Connects to the agent's socket once QEMU has made it, waits for the guest's ready and gives
   * it the channel's key (before any command can run in the guest).
   */
  async #boot(pid: number, paths: VmPaths, memoryMiB: number, agentKey: string): Promise<AgentClient> {
    const deadline = Date.now() + BOOT_TIMEOUT_MS;
    const dead = (): Error =>
      new Error(
        `QEMU exited during boot: ${tail(paths.qemuLog) || '(no QEMU output)'}; guest console: ${
          tail(paths.console) ||
          `(empty: the guest kernel stopped before its console; with ${memoryMiB} MiB of guest RAM, too little memory is the usual cause)`
        }`,
      );
    let agent: AgentClient | undefined;
    while (!agent) {
      if (!isQemuOf(pid, paths)) throw dead();
      if (Date.now() > deadline) throw new Error(`QEMU made no agent socket within ${BOOT_TIMEOUT_MS} ms`);
      if (existsSync(paths.agentSocket)) agent = await AgentClient.open(paths.agentSocket).catch(() => undefined);
      if (!agent) await sleep(20);
    }
    let timer: NodeJS.Timeout | undefined;
    const watch = new Promise<never>((_, reject) => {
      const check = (): void => {
        if (!isQemuOf(pid, paths)) return reject(dead());
        if (Date.now() > deadline)
          return reject(new Error(`the guest was not ready within ${BOOT_TIMEOUT_MS} ms; console: ${tail(paths.console) || '(empty)'}`));
        timer = setTimeout(check, 100);
      };
      timer = setTimeout(check, 100);
    });
    try {
      const booted = agent;
      await Promise.race([booted.ready().then(() => booted.giveKey(agentKey)), watch]);
      return booted;
    } catch (err) {
      agent.close();
      // The channel closes when QEMU exits (a guest that panicked or powered off): say why,
      // from QEMU's own output and the guest's console, rather than "channel closed".
      for (let i = 0; i < 40 && isQemuOf(pid, paths); i++) await sleep(25);
      if (!isQemuOf(pid, paths)) throw dead();
      throw err;
    } finally {
      clearTimeout(timer);
    }
  }

  async killSandbox(id: string): Promise<void> {
    await this.#creating.get(id)?.catch(() => undefined);
    const v = this.#live.get(id);
    if (!v) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this edge`);
    this.#live.delete(id);
    v.stop.abort();
    v.processes.killAll();
    for (const t of v.terminals) t.kill();
    v.sessions.closeAll();
    for (const p of v.ports) p.destroy();
    v.agent.close();
    await v.qmp.execute('quit').catch(() => undefined);
    v.qmp.close();
    await this.#teardown(id, v.record.pid);
    this.opts.links.release(v.record.network?.link);
  }

  /** Ends QEMU (if it still runs) and removes the VM's directory: disk, sockets, logs. */
  async #teardown(id: string, pid: number | undefined): Promise<void> {
    const paths = new VmPaths(join(this.dir, id));
    if (pid) {
      for (let i = 0; i < 100 && isQemuOf(pid, paths); i++) {
        if (i === 20 || i === 0) {
          try {
            process.kill(pid, i === 0 ? 'SIGTERM' : 'SIGKILL');
          } catch {
            // gone
          }
        }
        await sleep(25);
      }
      if (isQemuOf(pid, paths)) this.opts.log.error({ sandbox: id, pid }, 'QEMU did not exit after SIGKILL');
    }
    await removeVmCgroup(id);
    await detachLink(id); // gone with QEMU's netns; a crash between veth and netns may leave the host end
    rmSync(paths.dir, { recursive: true, force: true });
  }

  async shutdown(opts: { killAll?: boolean } = {}): Promise<void> {
    await Promise.allSettled([...this.#creating.values()]);
    if (opts.killAll) await Promise.allSettled([...this.#live.keys()].map((id) => this.killSandbox(id)));
    for (const v of this.#live.values()) {
      v.agent.close();
      v.qmp.close();
    }
    this.#live.clear();
  }

  #running(id: string): LiveVm {
    const v = this.#live.get(id);
    if (!v) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this edge`);
    if (v.record.paused) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is paused; resume it first`, { status: 'paused' });
    if (v.agent.closed) throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} is gone: ${v.agent.closed.message}`);
    return v;
  }

  // --- commands ------------------------------------------------------------------------------

  /**
   * argv, env, cwd and user of a command in the guest, as for a container's. With writablePaths
   * the agent confines it with the guest kernel's Landlock (`rw`; checkWritablePaths first).
   */
  #command(
    v: LiveVm,
    cmd: string | string[],
    opts: { cwd?: string | undefined; env?: Record<string, string> | undefined; writablePaths?: string[] | undefined },
  ): GuestCommand {
    rejectNul('cmd', typeof cmd === 'string' ? [cmd] : cmd);
    rejectNul('env', Object.entries(opts.env ?? {}).flat());
    if (opts.cwd !== undefined) rejectNul('cwd', [opts.cwd]);
    const user = parseUser(v.record.config.user);
    return {
      argv: typeof cmd === 'string' ? ['/bin/sh', '-c', cmd] : cmd,
      env: mergeEnv(v.record.config.env, v.record.env, opts.env ?? {}),
      cwd: opts.cwd ?? v.record.config.cwd,
      uid: user.uid,
      gid: user.gid,
      ...(opts.writablePaths ? { rw: opts.writablePaths } : {}),
    };
  }

  #start(id: string, req: ExecRequest, signal?: AbortSignal): VmProcess {
    const v = this.#running(id);
    const proc = new VmProcess(v.agent, this.#command(v, req.cmd, req), {
      input: req.stdin === undefined ? undefined : Buffer.from(req.stdin, req.stdinEncoding ?? 'utf8'),
      maxOutputBytes: req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES,
      timeoutMs: req.timeoutMs ?? DEFAULT_EXEC_TIMEOUT_MS,
    });
    if (signal?.aborted) proc.kill();
    else signal?.addEventListener('abort', () => proc.kill(), { once: true });
    return proc;
  }

  async exec(id: string, req: ExecRequest, signal?: AbortSignal): Promise<ExecResult> {
    await checkWritablePaths(this.#running(id).agent, req.writablePaths);
    const proc = this.#start(id, req, signal);
    const exit = await proc.done;
    const status = exitStatus(proc, exit, req);
    return { ...status, stdout: proc.stdout.encode(status.encoding), stderr: proc.stderr.encode(status.encoding) };
  }

  async *execStream(id: string, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> {
    await checkWritablePaths(this.#running(id).agent, req.writablePaths);
    const proc = this.#start(id, req, signal);
    // uncapped: every byte streams (the cap bounds only what is kept), as for a container.
    for await (const { stream, data } of iterateOutput(proc, req.uncapped ? 'raw' : 'kept')) yield { type: stream, data };
    const exit = await proc.done;
    const status = exitStatus(proc, exit, req);
    yield { type: 'exit', result: req.uncapped ? { ...status, truncated: false } : status };
  }

  // --- background processes ------------------------------------------------------------------

  async startProcess(id: string, req: StartProcessRequest): Promise<ProcessInfo> {
    const v = this.#running(id);
    await checkWritablePaths(v.agent, req.writablePaths);
    const proc = new VmProcess(v.agent, this.#command(v, req.cmd, req), {
      stdin: req.stdin ?? false,
      maxOutputBytes: req.maxOutputBytes ?? 1 << 20,
      timeoutMs: req.timeoutMs,
    });
    return v.processes.add(req.cmd, proc);
  }

  async listProcesses(id: string): Promise<ProcessInfo[]> {
    return this.#vm(id).processes.list();
  }

  #vm(id: string): LiveVm {
    const v = this.#live.get(id);
    if (!v) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this edge`);
    return v;
  }

  async processOutput(id: string, pid: string, offsets: { stdout: number; stderr: number }, encoding: Encoding): Promise<ProcessOutput> {
    return this.#vm(id).processes.output(pid, offsets, encoding);
  }

  async waitProcess(id: string, pid: string, timeoutMs: number): Promise<ProcessInfo> {
    return this.#vm(id).processes.wait(pid, timeoutMs);
  }

  async signalProcess(id: string, pid: string, signal: NodeJS.Signals): Promise<ProcessInfo> {
    const { proc } = this.#vm(id).processes.entry(pid);
    this.#running(id);
    await proc.signal(signal);
    if (signal === 'SIGKILL') await proc.done;
    return this.#vm(id).processes.info(pid);
  }

  async writeProcessStdin(id: string, pid: string, data: Buffer, eof: boolean): Promise<void> {
    const { proc } = this.#vm(id).processes.entry(pid);
    this.#running(id);
    if (proc.exit) throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has exited`, { pid });
    if (data.length && !proc.writeStdin(data)) {
      throw new ApiError('PROCESS_NOT_RUNNING', `process ${pid} has no open stdin (start it with stdin: true)`, { pid });
    }
    if (eof) proc.endStdin();
  }

  // --- sessions ------------------------------------------------------------------------------

  /**
   * A shell session in the guest with the container's semantics (exec/shell-session.ts): one
   * shell per command, its state carried on fd 3, each in a Landlock domain of its own, all of
   * the session's commands in one guest cgroup (vm-session.ts). A bad cwd or writablePaths is a
   * 400 here, at open.
   */
  async openSession(id: string, req: OpenSessionRequest): Promise<SessionInfo> {
    const v = this.#running(id);
    v.sessions.checkRoom();
    this.#command(v, ['/bin/sh'], req); // NULs in env or cwd
    if (req.cwd !== undefined) {
      const cwd = await v.agent.call('stat', { path: sandboxPath(req.cwd, v.record.config.cwd) }).then(
        (r) => (JSON.parse(r.payload.toString('utf8')) as GuestStat).type,
        () => undefined,
      );
      if (cwd !== 'dir' && cwd !== 'symlink') {
        throw new ApiError(
          'INVALID_REQUEST',
          `cwd ${req.cwd} ${cwd ? 'is not a directory' : 'does not exist'} in the sandbox; create it first (files.mkdir) or use another`,
          { field: 'cwd', path: req.cwd },
        );
      }
    }
    await checkWritablePaths(v.agent, req.writablePaths);
    const hasBash =
      req.shell === 'sh'
        ? false
        : await v.agent.call('stat', { path: '/bin/bash' }).then(
            () => true,
            () => false,
          );
    const host = vmSessionHost(v.agent, (argv, cwd, env) => this.#command(v, argv, { cwd, env }));
    return v.sessions.add(new ShellSession(host, req, hasBash));
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    return this.#vm(id).sessions.list();
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

  /**
   * A VM's snapshot. As an image (the default): pack_diff of the guest's overlay upper, read by
   * the agent with its disk frozen and streamed as a tar (vm-disk-diff.ts), a layer over the VM's
   * own layers that containers and VMs start from. `memory`: its memory and device state, for a
   * live fork (#saveState).
   */
  async snapshotSandbox(id: string, opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean } = {}): Promise<EdgeSnapshot> {
    if (opts.memory) return this.#saveState(id);
    const v = this.#vm(id);
    if (v.record.paused) {
      throw new ApiError(
        'SANDBOX_NOT_RUNNING',
        `VM ${id} is paused: its agent reads its disk for a snapshot as an image; resume it first (a paused VM can be forked as it is)`,
        { id, status: 'paused' },
      );
    }
    this.#running(id);
    // One reader of the guest's disk at a time: a second snapshot waits for the first.
    while (v.diffing) await v.diffing.catch(() => undefined);
    const work = this.#snapshotImage(v, opts);
    v.diffing = work;
    try {
      return await work;
    } finally {
      if (v.diffing === work) v.diffing = undefined;
    }
  }

  async #snapshotImage(v: LiveVm, opts: { scrub?: string[]; signal?: AbortSignal }): Promise<EdgeSnapshot> {
    const id = v.record.id;
    const tmpDir = join(this.opts.nodeDir, 'tmp');
    mkdirSync(tmpDir, { recursive: true });
    const stage = mkdtempSync(join(tmpDir, 'vm-snap-'));
    const copying = AbortSignal.any([v.stop.signal, AbortSignal.timeout(SNAPSHOT_COPY_TIMEOUT_MS), ...(opts.signal ? [opts.signal] : [])]);
    try {
      const t0 = performance.now();
      let stats;
      try {
        stats = await stageGuestUpper(v.agent, stage, {
          scrub: opts.scrub ?? DEFAULT_SCRUB,
          limits: DEFAULT_DIFF_LIMITS,
          signal: copying,
          timeoutMs: SNAPSHOT_COPY_TIMEOUT_MS,
          warn: (message) => this.opts.log.warn({ sandbox: id }, message),
        });
      } catch (err) {
        if (err instanceof DiffLimitError) throw new ApiError('PAYLOAD_TOO_LARGE', err.message, err.details);
        if (v.stop.signal.aborted) throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} was killed during its snapshot`, { id });
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (copying.aborted) {
          throw new ApiError(
            'PAYLOAD_TOO_LARGE',
            `reading the VM's disk for its snapshot took longer than ${SNAPSHOT_COPY_TIMEOUT_MS / 60_000} minutes; the sandbox changed too much to snapshot`,
            {
              limit: 'copyTimeMs',
              max: SNAPSHOT_COPY_TIMEOUT_MS,
            },
          );
        }
        if (v.agent.closed)
          throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} went away during its snapshot: ${v.agent.closed.message}`, {
            id,
          });
        // What the guest sent is the guest's: a broken archive is its doing, not the edge's.
        if (
          err instanceof TarFormatError ||
          err instanceof UnsafeArchiveError ||
          err instanceof GuestDiffError ||
          err instanceof AgentError
        ) {
          throw new ApiError('SANDBOX_NOT_RUNNING', `VM ${id}: its disk could not be read for the snapshot: ${err.message}`, { id });
        }
        throw err;
      }
      const frozenMs = performance.now() - t0;
      const base = { baseLayers: v.record.layers, config: v.record.config, stats, frozenMs };
      if (stats.entries === 0) return { layer: null, ...base };
      const layer = await packSnapshotLayer(id, stage, {
        tmpDir,
        blobs: this.opts.blobs,
        sparse: false,
        killed: v.stop.signal,
        cancelled: opts.signal,
      });
      return { layer, ...base };
    } finally {
      await removeTree(stage);
    }
  }

  /**
   * A VM's state for a live fork: with its vCPUs stopped, its disk copied (sparse) and its memory
   * and device state saved through QEMU's migration stream (vm-state.ts), then the VM runs on.
   * The state stays on this edge, beside the VM (`snapshot/`), until the VM is killed or saved
   * again; creates with `restoreFrom` start new VMs from it, each with its own copy of the disk.
   */
  async #saveState(id: string): Promise<EdgeSnapshot> {
    const v = this.#vm(id);
    if (v.agent.closed) throw new ApiError('SANDBOX_NOT_RUNNING', `the agent of VM ${id} is gone: ${v.agent.closed.message}`);
    const wasPaused = v.record.paused === true;
    const next = `${v.paths.snapshotDir}.new`;
    rmSync(next, { recursive: true, force: true });
    mkdirSync(next, { mode: 0o700 });
    const staged = new VmPaths(v.paths.dir);
    const t0 = performance.now();
    try {
      if (!wasPaused) await v.qmp.execute('stop');
      try {
        await copySparse(v.paths.disk, join(next, 'upper.img'));
        await saveVmState(v.qmp, v.paths.migrationSocket, join(next, 'state.bin'));
      } finally {
        if (!wasPaused) await v.qmp.execute('cont');
      }
      const { backend, layers, config, env, limits, agentKey } = v.record;
      writeFileAtomic(
        join(next, 'record.json'),
        JSON.stringify({ backend, layers, config, env, limits, agentKey } satisfies SnapshotRecord),
        0o600,
      );
      rmSync(staged.snapshotDir, { recursive: true, force: true }); // restores reading the old one keep their open files
      renameSync(next, staged.snapshotDir);
    } catch (err) {
      rmSync(next, { recursive: true, force: true });
      if (err instanceof ApiError) throw err;
      throw new ApiError('INTERNAL', `could not snapshot VM ${id}: ${(err as Error).message}`, { id });
    }
    const frozenMs = performance.now() - t0;
    return {
      layer: null,
      baseLayers: v.record.layers,
      config: v.record.config,
      stats: { entries: 0, bytes: 0, whiteouts: 0, opaqueDirs: 0, sparseFiles: 0 },
      frozenMs,
    };
  }

  /**
   * A connection to `port` on the guest's loopback, relayed by the agent (vm-port.ts). A paused
   * VM answers nothing, as a paused container does not.
   */
  async openPort(id: string, port: number): Promise<Duplex> {
    const v = this.#vm(id);
    if (v.record.paused)
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id} is paused: nothing in it can answer on port ${port}; resume it first`, {
        id,
        status: 'paused',
      });
    this.#running(id);
    let socket: Duplex;
    try {
      socket = await openGuestPort(v.agent, port);
    } catch (err) {
      if (err instanceof AgentError && err.code === 'ECONNREFUSED') {
        throw new ApiError(
          'PORT_NOT_LISTENING',
          `nothing listens on port ${port} in the sandbox (connection refused on the guest's 127.0.0.1)`,
          { id, port },
        );
      }
      throw new ApiError('SANDBOX_NOT_RUNNING', `sandbox ${id}: ${(err as Error).message}`, { id });
    }
    // A kill ends the VM's connections with it.
    v.ports.add(socket);
    socket.once('close', () => v.ports.delete(socket));
    return socket;
  }

  /** An interactive command under a terminal in the guest (default: bash, else sh). */
  async openPty(id: string, req: TerminalRequest): Promise<TerminalChannel> {
    const v = this.#running(id);
    let argv = req.cmd?.length ? req.cmd : undefined;
    if (!argv) {
      const bash = await v.agent.call('stat', { path: '/bin/bash' }).then(
        () => true,
        () => false,
      );
      argv = [bash ? '/bin/bash' : '/bin/sh'];
    }
    const cmd = this.#command(v, argv, { cwd: req.cwd, env: { TERM: 'xterm-256color', ...req.env } });
    try {
      const t = await openVmTerminal(v.agent, cmd, { cols: req.cols, rows: req.rows });
      v.terminals.add(t);
      void t.exit.then(() => v.terminals.delete(t));
      return t;
    } catch (err) {
      throw new ApiError('INVALID_REQUEST', `could not start the terminal: ${(err as Error).message}`, { cmd: argv });
    }
  }

  /**
   * Tar streams are packed and unpacked in the guest, by the guest's own `tar` (the image's): every
   * path in the archive resolves inside the VM, which has no path to the host at all. Unlike a
   * container's (which uses the platform's read-only busybox), an image without tar cannot take
   * or give tar streams, and a tar the guest planted is the guest's own business.
   */
  async uploadTar(id: string, dir: string, body: AsyncIterable<Buffer>): Promise<number> {
    const v = this.#running(id);
    const p = sandboxPath(dir, v.record.config.cwd);
    await this.#fs(id, dir, (vm, q) => vm.agent.call('mkdir', { path: q, parents: true }), true);
    const proc = this.#tar(v, ['-x', '-f', '-', '-C', p], true);
    let bytes = 0;
    try {
      for await (const chunk of body) {
        bytes += chunk.length;
        if (!proc.writeStdin(chunk)) break;
      }
    } finally {
      proc.endStdin();
    }
    const exit = await proc.done;
    if (exit.exitCode !== 0) throw guestTarFailed('tar upload', proc.stderr.bytes().toString('utf8'), exit.exitCode);
    return bytes;
  }

  async downloadTar(id: string, path: string): Promise<AsyncIterable<Buffer>> {
    const v = this.#running(id);
    await this.statPath(id, path); // 404 for a missing path, as for a container
    return tarOutput(this.#tar(v, tarCreateArgs(sandboxPath(path, v.record.config.cwd)), false), guestTarFailed);
  }

  /** The guest's tar as root in /, its output not kept (streamed), no timeout (an upload takes what it takes). */
  #tar(v: LiveVm, args: string[], stdin: boolean): VmProcess {
    return new VmProcess(
      v.agent,
      { argv: ['tar', ...args], env: mergeEnv(v.record.config.env, v.record.env, {}), cwd: '/', uid: 0, gid: 0 },
      { stdin, maxOutputBytes: 64 << 10 },
    );
  }

  /**
   * Replaces the egress policy in the VM's netns (one nft transaction; the link on first use, as
   * for a container). The guest's NIC is there from boot, so a switch needs nothing from the guest.
   */
  async setNetwork(id: string, req: EdgeNetworkRequest): Promise<{ policy: NetworkPolicy; link?: Link; appliedMs: number }> {
    const v = this.#vm(id); // a paused VM's netns takes rules as well
    const policy = await resolvePolicy(req);
    const t0 = performance.now();
    v.record.network = await this.opts.links.apply(id, v.record.pid ?? 0, v.record.network, policy, vmRuleset);
    saveRecord(v.paths, v.record);
    const out: { policy: NetworkPolicy; link?: Link; appliedMs: number } = {
      policy,
      appliedMs: Math.round((performance.now() - t0) * 100) / 100,
    };
    if (v.record.network.link) out.link = v.record.network.link;
    return out;
  }

  async getNetwork(id: string): Promise<{ policy: NetworkPolicy; link?: Link }> {
    const { network } = this.#vm(id).record;
    const out: { policy: NetworkPolicy; link?: Link } = { policy: network?.policy ?? { mode: 'none', allow: [] } };
    if (network?.link) out.link = network.link;
    return out;
  }

  // --- state -------------------------------------------------------------------------------------

  /**
   * The VM's cgroup: everything QEMU holds (guest RAM it touched, TCG's cache, page cache of its
   * disks) and its threads; OOM kills are the host's of QEMU, not the guest kernel's own.
   */
  async sandboxUsage(id: string): Promise<{ oomKills: number; memoryBytes: number; pids: number }> {
    this.#vm(id);
    return sandboxUsage(id);
  }

  /** QMP stop: every vCPU halts, memory stays; the guest's clock does not see the gap. */
  async pauseSandbox(id: string): Promise<void> {
    const v = this.#vm(id);
    await v.qmp.execute('stop');
    v.record.paused = true;
    saveRecord(v.paths, v.record);
  }

  async resumeSandbox(id: string): Promise<void> {
    const v = this.#vm(id);
    await v.qmp.execute('cont');
    v.record.paused = false;
    saveRecord(v.paths, v.record);
  }

  // --- files ---------------------------------------------------------------------------------

  async #fs<T>(id: string, path: string, fn: (v: LiveVm, p: string) => Promise<T>, writes = false): Promise<T> {
    // The agent refuses writes while a snapshot reads the frozen disk: they wait for it here.
    while (writes && this.#live.get(id)?.diffing) await this.#live.get(id)?.diffing?.catch(() => undefined);
    const v = this.#running(id);
    const p = sandboxPath(path, v.record.config.cwd);
    try {
      return await fn(v, p);
    } catch (err) {
      throw fileError(err, path);
    }
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return this.#fs(id, path, async (v, p) => {
      const r = await v.agent.call('read', { path: p, max: maxBytes });
      if (r.header['ev'] === 'too_large') {
        const size = Number(r.header['size']);
        throw new ApiError('PAYLOAD_TOO_LARGE', `${path} is ${size} bytes, over the ${maxBytes}-byte limit of the files API`, {
          path,
          size,
          limit: maxBytes,
        });
      }
      return Buffer.concat(r.data);
    });
  }

  async writeFile(id: string, path: string, data: Buffer, mode: number): Promise<number> {
    return this.#fs(
      id,
      path,
      async (v, p) => {
        await v.agent.call('write', { path: p, mode }, data);
        return data.length;
      },
      true,
    );
  }

  async statPath(id: string, path: string): Promise<FileStat> {
    return this.#fs(id, path, async (v, p) =>
      toFileStat(JSON.parse((await v.agent.call('stat', { path: p })).payload.toString('utf8')) as GuestStat, p),
    );
  }

  async listDir(id: string, path: string): Promise<{ entries: FileStat[]; truncated: boolean }> {
    return this.#fs(id, path, async (v, p) => {
      const r = await v.agent.call('list', { path: p, max: 10_000 });
      // Sorted by name, as a container's listing is (the guest gives readdir order).
      const stats = (JSON.parse(r.payload.toString('utf8')) as GuestStat[]).sort((a, b) =>
        a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
      );
      const entries = stats.map((s) => toFileStat(s, `${p.replace(/\/$/, '')}/${s.name}`));
      return { entries, truncated: r.header['truncated'] === true };
    });
  }

  async makeDir(id: string, path: string, parents: boolean): Promise<void> {
    await this.#fs(id, path, (v, p) => v.agent.call('mkdir', { path: p, parents }), true);
  }

  async removePath(id: string, path: string, recursive: boolean): Promise<void> {
    await this.#fs(id, path, (v, p) => v.agent.call('remove', { path: p, recursive }), true);
  }

  async renamePath(id: string, from: string, to: string): Promise<void> {
    await this.#fs(id, from, (v, p) => v.agent.call('rename', { from: p, to: sandboxPath(to, v.record.config.cwd) }), true);
  }
}

interface GuestStat {
  name: string;
  type: FileStat['type'];
  size: number;
  mode: number;
  uid: number;
  gid: number;
  mtimeMs: number;
  linkTarget?: string;
}

function toFileStat(s: GuestStat, path: string): FileStat {
  const out: FileStat = {
    path,
    name: s.name,
    type: s.type,
    size: s.size,
    mode: `0${(s.mode & 0o7777).toString(8).padStart(3, '0')}`,
    uid: s.uid,
    gid: s.gid,
    mtime: new Date(s.mtimeMs).toISOString(),
  };
  if (s.linkTarget !== undefined) out.linkTarget = s.linkTarget;
  return out;
}

/** The guest's errno as the same API errors the container files API gives. */
function fileError(err: unknown, path: string): Error {
  if (!(err instanceof AgentError))
    return err instanceof ApiError ? err : new ApiError('SANDBOX_NOT_RUNNING', `the VM's agent did not answer: ${(err as Error).message}`);
  switch (err.code) {
    case 'ENOENT':
      return new ApiError('FILE_NOT_FOUND', `no such file in the sandbox: ${path}`, { path });
    case 'EISDIR':
      return new ApiError('PATH_CONFLICT', `${path} is a directory`, { path });
    case 'ENOTDIR':
      return new ApiError('PATH_CONFLICT', `a component of ${path} is not a directory`, { path });
    case 'EEXIST':
      return new ApiError('PATH_CONFLICT', `${path} already exists`, { path });
    case 'ENOTEMPTY':
      return new ApiError('PATH_CONFLICT', `${path} is a directory that is not empty (set recursive: true)`, { path });
    case 'ENOSPC':
      return new ApiError('PAYLOAD_TOO_LARGE', `the sandbox disk is full writing ${path}`, { path });
    case 'EINVAL':
      return new ApiError('INVALID_REQUEST', `${path} is not a regular file`, { path });
    default:
      return new ApiError('INVALID_REQUEST', err.message, { path, errno: err.code });
  }
}

function guestTarFailed(what: string, stderr: string, exitCode: number): ApiError {
  if (exitCode === 127)
    return new ApiError('INVALID_REQUEST', `${what} needs tar in the VM's image, and it has none`, { stderr, exitCode });
  return new ApiError('INVALID_REQUEST', `${what} failed: ${stderr.trim() || `tar exited ${exitCode}`}`, { stderr, exitCode });
}

function exitStatus(proc: VmProcess, exit: ProcessExit, req: ExecRequest): Omit<ExecResult, 'stdout' | 'stderr'> {
  return {
    exitCode: exit.exitCode,
    encoding: req.encoding ?? 'utf8',
    truncated: proc.stdout.truncated || proc.stderr.truncated,
    stdoutBytes: proc.stdout.total,
    stderrBytes: proc.stderr.total,
    timedOut: exit.timedOut,
    oomKilled: false,
    durationMs: exit.durationMs,
  };
}

/** A sparse file formatted ext4: the guest's writable layer, limited to its size. */
async function makeDisk(file: string, mib: number): Promise<void> {
  writeFileSync(file, '');
  truncateSync(file, mib * 1024 * 1024);
  await runToolOrThrow('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', '-O', '^has_journal', file]);
}

/** What a restore needs of the VM a snapshot was taken of (`snapshot/record.json`). */
type SnapshotRecord = Pick<VmRecord, 'backend' | 'layers' | 'config' | 'env' | 'limits' | 'agentKey'>;

function readJson<T>(file: string): T | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

/** A copy of a disk image that stays sparse (unused space of the upper disk costs nothing). */
async function copySparse(from: string, to: string): Promise<void> {
  await runToolOrThrow('cp', ['--sparse=always', from, to]);
}

function readRecord(paths: VmPaths): VmRecord | undefined {
  try {
    return JSON.parse(readFileSync(paths.state, 'utf8')) as VmRecord;
  } catch {
    return undefined;
  }
}

function saveRecord(paths: VmPaths, record: VmRecord): void {
  writeFileAtomic(paths.state, JSON.stringify(record), 0o600); // it holds the channel's key
}

function toEdgeSandbox(r: VmRecord): EdgeSandbox {
  return { id: r.id, status: r.paused ? 'paused' : 'running', pid: r.pid ?? 0, createdAt: r.createdAt };
}

/** The last lines of a log, for an error message. */
function tail(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-6).join(' | ').slice(-1500);
  } catch {
    return '';
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
