import type { Logger } from 'pino';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { ownerGone, ownerTag } from '../host/process-owner.js';

/**
 * A sandbox made for a process's own work (a Dockerfile build's step) carries this label, whose
 * value names the process (host/process-owner.ts). When that process is gone (killed mid-build,
 * or the build's `finally` could not reach the control plane), nobody will kill the sandbox: the
 * control plane does.
 */
export const OWNER_LABEL = 'dsec.owner';
/** Set beside OWNER_LABEL, so the sweep lists only owned sandboxes (the list filters on k=v). */
export const OWNED_LABEL = 'dsec.owned';

/** The labels of a sandbox owned by this process. */
export function ownedLabels(): Record<string, string> {
  return { [OWNED_LABEL]: 'process', [OWNER_LABEL]: ownerTag() };
}

/** How often the sweep looks (it lists the sandboxes that carry the label). */
const SWEEP_EVERY_MS = 10_000;

export class OwnedSandboxes {
  #last = 0;

  constructor(
    private readonly deps: {
      list: (labels: Record<string, string>) => Promise<SandboxInfo[]>;
      kill: (id: string) => Promise<void>;
      log: Logger;
    },
  ) {}

  /** Kills the sandboxes (and removes the records) whose owner process is gone; at most every 10 s unless `force`. Returns their ids. */
  async sweep(now = Date.now(), force = false): Promise<string[]> {
    if (!force && now - this.#last < SWEEP_EVERY_MS) return [];
    this.#last = now;
    const killed: string[] = [];
    for (const s of await this.deps.list({ [OWNED_LABEL]: 'process' })) {
      const owner = s.labels[OWNER_LABEL];
      // A create in flight is left to its create; anything else (a failed or stopped record too)
      // has nobody left to read or kill it.
      if (owner === undefined || s.status === 'creating' || !ownerGone(owner)) continue;
      try {
        await this.deps.kill(s.id);
        killed.push(s.id);
        this.deps.log.warn({ sandbox: s.id, owner }, 'killed a sandbox whose owner process is gone (a build killed mid-step)');
      } catch (err) {
        this.deps.log.error({ err, sandbox: s.id }, 'could not kill a sandbox whose owner process is gone');
      }
    }
    return killed;
  }
}
