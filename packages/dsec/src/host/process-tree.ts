import { readFileSync, readdirSync } from 'node:fs';

/** Parent pid of each process, read from /proc/<pid>/stat (the field after the command name). */
function parentMap(): Map<number, number[]> {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue;
    }
    const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
    const list = children.get(ppid) ?? [];
    list.push(Number(entry));
    children.set(ppid, list);
  }
  return children;
}

/** Whether process `pid` exists (signal 0: nothing is sent). */
export function isProcessAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** `pid` and all its descendants, as seen from the host. */
export function processTree(pid: number): number[] {
  const children = parentMap();
  const out: number[] = [];
  const queue = [pid];
  while (queue.length) {
    const p = queue.shift()!;
    out.push(p);
    queue.push(...(children.get(p) ?? []));
  }
  return out;
}

/** SIGKILLs a process tree, parents first so none of them forks a replacement. */
export function killTree(pid: number): void {
  // Two passes: a child forked while the first pass ran is caught by the second.
  for (let pass = 0; pass < 2; pass++) {
    for (const p of processTree(pid)) {
      try {
        process.kill(p, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
}
