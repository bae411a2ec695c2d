/**
 * crun calls a previous run of this edge left in flight. The edge starts crun through its
 * resident dsec-spawn, which leaves a running tool to finish when the edge dies (a `crun run -d`
 * must not take its container down with it). After a kill -9 of dsec during creates, those crun
 * runs go on: one that finishes after the restarted edge has read crun's state and torn down the
 * half-made sandbox starts a container that nothing knows (its init running, its cgroups made,
 * its rootfs held in its own mount namespace). So before a start reads crun's state, every crun
 * call on this edge's state root that is not its own is waited for, and killed when it does not
 * finish in time; whatever a killed one half-made is then found by the start's reconcile.
 */
import { readdirSync, readFileSync } from 'node:fs';

/**
 * Pids of processes started with `--root ROOT`: crun calls on that state root (or a wrapper of
 * crun an operator put first on PATH). The root is this edge's alone, under its data dir.
 */
export function crunCallsOn(root: string): number[] {
  const pids: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      const argv = readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0');
      const i = argv.indexOf('--root');
      if ((i >= 0 && argv[i + 1] === root) || argv.includes(`--root=${root}`)) pids.push(Number(e));
    } catch {
      // exited meanwhile, or not ours to read
    }
  }
  return pids;
}

/**
 * Waits until no crun call on `root` runs, up to `graceMs`, then kills those left (SIGKILL: a
 * crun stuck that long will not finish) and waits for them to go. Returns what it waited for and
 * what it killed, for the start's log.
 */
export async function settleCrunCalls(root: string, graceMs = 30_000): Promise<{ waited: number[]; killed: number[] }> {
  const waited = crunCallsOn(root);
  const deadline = Date.now() + graceMs;
  let left = waited;
  while (left.length && Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
    left = crunCallsOn(root);
  }
  for (const pid of left) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  while (crunCallsOn(root).length) await new Promise((r) => setTimeout(r, 20));
  return { waited, killed: left };
}
