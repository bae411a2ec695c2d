/**
 * The test's own record of the sandboxes the API accepted (a create that answered with an id)
 * and of the kills it asked for, so that after a kill -9 of dsec every accepted sandbox can be
 * accounted for against what the restarted dsec lists: running (or paused), failed with a reason,
 * or gone because its kill was asked for before the crash. One that is none of these is lost.
 */
import type { SandboxInfo } from '@dsec/sdk/schema';
import type { CycleTracking } from './soak-cycle.js';

/** Where the sandboxes stand after one restart. Only `lost` and `unaccounted` are wrong. */
export interface Accounting {
  /** Accepted sandboxes not yet known gone, at the crash. */
  outstanding: number;
  running: number;
  paused: number;
  failedWithReason: number;
  /** A few of those reasons, as the API gives them. */
  reasons: string[];
  /** Not listed, and their kill had been asked for (its answer cut by the crash): gone as asked. */
  killedAtCrash: number;
  /** Listed, but their create's answer was cut by the crash (the caller never got the id). */
  unacknowledged: number;
  /** Accepted, not listed, never asked to be killed. */
  lost: string[];
  /** Listed in a state that is neither running, paused nor failed with a reason (or listed after a kill that was answered). */
  unaccounted: string[];
}

export class SandboxLedger {
  /** Ever accepted. */
  acceptedTotal = 0;
  /** Accepted and not known gone. */
  readonly #outstanding = new Set<string>();
  /** Kill asked for, answer not seen. */
  readonly #killing = new Set<string>();
  /** Kill answered: gone with its record. */
  readonly #killed = new Set<string>();

  readonly track: CycleTracking = {
    created: (id) => {
      this.acceptedTotal++;
      this.#outstanding.add(id);
    },
    killing: (id) => this.#killing.add(id),
    killed: (id) => this.gone(id),
  };

  /** `id` was killed and the kill answered. */
  gone(id: string): void {
    this.#outstanding.delete(id);
    this.#killing.delete(id);
    this.#killed.add(id);
  }

  /** Accepted sandboxes not known gone. */
  get outstanding(): string[] {
    return [...this.#outstanding];
  }

  /**
   * Accounts for every outstanding sandbox against `list` (the restarted dsec's, with no create
   * still `creating`). Those gone as asked, and the lost, are settled here; the rest stay until killed.
   */
  account(list: SandboxInfo[]): Accounting {
    const listed = new Map(list.map((s) => [s.id, s]));
    const out: Accounting = {
      outstanding: this.#outstanding.size,
      running: 0,
      paused: 0,
      failedWithReason: 0,
      reasons: [],
      killedAtCrash: 0,
      unacknowledged: 0,
      lost: [],
      unaccounted: [],
    };
    const judge = (s: SandboxInfo): void => {
      if (s.status === 'running') out.running++;
      else if (s.status === 'paused') out.paused++;
      else if (s.status === 'failed' && s.reason) {
        out.failedWithReason++;
        if (out.reasons.length < 3) out.reasons.push(`${s.id}${this.#killing.has(s.id) ? ' (its kill asked for)' : ''}: ${s.reason}`);
      } else out.unaccounted.push(`${s.id}: ${s.status}${s.reason ? ` (${s.reason})` : ''}`);
    };
    for (const id of [...this.#outstanding]) {
      const s = listed.get(id);
      if (s) judge(s);
      else if (this.#killing.has(id)) {
        out.killedAtCrash++;
        this.gone(id);
      } else {
        out.lost.push(id);
        this.#outstanding.delete(id); // reported once
      }
    }
    for (const s of list) {
      if (this.#killed.has(s.id)) out.unaccounted.push(`${s.id}: listed as ${s.status} after its kill was answered`);
      else if (!this.#outstanding.has(s.id)) {
        out.unacknowledged++;
        judge(s);
      }
    }
    return out;
  }
}
