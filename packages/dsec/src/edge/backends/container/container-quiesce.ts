import { readdirSync, readFileSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import { cgroupTreePids, sandboxCgroupDirs } from '../../../host/cgroups.js';
import { freeze, thaw } from '../../../host/freezer.js';
import type { EdgeQuiesce } from '../../protocol/edge-api.js';
import type { EdgeSessionCarry } from '../../protocol/schemas.js';
import type { LiveSandbox } from './live-sandbox.js';
import { execStandbyPid, execStandbyStarting } from './exec/exec-standby.js';

/** How long ended processes get to be gone before the move is refused (they were SIGKILLed: milliseconds). */
const END_WAIT_MS = 5_000;
/** How long killed processes get to go while frozen before the cgroup is thawed for them. */
const THAW_AFTER_MS = 200;
/** The saved state of a sandbox's sessions that moves with it, at most. */
const SESSIONS_CARRY_BYTES = 8 << 20;
/** How long a quiesce waits for callers' calls in flight to end. */
const CALLS_WAIT_MS = 2_000;
/**
 * How long it waits for an exec standby on its way (the edge's own process, its pid not yet
 * reported by dsec-spawn) to be known. It takes milliseconds, but seconds on a loaded node; it is
 * not the caller's work, so the caller's move must not be refused (or, with `endProcesses`, the
 * standby counted and ended) for it.
 */
const OWN_WAIT_MS = 30_000;
/** A command line is named this long at most in the answer. */
const CMD_MAX = 200;

/**
 * Holds a container still for a move (EdgeApi.quiesceSandbox). It is frozen first, so nothing
 * starts or forks between the look at its processes and what is done about them. A container's
 * processes cannot move (no checkpointer), so any besides its init are either the reason the move
 * is refused (the sandbox thawed again, as it was) or, with `endProcesses`, SIGKILLed while frozen
 * — a fatal signal ends a task in a frozen cgroup2 cgroup; a cgroup v1 freezer holds it until a
 * thaw, so one is done there, with the kill already pending.
 */
export async function quiesceContainer(l: LiveSandbox, endProcesses: boolean, marker: string): Promise<EdgeQuiesce> {
  try {
    const q = await quiesce(l, endProcesses, marker);
    if (!q.frozen) rmSync(marker, { force: true });
    return q;
  } catch (err) {
    l.quiesced = false; // calls are served again; a resume undoes the freeze
    rmSync(marker, { force: true });
    throw err;
  }
}

async function quiesce(l: LiveSandbox, endProcesses: boolean, marker: string): Promise<EdgeQuiesce> {
  const id = l.record.id;
  const wasPaused = l.record.paused === true;
  // No caller's call gets in from here on (ContainerBackend.#serving): what is packed is final.
  l.quiesced = true;
  // Calls that got in before: what a file call writes must be in the pack, and a command still
  // starting is a process not yet to be seen. A short wait; a command that runs on makes the
  // sandbox busy, as its process would.
  // The processes made ahead that are still on their way (none is begun from here on) are waited
  // for too, until their pids are known: they are the edge's and must not be counted as the
  // sandbox's. So are answered session commands' shells still exiting (answered from fd 3).
  // A session's shell still exiting gets the callers' 2 s, not more: what it runs on exit (a trap)
  // is the sandbox's to decide. A frozen sandbox's standby cannot finish starting: no wait then.
  const settling = (): boolean => (l.calls ?? 0) > 0 || l.sessions.settling();
  for (const until = Date.now() + CALLS_WAIT_MS; settling() && Date.now() < until;) await new Promise((r) => setTimeout(r, 5));
  const ownWait = wasPaused ? 0 : OWN_WAIT_MS;
  for (const until = Date.now() + ownWait; execStandbyStarting(id) && Date.now() < until;) await new Promise((r) => setTimeout(r, 5));
  if ((l.calls ?? 0) > 0 && !endProcesses) {
    l.quiesced = false;
    const busy = { pid: 0, cmd: `${l.calls} call(s) of the API still running (a command, a file call)` };
    return { processes: [busy], ended: false, wasPaused, frozen: false };
  }
  if (!wasPaused) {
    writeFileSync(marker, '');
    await freeze(id);
  }
  l.record.paused = true;
  const dirs = sandboxCgroupDirs(id);
  // Its processes by both of what makes one its own: its cgroups (with its commands' own below
  // them) and its pid namespace (what every command joins), so none is missed by either alone.
  // The processes made ahead for its next exec and its sessions' next commands are the edge's,
  // not the sandbox's work: they run nothing yet, need not move and go with the sandbox (none is
  // made while it is quiesced: live-sandbox.ts standbyAllowed), or serve it on if it stays.
  const ahead = new Set([...l.sessions.standbyPids(), ...[execStandbyPid(id)].filter((p) => p !== undefined)]);
  const others = (): number[] =>
    [...new Set([...cgroupTreePids(dirs), ...pidNamespaceMembers(l.record.pid)])].filter(
      (pid) => pid !== l.record.pid && !ahead.has(pid) && !isZombie(pid),
    );
  const pids = others();
  const processes = pids.map((pid) => ({ pid: innerPid(pid) ?? pid, cmd: commandLine(pid) }));
  if (processes.length === 0) return { processes, ended: false, wasPaused, frozen: true, ...carriedSessions(l) };
  if (!endProcesses) {
    l.quiesced = false;
    if (!wasPaused) {
      await thaw(id);
      l.record.paused = false;
    }
    return { processes, ended: false, wasPaused, frozen: false };
  }
  for (const pid of pids) kill(pid);
  const until = Date.now() + END_WAIT_MS;
  // A v1 freezer holds a killed task until a thaw: one is done if they are not gone by then.
  const thawAt = Date.now() + THAW_AFTER_MS;
  let thawed = false;
  for (;;) {
    const left = others();
    if (left.length === 0) break;
    if (Date.now() > until) throw new Error(`sandbox ${id}: processes ${left.join(', ')} did not end after SIGKILL`);
    // Forked between the look and the kill (not possible while frozen), or held by a v1 freezer.
    for (const pid of left) kill(pid);
    if (!thawed && Date.now() > thawAt) {
      await thaw(id);
      thawed = true;
    }
    await new Promise((r) => setTimeout(r, 10));
  }
  if (thawed) await freeze(id);
  return { processes, ended: true, wasPaused, frozen: true, ...carriedSessions(l) };
}

/** Processes in the pid namespace of `init` (host pids), init included. */
function pidNamespaceMembers(init: number | undefined): number[] {
  if (!init) return [];
  let ns: string;
  try {
    ns = readlinkSync(`/proc/${init}/ns/pid`);
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readlinkSync(`/proc/${name}/ns/pid`) === ns) out.push(Number(name));
    } catch {
      // gone, or a kernel thread
    }
  }
  return out;
}

