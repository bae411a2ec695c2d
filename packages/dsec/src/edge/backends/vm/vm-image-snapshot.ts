import { createHash, randomBytes } from 'node:crypto';
import {
  closeSync,
  createReadStream,
  existsSync,
  fsyncSync,
  openSync,
  mkdirSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  truncateSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Logger } from 'pino';
import { which } from '../../../host/doctor.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { SandboxLimits } from '../../protocol/edge-api.js';
import type { Accel } from './accel-probe.js';
import { QEMU_BINARY, type GuestAssets } from './guest-assets.js';
import { isQemuOf, launchQemu, VmPaths, type VmMachine } from './qemu-launch.js';
import { QmpClient } from './qmp-client.js';
import { bootAgent, makeDisk, sleep } from './vm-boot.js';
import { makeVmCgroup, removeVmCgroup } from './vm-cgroup.js';
import { readJson } from './vm-record.js';
import { saveVmState } from './vm-state.js';

/**
 * Snapshots of an image's booted guest, one per image and guest shape on this node (issue 32): a
 * VM create restores one instead of booting (vm-backend.ts), and the first create of an image
 * makes it. Kept beside the layer cache in `node/vm-snapshots/<slot>/`:
 * - `ram`: the guest's RAM, as the booting guest wrote it through a shared file mapping; each
 *   restored guest maps it privately (copy-on-write), so idle guests of one image share the
 *   pages they have not changed in the host's page cache, and a restore streams no RAM;
 * - `state.bin`: QEMU's device state (the migration stream, RAM left out: x-ignore-shared);
 * - `upper.img`: the guest's writable disk at that moment, copied (sparse) for each new guest;
 * - `meta.json`: what it was made with (the build fingerprint).
 * The guest is saved right after its agent said ready and before it had a channel key: each
 * restored guest is given its own key with its own clock and RNG seed (agent-client.ts,
 * guestIdentity), so siblings share no secret. A slot is the image (its layers) and the guest's
 * shape (machine, RAM, vCPUs, disk size); a snapshot whose kernel, initramfs (the agent), QEMU
 * binary, accelerator or format differ from this edge's is stale: it is removed, not used.
 */

/** Bumped when what a snapshot holds or how QEMU is started for it changes (qemu-launch.ts). */
const FORMAT = 1;

export interface ImageSnapshotSpec {
  backend: VmMachine;
  layers: LayerDigest[];
  limits: SandboxLimits;
  /** The guest's disk size (the request's diskMiB or the default). */
  diskMiB: number;
  accel: Accel;
}

export interface ImageSnapshot {
  dir: string;
  ram: string;
  state: string;
  disk: string;
}

interface SnapshotMeta {
  fingerprint: string;
  spec: ImageSnapshotSpec;
  createdAt: string;
  bootMs: number;
}

export class VmImageSnapshots {
  readonly dir: string;
  /** Snapshots being made, by slot: concurrent first creates of one image wait for one build. */
  readonly #building = new Map<string, Promise<ImageSnapshot>>();

  constructor(private readonly opts: { nodeDir: string; guest: GuestAssets; log: Logger }) {
    this.dir = join(opts.nodeDir, 'vm-snapshots');
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
  }

