import { DEFAULT_MAX_OUTPUT_BYTES } from '@dsec/sdk/schema';
import { ApiError } from '../../api-error.js';

/** Output each stream of a command may keep without a reservation: the default cap. */
export const UNRESERVED_OUTPUT_BYTES = DEFAULT_MAX_OUTPUT_BYTES;

/** The budget when none is configured (DSEC_OUTPUT_BUDGET_MIB). */
export const DEFAULT_OUTPUT_BUDGET_MIB = 1024;

/** What a buffered command with this cap per stream reserves: its stdout and stderr past the unreserved part. */
export function outputReservation(maxOutputBytes: number): number {
  return 2 * Math.max(0, maxOutputBytes - UNRESERVED_OUTPUT_BYTES);
}

/**
 * Output that buffered commands (exec and session exec answered as one JSON body) may hold in the
 * control plane's memory at once. Each such result is held several times over on its way out: the
 * kept chunks, their concatenation, the decoded strings, the serialised body. One exec of 2 × 64 MiB
 * raised `dsec up`'s RSS by ~760 MiB, so a few dozen at once could take the host. A command whose
 * cap is above the default reserves its worst case (both streams, past the first 1 MiB each) before
 * it starts, and gives it back when its answer is made. A reservation that does not fit is refused
 * with 429 OUTPUT_BUDGET_EXCEEDED before anything runs in the sandbox, so a refusal changes nothing.
 *
 * Commands at the default cap reserve nothing and are never refused: they are the common case, and
 * a trainer runs thousands at once. One project may hold at most half of the budget, so one
 * tenant's large outputs cannot refuse every other's.
 */
export class OutputBudget {
  #held = 0;
  readonly #byProject = new Map<string, number>();

  constructor(readonly totalBytes: number) {}

  get heldBytes(): number {
    return this.#held;
  }

  get perProjectBytes(): number {
    return Math.floor(this.totalBytes / 2);
  }

  /** Reserves `bytes` for `project`; returns the release (safe to call twice), or throws OUTPUT_BUDGET_EXCEEDED. */
  reserve(project: string, bytes: number): () => void {
    if (bytes <= 0) return NOTHING;
    const mine = this.#byProject.get(project) ?? 0;
    if (mine + bytes > this.perProjectBytes || this.#held + bytes > this.totalBytes) {
      const mib = (n: number): number => Math.ceil(n / 2 ** 20);
      const whose =
        mine + bytes > this.perProjectBytes
          ? `this project's share (${mib(this.perProjectBytes)} MiB, half the budget)`
          : `the control plane's budget (${mib(this.totalBytes)} MiB)`;
      throw new ApiError(
        'OUTPUT_BUDGET_EXCEEDED',
        `a buffered result with maxOutputBytes this large reserves ${mib(bytes)} MiB (2 streams past the first ${UNRESERVED_OUTPUT_BYTES >> 20} MiB each), more than is left of ${whose}: stream the output (Accept: application/x-ndjson), lower maxOutputBytes, or retry when this project's running commands have answered`,
        {
          field: 'maxOutputBytes',
          reservedBytes: bytes,
          projectHeldBytes: mine,
          projectLimitBytes: this.perProjectBytes,
          heldBytes: this.#held,
          budgetBytes: this.totalBytes,
          retryable: true,
        },
      );
    }
    this.#held += bytes;
    this.#byProject.set(project, mine + bytes);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#held -= bytes;
      const left = (this.#byProject.get(project) ?? 0) - bytes;
      if (left > 0) this.#byProject.set(project, left);
      else this.#byProject.delete(project);
    };
  }
}

const NOTHING = (): void => {};
