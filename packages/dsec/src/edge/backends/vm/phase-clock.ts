/**
 * How long each step of a VM's create took (ms since the previous mark), kept in its record
 * (`createPhases`): where a create's time goes is the first thing to know when making it faster,
 * and a restore's steps (QEMU's start, reading the state, the agent) differ from a boot's.
 */
export class PhaseClock {
  readonly phases: Record<string, number> = {};
  #last = performance.now();
  readonly #start = this.#last;

  /** Ends the step called `name` now (a step marked twice adds up). */
  mark(name: string): void {
    const now = performance.now();
    this.phases[name] = round((this.phases[name] ?? 0) + now - this.#last);
    this.#last = now;
  }

  get totalMs(): number {
    return round(performance.now() - this.#start);
  }
}

function round(ms: number): number {
  return Math.round(ms * 10) / 10;
}
