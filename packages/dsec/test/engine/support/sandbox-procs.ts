/** Looking at processes: inside a sandbox (through exec `ps`) and on the host (through /proc). */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Sandbox } from '@dsec/sdk';
import { sandboxCgroupDirs } from '../../../src/host/cgroups.js';
import { capabilityMask, DEFAULT_CAPABILITIES, SANDBOX_NOFILE } from '../../../src/edge/backends/container/oci-config.js';

/**
 * Lists "STAT ARGS" lines from /proc, for images without ps (Debian minbase has no procps). Ends
 * with `true`: a process that exits mid-listing must not turn the listing's status into a failure.
 */
const PROC_LIST =
  'echo "STAT COMMAND"; for d in /proc/[0-9]*; do st=$(awk \'/^State:/{print $2}\' "$d/status" 2>/dev/null); [ -n "$st" ] || continue; ' +
  'a=$(tr \'\\0\\n\' \'  \' < "$d/cmdline" 2>/dev/null); [ -n "$a" ] && printf "%s %s\\n" "$st" "${a% }"; done; true';

/**
 * Processes in the sandbox that are alive (zombies excluded) whose args match `pattern`, from
 * `ps -e -o stat,args` run in the sandbox (or /proc when the image has no ps).
 */
export async function liveProcesses(sb: Sandbox, pattern: RegExp): Promise<string[]> {
  let res = await sb.commands.run(['ps', '-e', '-o', 'stat,args']);
  if (res.exitCode !== 0 && /not found|No such file/i.test(res.stderr)) res = await sb.commands.run(['/bin/sh', '-c', PROC_LIST]);
  assert.equal(res.exitCode, 0, `listing processes failed: ${res.stderr}`);
  return res.stdout
    .split('\n')
    .slice(1)
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('Z'))
    .map((l) => l.replace(/^\S+\s+/, ''))
    .filter((args) => pattern.test(args) && !/\bps\b -|for d in \/proc/.test(args));
}

/**
 * Polls `check` until it returns true, at most `tries` times with `intervalMs` between tries.
 * Bounded by a count, not a deadline: the test's own timeout is the only clock.
 */
export async function pollUntil(
  check: () => Promise<boolean> | boolean,
  opts: { tries?: number; intervalMs?: number } = {},
): Promise<boolean> {
  const tries = opts.tries ?? 100;
  for (let i = 0; i < tries; i++) {
    if (await check()) return true;
    await new Promise((r) => setTimeout(r, opts.intervalMs ?? 100));
  }
  return false;
}

/** Polls until no live process in the sandbox matches `pattern`; returns what is left (empty when done). */
export async function waitGone(sb: Sandbox, pattern: RegExp, tries = 50): Promise<string[]> {
  let left: string[] = [];
  await pollUntil(async () => (left = await liveProcesses(sb, pattern)).length === 0, { tries, intervalMs: 100 });
  return left;
}

export interface HostProcess {
  pid: number;
  argv: string[];
}

/** Host processes whose argv[0] is one of `exes` and whose command line names `sandboxId`. */
function hostProcessesOf(sandboxId: string, exes: readonly string[]): HostProcess[] {
  const out: HostProcess[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    let argv: string[];
    let state: string;
    try {
      argv = readFileSync(`/proc/${e}/cmdline`, 'utf8').split('\0').filter(Boolean);
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    } catch {
      continue;
    }
    if (state === 'Z' || argv.length === 0) continue;
    const exe = argv[0]!.split('/').pop()!;
    if (exes.includes(exe) && argv.some((a) => a.includes(sandboxId))) out.push({ pid: Number(e), argv });
  }
  return out;
}

/** Host processes whose argv[0] is crun and whose command line names `sandboxId`. */
export function hostCrunProcesses(sandboxId: string): HostProcess[] {
  return hostProcessesOf(sandboxId, ['crun']);
}

/**
 * Host pids of the processes that started a sandbox's commands and wait for them: `crun exec`
 * or a dsec-enter (one per running exec, session command or background process). The edge's are
 * forks of its dsec-spawn whose command line reads `dsec-enter --cgroup /dsec/<id> ...`
 * (native/spawn-enter.c); the dsec-enter binary's is its own.
 */
export function hostExecStarters(sandboxId: string): number[] {
  return hostProcessesOf(sandboxId, ['crun', 'dsec-enter'])
    .filter((p) => p.argv[0]!.endsWith('dsec-enter') || p.argv.includes('exec'))
    .map((p) => p.pid)
    .sort((a, b) => a - b);
}

/** The command lines of the dsec-enter processes of a sandbox's running commands (one per command; not an exec's standby, exec-standby.ts). */
export function enterArgvs(sandboxId: string): string[][] {
  return hostExecStarters(sandboxId)
    .map((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
      } catch {
        return [];
      }
    })
    .filter((argv) => argv[0]?.endsWith('dsec-enter') && !argv.includes('--standby')); // a process made ahead runs no command yet
}

/** The value of option `name` in a dsec-enter command line (asserting it is there). */
export function flag(argv: string[], name: string): string {
  const i = argv.indexOf(name);
  assert.ok(i >= 0 && argv[i + 1] !== undefined, `dsec-enter was started without ${name}: ${argv.join(' ')}`);
  return argv[i + 1]!;
}

/**
 * What the edge gives the starter of a command in the sandbox a running dsec-enter's command line
 * names, as the dsec-enter binary takes it: its line shows --cgroup, --pid and --seccomp first
 * (others as far as they fit, native/spawn-enter.c), the rest is what the edge gives every
 * command of an image run as root (exec/enter-child.ts). `dir` is the sandbox's scratch dir.
 */
export function enterOptionsOf(argv: string[]): { pid: string; cgroup: string; seccomp: string; dir: string; flags: string[] } {
  const cgroup = flag(argv, '--cgroup');
  const pid = flag(argv, '--pid');
  const seccomp = flag(argv, '--seccomp');
  const dir = join(seccomp, '..', 'run');
  const id = cgroup.split('/').pop()!;
  const flags = [
    ...['--pid', pid, '--cgroup', cgroup, '--uid', '0', '--gid', '0', '--caps', capabilityMask(DEFAULT_CAPABILITIES)],
    ...['--nofile', String(SANDBOX_NOFILE), '--seccomp', seccomp],
    ...sandboxCgroupDirs(id).flatMap((d) => ['--cgroup-dir', d]),
  ];
  return { pid, cgroup, seccomp, dir, flags };
}
