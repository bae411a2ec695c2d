import { existsSync } from 'node:fs';
import type { Socket } from 'node:net';
import { join } from 'node:path';
import type { FileStat } from '@dsec/sdk/schema';
import { sandboxCgroupDirs } from '../../../host/cgroups.js';
import { toSandboxId } from '../../../host/uid-ranges.js';
import type { EdgeSandbox } from '../../protocol/edge-api.js';
import { ExecJournal } from '../shared/exec-journal.js';
import { ProcessTable } from '../shared/process-table.js';
import { SessionTable } from '../shared/session-table.js';
import type { Crun } from './crun.js';
import type { ExecTarget } from './exec/exec-target.js';
import type { PtyProcess } from './exec/pty-process.js';
import { killTagged } from './exec/sandbox-process.js';
import type { FileOwner } from './sandbox-files.js';
import type { SandboxRecord, SandboxRecords } from './sandbox-record.js';

/** A running sandbox as the edge holds it in memory: its record and its exec engine state. */
export interface LiveSandbox {
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
  /** Held still for a move (container-quiesce.ts): no caller's work until a resume (the move failed) or the kill (it moved). */
  quiesced?: boolean;
  /** Callers' file calls and commands running now (a move's quiesce waits for them). */
  calls?: number;
  /** Set once a kill started: no new work; the sandbox stays here until its teardown succeeds. */
  killing?: boolean;
  /** Aborted when a kill starts: stops work in flight on the sandbox (a snapshot's copy). */
  stop: AbortController;
  layersReleased?: boolean;
}

/** What the files API creates belongs to the sandbox's root: its range's base in a user namespace. */
export function ownerOf(r: SandboxRecord): FileOwner | undefined {
  return r.userns ? { uid: r.userns.base, gid: r.userns.base } : undefined;
}

/** A stat's owner as the sandbox sees it (its own ids, not the host's). */
export function asSeenInside(r: SandboxRecord, st: FileStat): FileStat {
  return r.userns ? { ...st, uid: toSandboxId(r.userns, st.uid), gid: toSandboxId(r.userns, st.gid) } : st;
}

export function toEdgeSandbox(r: SandboxRecord): EdgeSandbox {
  return { id: r.id, status: r.paused ? 'paused' : 'running', pid: r.pid ?? 0, createdAt: r.createdAt };
}

/** A running sandbox's in-memory state, from its record: how to start commands in it, its tables. */
export function newLiveSandbox(record: SandboxRecord, records: SandboxRecords, crun: Crun): LiveSandbox {
  const paths = records.paths(record.id);
  // Commands start through dsec-spawn's enter request when the sandbox's seccomp program is at
  // hand to load into each (a sandbox whose profile crun compiled, or one from before, goes
  // through crun exec).
  const cgroupDirs = record.pid && crun.spawner && existsSync(paths.seccompBpf) ? sandboxCgroupDirs(record.id) : [];
  const enter = record.pid && cgroupDirs.length ? { initPid: record.pid, seccompFile: paths.seccompBpf, cgroupDirs } : undefined;
  const target: ExecTarget = {
    crun: crun,
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
export async function endExecsOfOldEdge(live: LiveSandbox): Promise<void> {
  live.processes.restore(new Date(), (tag) => killTagged(live.record.id, tag));
  await live.sessions.endNotedByOldEdge((tag) => void killTagged(live.record.id, tag));
}

/** Whether a session's next shell may be started ahead in it now: not while paused, held for a move, or going. */
export function standbyAllowed(l: LiveSandbox): () => boolean {
  return () => !l.quiesced && !l.killing && l.record.paused !== true;
}
