import type { Duplex } from 'node:stream';
import { existsSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { ApiError } from '../../../api-error.js';
import { sandboxUsage } from '../../../host/cgroups.js';
import { ToolError } from '../../../host/run-tool.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { Link } from '../../../net/address-pool.js';
import type { NodeLinks } from '../../../net/node-links.js';
import { vmRuleset, type NetworkPolicy } from '../../../net/policy.js';
import { detachLink } from '../../../net/sandbox-network.js';
import { prepareVmNetns } from '../../../net/vm-network.js';
import type { BlobSource } from '../../node/blob-source.js';
import type { LayerCache } from '../../node/layer-cache.js';
import { resolvePolicy } from '../../node/network-request.js';
import type { ExecRequest, SandboxUsage } from '@dsec/sdk/schema';
import type { ExecEvent } from '../../protocol/exec-event.js';
import type {
  EdgeCreateRequest,
  EdgeNetworkRequest,
  EdgeQuiesce,
  EdgeSandbox,
  EdgeSnapshot,
  SandboxLimits,
} from '../../protocol/edge-api.js';
import { unsupported, type SandboxBackend } from '../backend.js';
import { ExecJournal } from '../shared/exec-journal.js';
import { ProcessTable } from '../shared/process-table.js';
import { SessionTable } from '../shared/session-table.js';
import { chooseAccel, type AccelChoice } from './accel-probe.js';
import { AgentClient, AgentError, newAgentKey } from './agent-client.js';
import { guestAssets, type GuestAssets } from './guest-assets.js';
import { isQemuOf, VmPaths, type VmMachine } from './qemu-launch.js';
import { QmpClient } from './qmp-client.js';
import { sleep } from './vm-boot.js';
import { VmImageSnapshots } from './vm-image-snapshot.js';
import { removeVmCgroup, vmCgroupBusy, VM_MEMORY_OVERHEAD_MIB } from './vm-cgroup.js';
import { VmCommands } from './vm-commands.js';
import { VmFiles } from './vm-files.js';
import { openGuestPort } from './vm-port.js';
import { readJson, readRecord, saveRecord, toEdgeSandbox, type LiveVm, type SnapshotRecord, type VmRecord } from './vm-record.js';
import { VmSnapshots } from './vm-snapshot.js';
import { PhaseClock } from './phase-clock.js';
import { imageSnapshotFor, startVm, type RestoreSource, type StartContext } from './vm-start.js';
import { fetchStateBlob, STATE_DISK, STATE_MEMORY } from './vm-state-blob.js';
import { withTimeout } from './vm-state.js';

/** How long a guest run again at adoption gets to answer its agent's ping. */
const RUN_ON_PING_MS = 10_000;

/**
 * Runs a stopped guest again (`cont`) and pings its agent; whether it answered within
 * RUN_ON_PING_MS. One that did not is stopped again: adopted paused, a resume retries it.
 */
async function runOn(qmp: QmpClient, agent: AgentClient): Promise<boolean> {
  try {
    await qmp.execute('cont');
    await withTimeout(agent.call('ping', {}), RUN_ON_PING_MS, 'no ping');
    return true;
  } catch {
    await qmp.execute('stop').catch(() => undefined);
    return false;
  }
}

/**
 * The agent and QMP of a VM a previous edge process started. A stopped guest (paused, or stopped
 * after a portable save, QEMU's `postmigrate`) cannot answer a ping: its agent is reached once it
 * runs again, and until then its calls answer as a paused VM's. Any other state is not adopted.
 */
async function reattach(paths: VmPaths, agentKey: string): Promise<{ agent: AgentClient; qmp: QmpClient; paused: boolean }> {
  const qmp = await QmpClient.open(paths.qmpSocket);
  let agent: AgentClient | undefined;
  try {
    const { status } = (await qmp.execute('query-status')) as { status?: string };
    const paused = status === 'paused' || status === 'postmigrate';
    if (!paused && status !== 'running') throw new Error(`QEMU reports the guest ${status ?? 'in no state'}`);
    agent = await AgentClient.open(paths.agentSocket, agentKey);
    if (!paused) await agent.call('ping', {});
    return { agent, qmp, paused };
  } catch (err) {
    agent?.close();
    qmp.close();
    throw err;
  }
}

/**
 * VM sandboxes a node takes at most: DSEC_MAX_VMS, else 4 per CPU (an idle guest's timer ticks
 * still cost host CPU under TCG; the sandbox budget, maxSandboxes, holds as well).
 */
export function maxVms(): number {
  const env = Number(process.env['DSEC_MAX_VMS']);
  return Number.isInteger(env) && env > 0 ? env : 4 * availableParallelism();
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
 * Why over 500 lines: ~30 of them are the one-line delegations SandboxBackend asks for, to
 * vm-commands.ts, vm-files.ts and vm-snapshot.ts; ports and network are short adapters to
 * vm-port.ts and the node's links; the rest is one concept, a VM's life (adopt, create or
 * restore, pause, quiesce, kill).
 */
export class VmBackend implements SandboxBackend {
  readonly dir: string;
  readonly guest: GuestAssets;
  readonly #live = new Map<string, LiveVm>();
  /** Creates in flight, so a kill of one waits for it to finish (or fail) first. */
  readonly #creating = new Map<string, Promise<unknown>>();
  /** The limits of creates in flight: their memory is committed from the start. */
  readonly #creatingLimits = new Map<string, SandboxLimits>();
  /** VMs this edge runs at most (read at each create, so a benchmark can raise it in process). */
  get slots(): number {
    return maxVms();
  }
  readonly #commands = new VmCommands({ running: (id) => this.#running(id), vm: (id) => this.#vm(id) });
  readonly #files = new VmFiles({ running: (id) => this.#running(id), find: (id) => this.#live.get(id) });
  readonly #snapshots: VmSnapshots;
  readonly #images: VmImageSnapshots;
  readonly #startContext: StartContext;
  #accel: Promise<AccelChoice> | undefined;

  constructor(
    private readonly opts: VmBackendOptions,
    guest: GuestAssets,
  ) {
    this.guest = guest;
    this.dir = join(opts.nodeDir, 'vms');
    this.#snapshots = new VmSnapshots({
      running: (id) => this.#running(id),
      vm: (id) => this.#vm(id),
      nodeDir: opts.nodeDir,
      blobs: opts.blobs,
      log: opts.log,
    });
    mkdirSync(this.dir, { recursive: true });
    this.#images = new VmImageSnapshots({ nodeDir: opts.nodeDir, guest, log: opts.log });
    this.#startContext = { guest, accel: () => this.accel(), log: opts.log };
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

  /** The limits of the VMs running here (not those being created), as ContainerBackend.limits(). */
  limits(): SandboxLimits[] {
    return [...this.#live.values()].map((v) => v.record.limits);
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
    await this.#images.cleanup();
    const adopted: string[] = [];
    const cleaned: string[] = [];
    for (const id of readdirSync(this.dir)) {
      const paths = new VmPaths(join(this.dir, id));
      const record = readRecord(paths);
      if (record?.phase === 'running' && record.pid && isQemuOf(record.pid, paths, { adopting: true })) {
        try {
          if (!record.agentKey) throw new Error('its record predates keyed agent channels');
          const { agent, qmp, paused } = await reattach(paths, record.agentKey);
          const pausedByUser = record.paused === true && record.held !== true;
          record.paused = paused;
          delete record.held;
          if (paused && !pausedByUser) {
            // Stopped by the edge for its own work when it went down: a fork's state save
            // (vm-snapshot.ts; the record does not say paused) or a move (quiesceSandbox: `held`),
            // which its control plane could not finish. It runs on, as the control plane has it;
            // adopted paused, every call was refused as a paused VM's while the control plane said
            // running, and a resume there was a no-op. A portable save alone (no move) and a
            // user's pause stay paused. A guest that does not answer in time is stopped again and
            // adopted paused (a resume retries), never removed for it.
            record.paused = !(await runOn(qmp, agent));
            this.opts.log.warn(
              { sandbox: id, paused: record.paused },
              record.paused
                ? 'a VM the edge had stopped for a save or a move did not answer when run again; adopted paused'
                : 'ran on a VM the edge had stopped for a save or a move that did not finish',
            );
          }
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
      const killed = v.agent.call('kill_group', { group: tag }).catch(() => undefined);
      // A stopped guest takes it when it runs again; the edge's start does not wait for that.
      if (!v.record.paused) await killed;
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
    if (req.restoreFrom !== undefined && req.restoreState !== undefined)
      throw new ApiError('INVALID_REQUEST', 'restoreFrom and restoreState each name a saved VM to start from: give one', {
        field: 'restoreState',
      });
    if (vmCgroupBusy(req.id)) {
      // A VM moved between two edges of one host (tests, a cluster on one machine) keeps its id,
      // so both would share `dsec/<id>`, and the old one's kill would end the new one with it.
      throw new ApiError('INVALID_REQUEST', `sandbox ${req.id} still runs on this host (its cgroup holds processes): kill it there first`, {
        id: req.id,
      });
    }
    // A restore takes everything the guest was made with from the snapshot: its RAM size and
    // vCPUs must match the saved state, its disks the saved disk.
    let source = req.restoreFrom === undefined ? undefined : this.#snapshotOf(req.restoreFrom);
    mkdirSync(paths.dir, { mode: 0o700 });
    if (req.restoreState !== undefined) source = await this.#fetchState(req, kind, paths);
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
    if (!agentKey) {
      rmSync(paths.dir, { recursive: true, force: true });
      throw new ApiError('INVALID_REQUEST', `the snapshot of ${req.restoreFrom} predates keyed agent channels; snapshot the VM again`, {
        restoreFrom: req.restoreFrom,
      });
    }
    const record: VmRecord = { id: req.id, phase: 'creating', ...made, createdAt: new Date().toISOString() };
    saveRecord(paths, record);
    let agent: AgentClient | undefined;
    const clock = new PhaseClock();
    try {
      const layerFiles: string[] = [];
      for (const l of record.layers) layerFiles.push(await this.opts.layerCache.ensure(l));
      clock.mark('layers');
      record.accel = await this.accel();
      const image = source ? undefined : await imageSnapshotFor(this.#images, this.opts.log, record, layerFiles, clock);
      let qmp: QmpClient;
      try {
        ({ agent, qmp } = await startVm(this.#startContext, record, paths, layerFiles, clock, source, image));
      } catch (err) {
        if (!image) throw err;
        // A snapshot this QEMU cannot restore is not used again: the guest boots, as with none.
        this.opts.log.warn({ sandbox: req.id, err: (err as Error).message }, 'could not restore the image snapshot; booting instead');
        this.#images.drop(image.dir);
        await this.#endQemu(req.id, record.pid);
        for (const f of [paths.disk, paths.agentSocket, paths.qmpSocket, paths.migrationSocket]) rmSync(f, { force: true });
        ({ agent, qmp } = await startVm(this.#startContext, record, paths, layerFiles, clock, undefined, undefined));
      }
      await prepareVmNetns(record.pid ?? 0);
      record.network = await this.opts.links.apply(req.id, record.pid ?? 0, undefined, policy, vmRuleset);
      clock.mark('network');
      record.createPhases = { ...clock.phases, total: clock.totalMs };
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

  /**
   * A VM state blob (a portable snapshot, made on any edge), fetched into the new VM's directory
   * (`incoming/`): its disk becomes the VM's own, its memory is fed to QEMU and then removed.
   */
  async #fetchState(req: EdgeCreateRequest, backend: VmMachine, paths: VmPaths): Promise<RestoreSource> {
    const incoming = join(paths.dir, 'incoming');
    try {
      const record = await fetchStateBlob(this.opts.blobs, req.restoreState as LayerDigest, incoming, {
        backend,
        layers: req.layers,
      });
      return { disk: join(incoming, STATE_DISK), memory: join(incoming, STATE_MEMORY), record, own: true };
    } catch (err) {
      rmSync(paths.dir, { recursive: true, force: true });
      if (err instanceof ApiError) throw err;
      throw new ApiError('SANDBOX_CREATE_FAILED', `could not bring in VM state ${req.restoreState}: ${(err as Error).message}`, {
        restoreState: req.restoreState,
      });
    }
  }

  /** The latest snapshot of VM `id` on this edge, to restore from. */
  #snapshotOf(id: string): RestoreSource {
    const v = this.#live.get(id);
    const record = v && readJson<SnapshotRecord>(v.paths.snapshotRecord);
    if (!v || !record) {
      throw new ApiError(
        'INVALID_REQUEST',
        `no VM snapshot of sandbox ${id} on this edge (a VM's snapshot lives on its edge until the VM is killed)`,
        { restoreFrom: id },
      );
    }
    return { disk: v.paths.snapshotDisk, memory: v.paths.snapshotMemory, record };
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
    await this.#endQemu(id, pid);
    await removeVmCgroup(id);
    await detachLink(id); // gone with QEMU's netns; a crash between veth and netns may leave the host end
    rmSync(paths.dir, { recursive: true, force: true });
  }

  /** Ends the VM's QEMU if it still runs: SIGTERM, then SIGKILL. */
  async #endQemu(id: string, pid: number | undefined): Promise<void> {
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
  }

  async shutdown(opts: { killAll?: boolean } = {}): Promise<void> {
    await Promise.allSettled([...this.#creating.values()]);
    if (opts.killAll) await Promise.allSettled([...this.#live.keys()].map((id) => this.killSandbox(id)));
    for (const v of this.#live.values()) {
      v.sessions.flushNotes();
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

  // --- commands, processes, sessions, terminals (vm-commands.ts); files (vm-files.ts) ----------

  readonly exec: SandboxBackend['exec'] = (id, req, signal) => this.#commands.exec(id, req, signal);
  /** An AsyncGenerator (callers may drive it with next() and return()). */
  readonly execStream = (id: string, req: ExecRequest, signal?: AbortSignal): AsyncGenerator<ExecEvent> =>
    this.#commands.execStream(id, req, signal);
  readonly startProcess: SandboxBackend['startProcess'] = (id, req) => this.#commands.startProcess(id, req);
  readonly listProcesses: SandboxBackend['listProcesses'] = (id) => this.#commands.listProcesses(id);
  readonly processOutput: SandboxBackend['processOutput'] = (id, pid, offsets, encoding) =>
    this.#commands.processOutput(id, pid, offsets, encoding);
  readonly waitProcess: SandboxBackend['waitProcess'] = (id, pid, timeoutMs) => this.#commands.waitProcess(id, pid, timeoutMs);
  readonly signalProcess: SandboxBackend['signalProcess'] = (id, pid, signal) => this.#commands.signalProcess(id, pid, signal);
  readonly writeProcessStdin: SandboxBackend['writeProcessStdin'] = (id, pid, data, eof) =>
    this.#commands.writeProcessStdin(id, pid, data, eof);
  readonly openSession: SandboxBackend['openSession'] = (id, req) => this.#commands.openSession(id, req);
  readonly listSessions: SandboxBackend['listSessions'] = (id) => this.#commands.listSessions(id);
  readonly sessionExec: SandboxBackend['sessionExec'] = (id, sid, req, signal) => this.#commands.sessionExec(id, sid, req, signal);
  readonly closeSession: SandboxBackend['closeSession'] = (id, sid) => this.#commands.closeSession(id, sid);
  readonly openPty: SandboxBackend['openPty'] = (id, req) => this.#commands.openPty(id, req);

  readonly readFile: SandboxBackend['readFile'] = (id, path, maxBytes, opts) => this.#files.readFile(id, path, maxBytes, opts);
  readonly writeFile: SandboxBackend['writeFile'] = (id, path, data, mode, opts) => this.#files.writeFile(id, path, data, mode, opts);
  readonly statPath: SandboxBackend['statPath'] = (id, path, opts) => this.#files.statPath(id, path, opts);
  readonly listDir: SandboxBackend['listDir'] = (id, path, opts) => this.#files.listDir(id, path, opts);
  readonly makeDir: SandboxBackend['makeDir'] = (id, path, parents, opts) => this.#files.makeDir(id, path, parents, opts);
  readonly removePath: SandboxBackend['removePath'] = (id, path, recursive, opts) => this.#files.removePath(id, path, recursive, opts);
  readonly renamePath: SandboxBackend['renamePath'] = (id, from, to, opts) => this.#files.renamePath(id, from, to, opts);
  readonly uploadTar: SandboxBackend['uploadTar'] = (id, dir, body) => this.#files.uploadTar(id, dir, body);
  readonly downloadTar: SandboxBackend['downloadTar'] = (id, path) => this.#files.downloadTar(id, path);

  /** An image (vm-snapshot.ts) or, with `memory`, the VM's state for a live fork. */
  async snapshotSandbox(
    id: string,
    opts: { scrub?: string[]; signal?: AbortSignal; memory?: boolean; portable?: boolean } = {},
  ): Promise<EdgeSnapshot> {
    return this.#snapshots.snapshot(id, opts);
  }

  #vm(id: string): LiveVm {
    const v = this.#live.get(id);
    if (!v) throw new ApiError('SANDBOX_NOT_FOUND', `no sandbox ${id} on this edge`);
    return v;
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
  async sandboxUsage(id: string): Promise<SandboxUsage> {
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
    delete v.record.held;
    saveRecord(v.paths, v.record);
  }

  /** A VM's processes move with its memory: quiescing it is pausing its vCPUs. */
  async quiesceSandbox(id: string): Promise<EdgeQuiesce> {
    const v = this.#vm(id);
    const wasPaused = v.record.paused === true;
    if (!wasPaused) {
      await this.pauseSandbox(id);
      v.record.held = true;
      saveRecord(v.paths, v.record);
    }
    return { processes: [], ended: false, wasPaused, frozen: true };
  }
}
