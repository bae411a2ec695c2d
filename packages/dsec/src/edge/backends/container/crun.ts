import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { nullStdio } from '../../../host/private-null.js';
import { runTool, ToolError, signalNumber } from '../../../host/run-tool.js';
import type { SpawnHelper } from '../../../host/spawn-helper.js';

export interface CrunState {
  status: 'created' | 'running' | 'stopped' | 'paused' | string;
  pid: number;
}

/**
 * crun, with a state root of dsec's own (so `crun list` shows only this edge's sandboxes).
 * A detached container inherits its creator's stdio, so `run` gives crun /dev/null for all three
 * and reads crun's own errors from a --log file instead: the sandbox's output never lands on the
 * host and the edge never waits on a pipe the container holds.
 */
export class Crun {
  /**
   * `spawner`: the edge's dsec-spawn, which starts `crun run`, `crun delete` and `crun exec`
   * (exec/crun-exec-child.ts) so the edge does not fork for them; without it (the bench's raw
   * crun floor) they are spawned from this process, as anyone calling crun would.
   */
  constructor(
    readonly root: string,
    readonly spawner?: SpawnHelper,
  ) {
    mkdirSync(root, { recursive: true });
  }

  globalArgs(): string[] {
    return ['--root', this.root];
  }

  /**
   * Starts a detached container and returns its init's host pid (from --pid-file: no extra `crun state`).
   * With the edge's dsec-spawn, crun runs in a copy of its small template mount namespace
   * (SpawnHelper.runCarried), not in the edge's, which holds every sandbox's mounts: crun clones
   * the namespace it runs in, so a create there would cost O(sandboxes on the node). Carried into
   * it: the bundle (the sandbox's root, user namespace file and volume mounts live in it), the
   * state root, and `hostDirs` (other dirs the config binds from, e.g. volumes' data dirs), so
   * crun sees each as the edge does. `logFile` and `pidFile` must be in the bundle.
   */
  async run(id: string, bundle: string, logFile: string, pidFile: string, hostDirs: readonly string[] = []): Promise<number> {
    rmSync(logFile, { force: true });
    const args = [
      ...this.globalArgs(),
      `--log=file:${logFile}`,
      '--log-format=json',
      'run',
      '-d',
      '--pid-file',
      pidFile,
      '--bundle',
      bundle,
      id,
    ];
    const carry = [...new Set([bundle, this.root, ...hostDirs])].filter((d, i) => i === 0 || !d.startsWith(`${bundle}/`));
    const code = this.spawner
      ? (await this.spawner.runCarried('crun', args, carry, { stdio: 'ignore' })).code
      : await new Promise<number>((resolve) => {
          const none = nullStdio(); // not the host's /dev/null (private-null.ts)
          const child = spawn('crun', args, { stdio: [none, none, none] });
          child.on('error', () => resolve(127));
          child.on('exit', (c, s) => resolve(c ?? 128 + signalNumber(s)));
        });
    if (code !== 0) throw new ToolError('crun', args, { code, stdout: '', stderr: readCrunLog(logFile) });
    return Number(readFileSync(pidFile, 'utf8'));
  }

  async state(id: string): Promise<CrunState | undefined> {
    const r = await runTool('crun', [...this.globalArgs(), 'state', id]);
    if (r.code !== 0) return undefined;
    return JSON.parse(r.stdout) as CrunState;
  }

  /** Kills and deletes; a container that is already gone is not an error. */
  async delete(id: string): Promise<void> {
    const args = [...this.globalArgs(), 'delete', '-f', id];
    const r = this.spawner ? await this.spawner.run('crun', args, { stdio: 'pipe' }) : await runTool('crun', args);
    if (r.code !== 0 && !/does not exist|No such file/i.test(r.stderr)) throw new ToolError('crun', args, r);
  }

  /**
   * Every container under this state root. A failed listing (a busy lock, a state file crun cannot
   * parse) throws with crun's stderr: an empty list would read as "nothing runs" and a caller
   * would tear down live sandboxes.
   */
  async list(): Promise<{ id: string; pid: number; status: string }[]> {
    const args = [...this.globalArgs(), 'list', '--format', 'json'];
    const r = await runTool('crun', args);
    if (r.code !== 0) throw new ToolError('crun', args, r);
    try {
      return (JSON.parse(r.stdout || '[]') as { id: string; pid: number; status: string }[] | null) ?? [];
    } catch (err) {
      throw new ToolError('crun', args, { ...r, stderr: `unreadable JSON from crun list: ${(err as Error).message}` });
    }
  }
}

/** The pid crun wrote to a --pid-file, or undefined while it has not written one yet. */
export function readPidFile(pidFile: string): number | undefined {
  try {
    const pid = Number(readFileSync(pidFile, 'utf8'));
    return pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** crun's JSON log lines → the messages a person needs to read. */
export function readCrunLog(logFile: string): string {
  let text = '';
  try {
    text = readFileSync(logFile, 'utf8');
  } catch {
    return '(crun left no log)';
  }
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      try {
        return (JSON.parse(line) as { msg?: string }).msg ?? line;
      } catch {
        return line;
      }
    })
    .join('\n');
}