  /**
   * What a build an edge crash interrupted left: its directory, its QEMU (detached, so it outlives
   * the edge; its pid is in the directory) and its cgroups. Called once at the edge's start.
   */
  async cleanup(): Promise<void> {
    for (const name of readdirSync(this.dir)) {
      if (!name.includes('.build-')) continue;
      const build = join(this.dir, name);
      const pid = Number(readJson<number>(join(build, 'pid')));
      if (pid > 0 && isQemuOf(pid, new VmPaths(build), { adopting: true })) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // gone
        }
        await ended(pid, new VmPaths(build));
      }
      rmSync(build, { recursive: true, force: true });
      await removeVmCgroup(`snapshot-${name.slice(0, name.indexOf('.'))}`);
    }
  }

  /** The snapshot for `spec` when there is one and it is fresh; a stale one is removed. */
  async find(spec: ImageSnapshotSpec): Promise<ImageSnapshot | undefined> {
    const dir = join(this.dir, slotOf(spec));
    const meta = readJson<SnapshotMeta>(join(dir, 'meta.json'));
    // Another shape whose digest starts alike (48 bits) is not this one's: boot instead.
    if (!meta || slotKey(meta.spec) !== slotKey(spec)) return undefined;
    const fingerprint = await this.fingerprint(spec.accel);
    if (meta.fingerprint !== fingerprint) {
      this.opts.log.info({ slot: dir }, 'VM image snapshot is stale (kernel, agent, QEMU or format changed): removing it');
      this.drop(dir);
      return undefined;
    }
    touch(join(dir, 'meta.json')); // the least recently used go first (#prune)
    return files(dir);
  }

  /** Removes a snapshot (stale, or one a restore failed on). Guests restored from it keep their mappings. */
  drop(dir: string): void {
    // Renamed first, so no create finds it half removed.
    const gone = `${dir}.build-gone-${randomBytes(4).toString('hex')}`;
    try {
      renameSync(dir, gone);
    } catch {
      return;
    }
    rmSync(gone, { recursive: true, force: true });
  }

  /** Makes the snapshot for `spec` (booting a guest of that image), or waits for the build under way. */
  make(spec: ImageSnapshotSpec, layerFiles: string[]): Promise<ImageSnapshot> {
    const slot = slotOf(spec);
    let work = this.#building.get(slot);
    if (!work) {
      work = this.#build(slot, spec, layerFiles).finally(() => this.#building.delete(slot));
      this.#building.set(slot, work);
    }
    return work;
  }

  async #build(slot: string, spec: ImageSnapshotSpec, layerFiles: string[]): Promise<ImageSnapshot> {
    const t0 = performance.now();
    // Short: the build's sockets live in it, and a unix socket's path has at most 107 bytes.
    const build = join(this.dir, `${slot}.build-${randomBytes(2).toString('hex')}`);
    mkdirSync(build, { mode: 0o700 });
    const paths = new VmPaths(build);
    const snap = files(build);
    if (Buffer.byteLength(paths.migrationSocket) > 107) {
      rmSync(build, { recursive: true, force: true });
      throw new Error(`the data dir's path is too long for a unix socket in ${build}`);
    }
    // The guest's cgroups are the node's, named after the slot (no sandbox id has this form).
    const cgroup = `snapshot-${slot}`;
    let pid: number | undefined;
    let qmp: QmpClient | undefined;
    try {
      await makeDisk(paths.disk, spec.diskMiB);
      writeFileSync(snap.ram, '', { mode: 0o600 }); // the guest's memory
      truncateSync(snap.ram, spec.limits.memoryMiB * 1024 * 1024);
      const launched = launchQemu({
        machine: spec.backend,
        accel: spec.accel,
        guest: this.opts.guest,
        paths,
        layers: layerFiles,
        vcpus: vcpusOf(spec.limits),
        memoryMiB: spec.limits.memoryMiB,
        cgroupProcs: makeVmCgroup(cgroup, spec.limits),
        memory: { file: snap.ram, shared: true },
      });
      pid = launched;
      writeFileSync(join(build, 'pid'), String(launched)); // for cleanup after an edge crash
      const agent = await bootAgent(launched, paths, spec.limits.memoryMiB, undefined);
      qmp = await QmpClient.open(paths.qmpSocket);
      await qmp.execute('stop');
      await saveVmState(qmp, paths.migrationSocket, snap.state, { ignoreShared: true });
      agent.close();
      await qmp.execute('quit').catch(() => undefined);
      await ended(launched, paths);
      for (const f of [paths.agentSocket, paths.qmpSocket, paths.migrationSocket]) rmSync(f, { force: true });
      // On disk before it has its name: a crash must not leave a snapshot whose RAM is partly holes.
      for (const f of [snap.ram, snap.state, paths.disk]) fsyncFile(f);
      const meta: SnapshotMeta = {
        fingerprint: await this.fingerprint(spec.accel),
        spec,
        createdAt: new Date().toISOString(),
        bootMs: Math.round(performance.now() - t0),
      };
      writeFileSync(join(build, 'meta.json'), JSON.stringify(meta), { mode: 0o600 });
      const dir = join(this.dir, slot);
      this.drop(dir);
      renameSync(build, dir);
      this.#prune();
      this.opts.log.info({ slot, ms: meta.bootMs }, 'made a VM image snapshot');
      return files(dir);
    } catch (err) {
      if (pid) await ended(pid, paths);
      rmSync(build, { recursive: true, force: true });
      throw err;
    } finally {
      qmp?.close();
      await removeVmCgroup(cgroup);
    }
  }

  /**
   * Keeps at most DSEC_VM_SNAPSHOTS_MAX snapshots (default 8; each holds the guest RAM its boot
   * touched, a sparse file on disk), dropping the least recently used: every image and guest
   * shape a node ever started would stay otherwise.
   */
  #prune(): void {
    const max = Number(process.env['DSEC_VM_SNAPSHOTS_MAX']) || 8;
    const slots = readdirSync(this.dir)
      .filter((n) => !n.includes('.build-'))
      .map((n) => {
        try {
          return { dir: join(this.dir, n), used: statSync(join(this.dir, n, 'meta.json')).mtimeMs };
        } catch {
          return { dir: join(this.dir, n), used: 0 };
        }
      })
      .sort((a, b) => b.used - a.used);
    for (const s of slots.slice(max)) this.drop(s.dir);
  }

  /** What a snapshot depends on besides its slot: the guest's kernel and initramfs, QEMU, the accelerator. */
  async fingerprint(accel: Accel): Promise<string> {
    const qemu = which(QEMU_BINARY) ?? QEMU_BINARY;
    const parts = [
      String(FORMAT),
      accel,
      await fileDigest(this.opts.guest.kernel),
      await fileDigest(this.opts.guest.initramfs),
      await fileDigest(qemu),
    ];
    return createHash('sha256').update(parts.join('\n')).digest('hex');
  }
}

