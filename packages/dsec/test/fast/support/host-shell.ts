/**
 * A SessionHost whose shells are plain host processes (no sandbox): ShellSession's own logic
 * (the program it feeds, markers, the state on fd 3, the table around it) run against a real
 * shell, in a test that needs no root. `shells` maps the session's shell to the host binary that
 * plays it (the host's /bin/sh is dash; `busybox sh` is the busybox images' ash).
 */
import { spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { CappedOutput } from '../../../src/edge/backends/shared/capped-output.js';
import type { OutputListener, ProcessExit } from '../../../src/edge/backends/shared/command-process.js';
import type { SessionHost, SessionShellProcess } from '../../../src/edge/backends/shared/shell-session.js';

export function hostShellSessionHost(shells: Record<string, string[]> = {}): SessionHost {
  return {
    startShell(argv, o): SessionShellProcess {
      const [shell, ...args] = argv;
      const [binary, ...pre] = shells[shell!] ?? [shell!];
      const env = o.clearEnv ? {} : { PATH: process.env['PATH'] ?? '/usr/bin:/bin', ...o.env };
      const child = spawn(binary!, [...pre, ...args], { cwd: o.cwd ?? '/', env, stdio: ['pipe', 'pipe', 'pipe', 'pipe'] });
      const listeners = new Set<OutputListener>();
      const fd3 = new CappedOutput(o.fd3MaxBytes);
      const fd3Stream = child.stdio[3] as Readable;
      fd3Stream.on('data', (d: Buffer) => fd3.push(d));
      const fd3Ended = new Promise<void>((resolve) => fd3Stream.once('close', resolve));
      for (const name of ['stdout', 'stderr'] as const) {
        child[name].on('data', (d: Buffer) => {
          for (const l of listeners) l(name, d, d);
        });
      }
      child.stdin.on('error', () => undefined);
      child.stdin.end(o.input);
      let exit: ProcessExit | undefined;
      const exited = new Promise<number>((resolve) => child.once('exit', (c, s) => resolve(c ?? (s ? 128 : 1))));
      const done = new Promise<ProcessExit>((resolve) =>
        child.once('close', (c) => {
          exit = { exitCode: c ?? 1, timedOut: false, killed: false, durationMs: 0 };
          resolve(exit);
        }),
      );
      return {
        exited,
        done,
        get exit() {
          return exit;
        },
        fd3,
        fd3Ended,
        onOutput(l) {
          listeners.add(l);
          return () => listeners.delete(l);
        },
        kill: () => void child.kill('SIGKILL'),
        spawnedAt: performance.now(),
      };
    },
    oomKills: () => 0,
    endTagged: () => undefined,
  };
}
