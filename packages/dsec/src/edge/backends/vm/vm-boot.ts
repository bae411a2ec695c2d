import { existsSync, readFileSync, truncateSync, writeFileSync } from 'node:fs';
import { runToolOrThrow } from '../../../host/run-tool.js';
import { AgentClient } from './agent-client.js';
import { isQemuOf, type VmPaths } from './qemu-launch.js';
import { withTimeout } from './vm-state.js';

/** How long a guest may take from QEMU's start to the agent's ready (TCG on a loaded host is slow). */
const BOOT_TIMEOUT_MS = Number(process.env['DSEC_VM_BOOT_TIMEOUT_MS'] ?? 180_000);

/**
 * Connects to the agent's socket once QEMU has made it, waits for the guest's ready and gives
 * it the channel's key (before any command can run in the guest). Without a key (the guest an
 * image's snapshot is made of: each guest restored from it takes its own), it stops at ready.
 */
export async function bootAgent(pid: number, paths: VmPaths, memoryMiB: number, agentKey: string | undefined): Promise<AgentClient> {
  const deadline = Date.now() + BOOT_TIMEOUT_MS;
  const dead = (): Error =>
    new Error(
      `QEMU exited during boot: ${tail(paths.qemuLog) || '(no QEMU output)'}; guest console: ${
        tail(paths.console) ||
        `(empty: the guest kernel stopped before its console; with ${memoryMiB} MiB of guest RAM, too little memory is the usual cause)`
      }`,
    );
  let agent: AgentClient | undefined;
  while (!agent) {
    if (!isQemuOf(pid, paths)) throw dead();
    if (Date.now() > deadline) throw new Error(`QEMU made no agent socket within ${BOOT_TIMEOUT_MS} ms`);
    if (existsSync(paths.agentSocket)) agent = await AgentClient.open(paths.agentSocket).catch(() => undefined);
    if (!agent) await sleep(20);
  }
  let timer: NodeJS.Timeout | undefined;
  const watch = new Promise<never>((_, reject) => {
    const check = (): void => {
      if (!isQemuOf(pid, paths)) return reject(dead());
      if (Date.now() > deadline)
        return reject(new Error(`the guest was not ready within ${BOOT_TIMEOUT_MS} ms; console: ${tail(paths.console) || '(empty)'}`));
      timer = setTimeout(check, 100);
    };
    timer = setTimeout(check, 100);
  });
  try {
    const booted = agent;
    await Promise.race([booted.ready().then(() => (agentKey ? booted.giveKey(agentKey) : undefined)), watch]);
    return booted;
  } catch (err) {
    agent.close();
    // The channel closes when QEMU exits (a guest that panicked or powered off): say why,
    // from QEMU's own output and the guest's console, rather than "channel closed".
    for (let i = 0; i < 40 && isQemuOf(pid, paths); i++) await sleep(25);
    if (!isQemuOf(pid, paths)) throw dead();
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

/** The agent of a restored guest: it runs already (no ready event comes) and has its key, so it is pinged. */
export function reconnectAgent(paths: VmPaths, agentKey: string): Promise<AgentClient> {
  return restoredAgent(paths, agentKey, (agent) => agent.call('ping', {}), 'did not answer');
}

/**
 * The agent of a guest restored from an image's snapshot: saved before it had a key, so it is
 * given this VM's own (with its clock and RNG seed: AgentClient.giveKey), as after a boot.
 */
export function keyRestoredAgent(paths: VmPaths, agentKey: string): Promise<AgentClient> {
  return restoredAgent(paths, undefined, (agent) => agent.giveKey(agentKey), 'took no key');
}

/** A restored guest's agent once `first` (its first call) answers within 60 s; closed when it does not. */
async function restoredAgent(
  paths: VmPaths,
  agentKey: string | undefined,
  first: (agent: AgentClient) => Promise<unknown>,
  failed: string,
): Promise<AgentClient> {
  const agent = await AgentClient.open(paths.agentSocket, agentKey);
  try {
    await withTimeout(first(agent), 60_000, `the restored guest's agent ${failed} within 60 s`);
    return agent;
  } catch (err) {
    agent.close();
    throw err;
  }
}

/** A sparse file formatted ext4: the guest's writable layer, limited to its size. */
export async function makeDisk(file: string, mib: number): Promise<void> {
  writeFileSync(file, '');
  truncateSync(file, mib * 1024 * 1024);
  await runToolOrThrow('mkfs.ext4', ['-q', '-F', '-E', 'lazy_itable_init=1,lazy_journal_init=1', '-O', '^has_journal', file]);
}

/** A copy of a disk image that stays sparse (unused space of the upper disk costs nothing). */
export async function copySparse(from: string, to: string): Promise<void> {
  await runToolOrThrow('cp', ['--sparse=always', from, to]);
}

/** The last lines of a log, for an error message. */
function tail(file: string): string {
  try {
    return readFileSync(file, 'utf8').trim().split('\n').slice(-6).join(' | ').slice(-1500);
  } catch {
    return '';
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