/**
 * Its open sessions, to reopen where it moves, within SESSIONS_CARRY_BYTES of saved state (a
 * create request stays well under the edge's body limit); one past that is not carried (its next
 * command answers SESSION_NOT_FOUND).
 */
function carriedSessions(l: LiveSandbox): { sessions: EdgeSessionCarry[] } {
  let left = SESSIONS_CARRY_BYTES;
  const sessions: EdgeSessionCarry[] = [];
  for (const s of l.sessions.carried()) {
    const size = (s.state?.script.length ?? 0) + (s.state?.cwd.length ?? 0);
    if (size > left) continue;
    left -= size;
    sessions.push(s);
  }
  return { sessions };
}

function kill(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // gone already
  }
}

/** A zombie waits for the (frozen) init to reap it: it runs nothing and holds nothing that moves. */
function isZombie(pid: number): boolean {
  try {
    return /^State:\s+Z/m.test(readFileSync(`/proc/${pid}/status`, 'utf8'));
  } catch {
    return true; // gone
  }
}

/** The pid as the sandbox's own pid namespace numbers it (the last NSpid field). */
function innerPid(pid: number): number | undefined {
  try {
    const line = /^NSpid:\s+(.+)$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
    const last = line?.trim().split(/\s+/).pop();
    return last === undefined ? undefined : Number(last);
  } catch {
    return undefined;
  }
}

function commandLine(pid: number): string {
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
    // dsec's own starter, before it execs the command it enters the sandbox for: the dsec-enter
    // binary, or a fork of dsec-spawn whose command line reads `dsec-enter ...` (native/spawn-enter.c).
    const exe = argv[0];
    if (exe === 'dsec-enter' || exe?.endsWith('/dsec-enter') || exe?.endsWith('/crun')) return 'a command being started';
    const cmd = argv.join(' ');
    return cmd.length > CMD_MAX ? `${cmd.slice(0, CMD_MAX)}…` : cmd;
  } catch {
    return '';
  }
}
