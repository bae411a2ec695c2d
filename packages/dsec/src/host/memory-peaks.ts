import { closeSync, existsSync, openSync, readSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { CGROUP_PARENT, CGROUP_ROOT, readNumber } from './cgroups.js';

/**
 * A sandbox's memory high-water mark over a window of time (one command's run), and over its life.
 *
 * A command has its own cgroup, but with no controllers (command-cgroups.ts): the sandbox's init
 * lives in the sandbox's cgroup, so the memory controller cannot be enabled below it. What is
 * measured is the SANDBOX's peak while the command ran: the command's own use plus whatever else
 * the sandbox held (its init, background jobs) — the figure that decides an OOM kill.
 *
 * cgroup2 (kernel ≥ 6.12): memory.peak is reset per open file: each window opens its own, writes
 * to it and later reads its peak since then; nobody else's reading moves.
 * cgroup v1 (the hybrid layout): memory.max_usage_in_bytes has one mark, reset by writing 0. A new
 * window first reads the mark and credits it to every window still open and to the sandbox's
 * lifetime peak, then resets it; a closing window reads it and credits it the same way. So each
 * window's peak is the greatest of the marks of the stretches it spans, which is the peak since
 * it opened, whatever windows overlap it. (Between a read and its reset the kernel could raise
 * the mark for a few microseconds unseen; a peak lasting that short is not worth a lock.) The
 * lifetime peak is kept here, in the edge's memory: after an edge restart it counts from then.
 */
export interface MemoryWindow {
  /** The sandbox's peak memory in bytes since the window opened (undefined when unknown). */
  peek(): number | undefined;
  /** Ends the window: its peak (as peek()). Closing twice gives the first answer. */
  close(): number | undefined;
}

interface V1State {
  lifetime: number;
  open: Set<{ peak: number }>;
}

export class MemoryPeaks {
  readonly #v1 = new Map<string, V1State>();

  /** A window from now on, or undefined where the sandbox has no memory cgroup this can read. */
  open(sandboxId: string): MemoryWindow | undefined {
    // Opened, not first looked up (two stats of cgroup files per command): a missing v2 file says v1.
    const v2 = openV2Window(join(CGROUP_ROOT, CGROUP_PARENT, sandboxId, 'memory.peak'));
    if (v2) return v2;
    const file = join(CGROUP_ROOT, 'memory', CGROUP_PARENT, sandboxId, 'memory.max_usage_in_bytes');
    const state = this.#state(sandboxId);
    this.#credit(state, file);
    try {
      writeFileSync(file, '0');
    } catch {
      return undefined; // no v1 memory cgroup either, or the sandbox is going
    }
    const window = { peak: 0 };
    state.open.add(window);
    const peek = (): number | undefined => {
      if (state.open.has(window)) this.#credit(state, file);
      return window.peak > 0 ? window.peak : undefined;
    };
    return {
      peek,
      close: () => {
        const peak = peek();
        state.open.delete(window);
        return peak;
      },
    };
  }

  /** The sandbox's peak memory in bytes since it started (v1: since this edge started, see above). */
  lifetime(sandboxId: string): number | undefined {
    const v2 = v2PeakFile(sandboxId);
    if (v2) return readNumber(v2);
    const file = v1MarkFile(sandboxId);
    if (!file) return undefined;
    const state = this.#state(sandboxId);
    this.#credit(state, file);
    return state.lifetime;
  }

  /** Drops what is kept of a sandbox that is gone. */
  forget(sandboxId: string): void {
    this.#v1.delete(sandboxId);
  }

  #state(id: string): V1State {
    let s = this.#v1.get(id);
    if (!s) this.#v1.set(id, (s = { lifetime: 0, open: new Set() }));
    return s;
  }

  #credit(state: V1State, file: string): void {
    const mark = readNumber(file);
    if (mark === undefined) return;
    state.lifetime = Math.max(state.lifetime, mark);
    for (const w of state.open) w.peak = Math.max(w.peak, mark);
  }
}

function v1MarkFile(id: string): string | undefined {
  const file = join(CGROUP_ROOT, 'memory', CGROUP_PARENT, id, 'memory.max_usage_in_bytes');
  return existsSync(file) ? file : undefined;
}

function v2PeakFile(id: string): string | undefined {
  const file = join(CGROUP_ROOT, CGROUP_PARENT, id, 'memory.peak');
  return existsSync(file) ? file : undefined;
}

function openV2Window(file: string): MemoryWindow | undefined {
  let fd: number | undefined;
  try {
    fd = openSync(file, 'r+');
    writeSync(fd, 'reset\n');
  } catch {
    if (fd !== undefined) closeSync(fd);
    return undefined; // a kernel before 6.12 (memory.peak read-only) or the sandbox going
  }
  const open = fd;
  let closed: { peak: number | undefined } | undefined;
  const peek = (): number | undefined => {
    if (closed) return closed.peak;
    try {
      const buf = Buffer.alloc(32);
      const n = readSync(open, buf, 0, buf.length, 0);
      const v = Number(buf.subarray(0, n).toString().trim());
      return Number.isFinite(v) ? v : undefined;
    } catch {
      return undefined;
    }
  };
  return {
    peek,
    close: () => {
      if (closed) return closed.peak;
      closed = { peak: peek() };
      closeSync(open);
      return closed.peak;
    },
  };
}

/** The edge's one record of its sandboxes' memory peaks (a process-wide record: v1's mark is one per cgroup). */
export const memoryPeaks = new MemoryPeaks();
