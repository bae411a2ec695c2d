import { readFileSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import type { ImageConfig } from '@dsec/sdk/schema';
import { writeFileAtomic } from '../../../image/atomic-file.js';
import type { LayerDigest } from '../../../image/layer-store.js';
import type { SandboxNetwork } from '../../../net/node-links.js';
import type { EdgeSandbox, SandboxLimits, TerminalChannel } from '../../protocol/edge-api.js';
import type { BackendKind } from '../backend.js';
import type { ExecJournal } from '../shared/exec-journal.js';
import type { ProcessTable } from '../shared/process-table.js';
import type { SessionTable } from '../shared/session-table.js';
import type { AccelChoice } from './accel-probe.js';
import type { AgentClient } from './agent-client.js';
import type { VmPaths } from './qemu-launch.js';
import type { QmpClient } from './qmp-client.js';

/** A VM as the edge remembers it on disk (`node/vms/<id>/state.json`), to adopt or clean it up. */
export interface VmRecord {
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
  /**
   * Paused by the edge for a move (quiesceSandbox), not by its user: an edge that restarts
   * before the move is done runs it on, as its control plane has it (vm-backend.ts start).
   */
  held?: boolean;
  /** The egress policy in force in the VM's netns, and its link once a policy other than none gave it one. */
  network?: SandboxNetwork;
  /**
   * The key of the VM's agent channel (hex; AgentClient): every frame the guest agent writes
   * carries its MAC. Given to the guest right after it boots; a restore keeps its source's.
   * Records written before keys have none, and such a VM is not adopted.
   */
  agentKey?: string;
  /**
   * Its RAM is QEMU's memory backend `mem` (qemu-launch.ts, GuestMemory): a guest restored from an
   * image's snapshot, or a fork of one. A restore of its state must be started the same way.
   */
  memoryBackend?: boolean | undefined;
  /** How its guest came up: booted, restored from its image's snapshot, or from a saved VM (fork, move). */
  started?: 'boot' | 'image-snapshot' | 'saved-state';
  /** How long each step of its create took, ms (phase-clock.ts). */
  createPhases?: Record<string, number>;
}

export interface LiveVm {
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

/** What a restore needs of the VM a snapshot was taken of (`snapshot/record.json`). */
export type SnapshotRecord = Pick<VmRecord, 'backend' | 'layers' | 'config' | 'env' | 'limits' | 'agentKey' | 'memoryBackend'>;

export function readJson<T>(file: string): T | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

export function readRecord(paths: VmPaths): VmRecord | undefined {
  try {
    return JSON.parse(readFileSync(paths.state, 'utf8')) as VmRecord;
  } catch {
    return undefined;
  }
}

export function saveRecord(paths: VmPaths, record: VmRecord): void {
  writeFileAtomic(paths.state, JSON.stringify(record), 0o600); // it holds the channel's key
}

export function toEdgeSandbox(r: VmRecord): EdgeSandbox {
  return { id: r.id, status: r.paused ? 'paused' : 'running', pid: r.pid ?? 0, createdAt: r.createdAt };
}
