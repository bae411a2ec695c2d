import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { runTool } from 'dsec/host';
import type { CrunRawPeer } from './crun-raw.js';
import type { Peer } from './peer.js';

/** The floor peer's C source (packages/bench/native/exec-floor.c), from dist/src/peers/. */
const SOURCE = fileURLToPath(new URL('../../../native/exec-floor.c', import.meta.url));

/**
 * The kernel's floor for an exec, beside dsec and raw `crun exec` in `dsec bench exec` (issue 32):
 * a few lines of C that enter a raw crun container's namespaces with one setns(2) on a pidfd,
 * fork, exec `true` and wait (native/exec-floor.c), started by the benchmark as `crun exec` is.
 * It runs on containers of its own, made by the raw crun peer with dsec's config. Built with gcc
 * (which set-up installs for dsec's own helpers) into the run's temp dir.
 */
export class ExecFloorPeer implements Peer {
  readonly name = 'floor' as const;
  readonly description = 'not a way to make sandboxes: its containers are raw crun ones';
  readonly execDescription =
    'setns(2) into a raw crun container by pidfd (all its namespaces at once) + fork + exec `true` + wait (native/exec-floor.c)';
  readonly version: string;
  readonly pauseDescription = 'raw crun pause/resume (the floor peer has no pause of its own)';
  readonly snapshots = { unavailable: 'not applicable: the floor peer only measures an exec' };

  private constructor(
    private readonly crun: CrunRawPeer,
    private readonly binary: string,
  ) {
    this.version = 'native/exec-floor.c, built with gcc -O2 at the run';
  }

  get cgroupScope(): CrunRawPeer['cgroupScope'] {
    return this.crun.cgroupScope;
  }

  /** Builds the floor program into `dir`; throws, saying why, where it cannot. */
  static async build(crun: CrunRawPeer, dir: string): Promise<ExecFloorPeer> {
    if (!existsSync(SOURCE)) throw new Error(`its source ${SOURCE} is missing`);
    const binary = join(dir, 'exec-floor');
    const r = await runTool('gcc', ['-O2', '-o', binary, SOURCE]);
    if (r.code !== 0) throw new Error(`gcc could not build it: ${r.stderr.trim() || `exit ${r.code}`}`);
    return new ExecFloorPeer(crun, binary);
  }

  create(): Promise<string> {
    return this.crun.create();
  }

  exec(id: string, cmd: string[] = ['true']): Promise<string> {
    const pid = this.crun.initPid(id);
    return new Promise((resolve, reject) => {
      const child = spawn(this.binary, [String(pid), ...cmd], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (out += d));
      child.stderr.setEncoding('utf8').on('data', (d: string) => (err += d));
      child.on('error', reject);
      child.on('close', (code) =>
        code === 0 ? resolve(out) : reject(new Error(`exec-floor ${pid} ${cmd.join(' ')} exited ${code}: ${err.trim()}`)),
      );
    });
  }

  pause(id: string): Promise<void> {
    return this.crun.pause(id);
  }

  resume(id: string): Promise<void> {
    return this.crun.resume(id);
  }

  remove(id: string): Promise<void> {
    return this.crun.remove(id);
  }

  /** The raw crun peer owns the containers and cleans them up. */
  async close(): Promise<void> {}
}
