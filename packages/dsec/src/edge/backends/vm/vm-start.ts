import { dirname } from 'node:path';
import { renameSync, rmSync } from 'node:fs';
import type { Logger } from 'pino';
import type { AccelChoice } from './accel-probe.js';
import type { AgentClient } from './agent-client.js';
import type { GuestAssets } from './guest-assets.js';
import type { PhaseClock } from './phase-clock.js';
import { isQemuOf, launchQemu, type VmMachine, type VmPaths } from './qemu-launch.js';
import { QmpClient } from './qmp-client.js';
import { bootAgent, copySparse, keyRestoredAgent, makeDisk, reconnectAgent } from './vm-boot.js';
import { makeVmCgroup } from './vm-cgroup.js';
import { vcpusOf, type ImageSnapshot, type VmImageSnapshots } from './vm-image-snapshot.js';
import { saveRecord, type SnapshotRecord, type VmRecord } from './vm-record.js';
import { loadVmState } from './vm-state.js';

/**
 * Starting a VM's QEMU for a create, in one of three ways: a boot, a restore of a saved VM (a
 * fork or a move), or a restore of the image's snapshot (vm-image-snapshot.ts). vm-backend.ts
 * chooses which and handles what follows (network, the record, falling back to a boot).
 */

/** Size of a VM's writable disk when the request sets no diskMiB (sparse: unused space costs nothing). */
export const DEFAULT_VM_DISK_MIB = 2048;

/** A saved VM a create starts from: its disk, its memory and device state, what it was made with. */
export interface RestoreSource {
  disk: string;
  memory: string;
  record: SnapshotRecord;
  /** The files are this VM's own (fetched for it): the disk is moved, not copied, and the state removed once loaded. */
  own?: boolean;
}

export interface StartContext {
  guest: GuestAssets;
  accel: () => Promise<AccelChoice>;
  log: Logger;
}

/**
 * Starts the VM's QEMU and reaches its agent: a restore of a saved VM (`source`: a fork or a
 * move, which keeps its key; its clock and RNG are renewed), of the image's snapshot (`image`:
 * RAM mapped from the snapshot, the guest takes its own key, clock and seed), or a boot.
 */
export async function startVm(
  ctx: StartContext,
  record: VmRecord,
  paths: VmPaths,
  layerFiles: string[],
  clock: PhaseClock,
  source: RestoreSource | undefined,
  image: ImageSnapshot | undefined,
): Promise<{ agent: AgentClient; qmp: QmpClient }> {
  const agentKey = record.agentKey ?? '';
  if (source?.own) renameSync(source.disk, paths.disk);
  else if (source) await copySparse(source.disk, paths.disk);
  else if (image) await copySparse(image.disk, paths.disk);
  else await makeDisk(paths.disk, record.limits.diskMiB ?? DEFAULT_VM_DISK_MIB);
  clock.mark('disk');
  // A guest born of an image snapshot has its RAM in the backend `mem`; so do its forks.
  record.memoryBackend = image ? true : source?.record.memoryBackend;
  record.started = source ? 'saved-state' : image ? 'image-snapshot' : 'boot';
  const pid = launchQemu({
    machine: record.backend as VmMachine,
    accel: (record.accel ?? (await ctx.accel())).accel,
    guest: ctx.guest,
    paths,
    layers: layerFiles,
    vcpus: vcpusOf(record.limits),
    memoryMiB: record.limits.memoryMiB,
    cgroupProcs: makeVmCgroup(record.id, record.limits),
    ...(image ? { memory: { file: image.ram } } : record.memoryBackend ? { memory: {} } : {}),
    ...(source || image ? { incoming: paths.migrationSocket } : {}),
  });
  record.pid = pid;
  saveRecord(paths, record);
  clock.mark('launch');
  if (!source && !image) {
    const agent = await bootAgent(pid, paths, record.limits.memoryMiB, agentKey);
    clock.mark('agent');
    return { agent, qmp: await QmpClient.open(paths.qmpSocket) };
  }
  const qmp = await loadVmState(
    paths.migrationSocket,
    source?.memory ?? image!.state,
    () => QmpClient.open(paths.qmpSocket),
    () => isQemuOf(pid, paths),
    clock,
    { ignoreShared: image !== undefined },
  );
  try {
    const agent = image ? await keyRestoredAgent(paths, agentKey) : await reconnectAgent(paths, agentKey);
    // A fork's guest keeps its source's key; its clock is the save's and its RNG its source's.
    if (source)
      await agent
        .renew()
        .catch((err: Error) => ctx.log.warn({ sandbox: record.id, err: err.message }, "could not renew a restored guest's clock and RNG"));
    clock.mark('agent');
    if (source?.own) rmSync(dirname(source.memory), { recursive: true, force: true });
    return { agent, qmp };
  } catch (err) {
    qmp.close();
    throw err;
  }
}

/**
 * The image's snapshot to restore (vm-image-snapshot.ts), made now when there is none (the
 * first create of an image on this node boots the guest it is made of); undefined when
 * snapshots are off (DSEC_VM_SNAPSHOTS=0) or the build failed (the create boots instead).
 */
export async function imageSnapshotFor(
  images: VmImageSnapshots,
  log: Logger,
  record: VmRecord,
  layerFiles: string[],
  clock: PhaseClock,
): Promise<ImageSnapshot | undefined> {
  if (process.env['DSEC_VM_SNAPSHOTS'] === '0' || !record.accel) return undefined;
  const spec = {
    backend: record.backend as VmMachine,
    layers: record.layers,
    limits: record.limits,
    diskMiB: record.limits.diskMiB ?? DEFAULT_VM_DISK_MIB,
    accel: record.accel.accel,
  };
  try {
    const found = await images.find(spec);
    clock.mark('findSnapshot');
    if (found) return found;
    const made = await images.make(spec, layerFiles);
    clock.mark('makeSnapshot');
    return made;
  } catch (err) {
    log.warn({ sandbox: record.id, err: (err as Error).message }, 'could not make the image snapshot; booting instead');
    return undefined;
  }
}