export function vcpusOf(limits: SandboxLimits): number {
  return Math.max(1, Math.ceil(limits.cpu));
}

/** The directory name of a spec's snapshot: the image and the guest's shape. */
/**
 * The slot of a guest shape: 12 hex digits of its key's digest. Short, because a build's sockets
 * live under it and a unix socket's path has at most 107 bytes: with 20 digits a test's data dir on
 * an overlay root (dsec-test-root-…/dsec-test-…, fresh-machine's) put the build's migration socket
 * at 110, so no snapshot could be made there. find() checks the whole digest against the one kept.
 */
export function slotOf(spec: ImageSnapshotSpec): string {
  return slotKey(spec).slice(0, 12);
}

/** The whole digest of a guest shape's key. */
function slotKey(spec: ImageSnapshotSpec): string {
  const key = {
    backend: spec.backend,
    layers: spec.layers,
    memoryMiB: spec.limits.memoryMiB,
    vcpus: vcpusOf(spec.limits),
    diskMiB: spec.diskMiB,
  };
  return createHash('sha256').update(JSON.stringify(key)).digest('hex');
}

function touch(file: string): void {
  const now = new Date();
  try {
    utimesSync(file, now, now);
  } catch {
    // removed meanwhile: the create that found it still has its files open soon, or fails and boots
  }
}

function files(dir: string): ImageSnapshot {
  return { dir, ram: join(dir, 'ram'), state: join(dir, 'state.bin'), disk: join(dir, 'upper.img') };
}

function fsyncFile(file: string): void {
  const fd = openSync(file, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Ends QEMU (it was asked to quit; SIGKILL if it lingers). */
async function ended(pid: number, paths: VmPaths): Promise<void> {
  for (let i = 0; i < 100 && isQemuOf(pid, paths); i++) {
    if (i === 40) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await sleep(25);
  }
}

/** Content digests of the guest's files and QEMU, by path, size and mtime (hashed once per change). */
const digests = new Map<string, { stamp: string; digest: string }>();

async function fileDigest(file: string): Promise<string> {
  if (!existsSync(file)) return 'missing';
  const st = statSync(file);
  const stamp = `${st.ino}:${st.size}:${st.mtimeMs}`;
  const known = digests.get(file);
  if (known?.stamp === stamp) return known.digest;
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  const digest = hash.digest('hex');
  digests.set(file, { stamp, digest });
  return digest;
}
