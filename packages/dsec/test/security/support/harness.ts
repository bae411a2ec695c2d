/**
 * Shared pieces of the red-team suite: running attack commands in a sandbox (with the command's
 * own timeout, which `commands.run` cannot set), raw-syscall probes, a bystander sandbox that must
 * stay unaffected, and small readers of /proc status lines.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Connection, type Sandbox } from '@dsec/sdk';
import type { ExecRequest, ExecResult, NetworkPolicyRequest, NetworkPolicyResult, SandboxInfo } from '@dsec/sdk/schema';
import type { TestServer } from '../../helpers/server.js';
import { buildProbe, probeOutcome, type ProbeOutcome, type Step } from './raw-syscall.js';

/** Runs an attack command; `timeoutMs` is the command's own timeout (the whole tree is killed after it). */
export async function attack(
  server: TestServer,
  sb: Sandbox | string,
  cmd: ExecRequest['cmd'],
  opts: Omit<ExecRequest, 'cmd'> = {},
): Promise<ExecResult> {
  const id = typeof sb === 'string' ? sb : sb.id;
  const body: ExecRequest = { cmd, timeoutMs: 60_000, ...opts };
  return new Connection(server.conn).json<ExecResult>('POST', `/v1/sandboxes/${id}/exec`, {
    json: body,
    timeoutMs: (body.timeoutMs ?? 60_000) + 60_000,
  });
}

/** A compact, printable view of an exec result for assertion messages. */
export function show(r: ExecResult): string {
  return JSON.stringify({
    exitCode: r.exitCode,
    stdout: r.stdout.slice(0, 1500),
    stderr: r.stderr.slice(0, 1500),
    timedOut: r.timedOut,
    oomKilled: r.oomKilled,
  });
}

/** Runs `cmd` and asserts it exited 0 (set-up steps of an attack, not the attack itself). */
export async function must(
  server: TestServer,
  sb: Sandbox | string,
  cmd: ExecRequest['cmd'],
  opts: Omit<ExecRequest, 'cmd'> = {},
): Promise<ExecResult> {
  const r = await attack(server, sb, cmd, opts);
  assert.equal(r.exitCode, 0, `set-up command ${JSON.stringify(cmd)} failed: ${show(r)}`);
  return r;
}

/** Uploads a raw-syscall probe for `steps` and runs it in the sandbox. */
export async function probeInSandbox(server: TestServer, sb: Sandbox, steps: Step[]): Promise<ProbeOutcome & { raw: ExecResult }> {
  const path = `/tmp/.probe-${randomBytes(4).toString('hex')}`;
  await sb.files.write(path, buildProbe(steps), { mode: 0o755 });
  const raw = await attack(server, sb, [path], { timeoutMs: 30_000 });
  await attack(server, sb, ['rm', '-f', path]);
  assert.equal(raw.timedOut, false, `probe hung: ${show(raw)}`);
  return { ...probeOutcome(raw.stdout, raw.exitCode), raw };
}

/**
 * The same probe on the host, outside any sandbox, as a baseline: what the kernel answers when
 * neither seccomp nor a dropped capability is in the way. Only for calls that are harmless on the
 * host (they change nothing outside the probe process).
 */
export function probeOnHost(steps: Step[]): ProbeOutcome {
  const dir = mkdtempSync(join(tmpdir(), 'dsec-redteam-probe-'));
  try {
    const bin = join(dir, 'probe');
    writeFileSync(bin, buildProbe(steps));
    chmodSync(bin, 0o755);
    const r = spawnSync(bin, [], { encoding: 'utf8', timeout: 30_000 });
    assert.equal(r.signal, null, `host probe died of ${r.signal}`);
    return probeOutcome(r.stdout, r.status ?? -1);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** PUT /network: the runtime egress policy switch. */
export async function setNetwork(server: TestServer, id: string, policy: NetworkPolicyRequest): Promise<NetworkPolicyResult> {
  return new Connection(server.conn).json<NetworkPolicyResult>('PUT', `/v1/sandboxes/${id}/network`, { json: policy, timeoutMs: 60_000 });
}

/** GET the sandbox (inspect, with live usage). */
export async function inspect(server: TestServer, id: string): Promise<SandboxInfo> {
  return new Connection(server.conn).json<SandboxInfo>('GET', `/v1/sandboxes/${id}`);
}

/** The bystander: a sandbox every attack file keeps aside, which must still work at the end. */
export async function assertBystanderUnaffected(server: TestServer, bystander: Sandbox, extra?: () => Promise<void>): Promise<void> {
  const info = await inspect(server, bystander.id);
  assert.equal(info.status, 'running', `the bystander sandbox is ${info.status}: ${info.reason ?? ''}`);
  const r = await attack(server, bystander, 'echo ok');
  assert.equal(r.exitCode, 0, show(r));
  assert.equal(r.stdout, 'ok\n');
  assert.equal(info.usage?.oomKills ?? 0, 0, 'the bystander had processes OOM-killed');
  await extra?.();
}

/** Parses `Key:\tvalue` lines of /proc/<pid>/status. */
export function parseStatus(text: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of text.split('\n')) {
    const i = line.indexOf(':');
    if (i > 0) m.set(line.slice(0, i), line.slice(i + 1).trim());
  }
  return m;
}

/** Capability numbers (linux/capability.h) the attacks care about. */
export const CAP = {
  CAP_DAC_READ_SEARCH: 2,
  CAP_NET_ADMIN: 12,
  CAP_NET_RAW: 13,
  CAP_SYS_MODULE: 16,
  CAP_SYS_RAWIO: 17,
  CAP_SYS_PTRACE: 19,
  CAP_SYS_ADMIN: 21,
  CAP_SYS_BOOT: 22,
  CAP_SYS_TIME: 25,
  CAP_SYSLOG: 34,
  CAP_PERFMON: 38,
  CAP_BPF: 39,
} as const;

/** Whether capability `bit` is set in a hex mask from /proc/<pid>/status (CapEff etc.). */
export function hasCap(hexMask: string, bit: number): boolean {
  return ((BigInt(`0x${hexMask}`) >> BigInt(bit)) & 1n) === 1n;
}

export function md5(data: Buffer | string): string {
  return createHash('md5').update(data).digest('hex');
}

/** A random token for markers and canaries. */
export function token(prefix: string): string {
  return `${prefix}-${randomBytes(8).toString('hex')}`;
}
