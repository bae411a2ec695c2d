/** The run was stopped by a signal; everything it made has been cleaned up when this reaches the caller. */
export class BenchInterrupted extends Error {
  override readonly name = 'BenchInterrupted';
  constructor(readonly signal: NodeJS.Signals) {
    super(`interrupted by ${signal}`);
  }
}

/** One undo step: what it removes, and how. */
interface Step {
  name: string;
  fn: () => Promise<void> | void;
}

/**
 * Undo steps of a benchmark run, run last-in first-out exactly once, whether the run ends,
 * fails or is interrupted. A failing step does not stop the others; its error is reported.
 */
export class Cleanup {
  readonly #steps: Step[] = [];
  #running: Promise<string[]> | undefined;

  add(name: string, fn: () => Promise<void> | void): void {
    this.#steps.push({ name, fn });
  }

  /** Runs every step once; a second call waits for the first. Returns the errors. */
  run(say: (m: string) => void = () => {}): Promise<string[]> {
    this.#running ??= (async () => {
      const errors: string[] = [];
      while (this.#steps.length > 0) {
        const step = this.#steps.pop()!;
        try {
          await step.fn();
        } catch (err) {
          const msg = `${step.name}: ${(err as Error).message}`;
          errors.push(msg);
          say(`cleanup: ${msg}`);
        }
      }
      return errors;
    })();
    return this.#running;
  }
}

/**
 * The first SIGINT/SIGTERM aborts the run: the current step finishes, the run stops at the next
 * check and cleans up on its way out. A second one cleans up at once and exits.
 */
export function trapSignals(abort: AbortController, cleanup: Cleanup, say: (m: string) => void): () => void {
  let count = 0;
  const onSignal = (signal: NodeJS.Signals): void => {
    count++;
    if (count === 1) {
      say(`${signal}: stopping after the current step, then cleaning up (again to clean up now)`);
      abort.abort(new BenchInterrupted(signal));
      return;
    }
    say(`${signal}: cleaning up now`);
    void cleanup.run(say).finally(() => process.exit(130));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  return () => {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  };
}
