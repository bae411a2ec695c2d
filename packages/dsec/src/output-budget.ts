import { DEFAULT_MAX_OUTPUT_BYTES } from '@dsec/sdk/schema';
import { ApiError } from './api-error.js';

/** Output each stream of a command may keep without a reservation: the default cap. */
export const UNRESERVED_OUTPUT_BYTES = DEFAULT_MAX_OUTPUT_BYTES;

/** What a command with this cap per stream reserves: its stdout and stderr past the unreserved part. */
export function outputReservation(maxOutputBytes: number): number {
  return 2 * Math.max(0, maxOutputBytes - UNRESERVED_OUTPUT_BYTES);
}

/**
 * The bytes a string takes in a JSON body, at most: UTF-8's, plus 5 for each character JSON escapes
 * (a control character goes as \u00XX, 6 bytes for 1; a quote or backslash as 2). Output of
 * control bytes is 6 times its size in a buffered result; reservations are made for bytes kept, so
 * a result tops its reservation up by this much past it before it is sent (ExecService).
 */
export function jsonBodyBytes(s: string): number {
  let escaped = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c === 0x22 || c === 0x5c) escaped++;
  }
  return Buffer.byteLength(s) + 5 * escaped;
}

/** How a budget names itself and its owners in a refusal's message. */
export interface BudgetNames {
  /** The whole, e.g. "the control plane's budget (--output-budget-mib)". */
  whole: string;
  /** One owner's part, e.g. "this project's share". */
  owner: string;
  /** What else the caller can do, after "stream the output, lower maxOutputBytes, or …". */
  otherwise: string;
}

/**
 * Output that commands may keep in memory past the default cap, as reservations of their worst
 * case made before they start: a command whose cap is above the default reserves both streams past
 * the first 1 MiB each (outputReservation) and gives it back when its output is dropped. One that
 * does not fit is refused with 503 OUTPUT_BUDGET_EXCEEDED before anything runs, so a refusal changes
 * nothing in the sandbox. Commands at the default cap reserve nothing and are never refused: they are
 * the common case, and a trainer runs thousands at once.
 *
 * One owner (a project, a sandbox) may hold at most `ownerShare` of the whole, so one tenant's large
 * outputs cannot refuse every other's.
 *
 * Used twice: the control plane's for buffered results (ExecService, FnService: each result is
 * held several times over on its way out, so one exec of 2 × 64 MiB raised `dsec up`'s RSS by
 * ~760 MiB), and each sandbox's for its background processes' kept output (ProcessTable).
 */
export class OutputBudget {
  #held = 0;
  readonly #byOwner = new Map<string, number>();

  constructor(
    readonly totalBytes: number,
    readonly names: BudgetNames,
    readonly ownerShare = 1,
  ) {}

  get heldBytes(): number {
    return this.#held;
  }

  get perOwnerBytes(): number {
    return Math.floor(this.totalBytes * this.ownerShare);
  }

  /** Whether `bytes` more would fit for `owner` now. */
  fits(owner: string, bytes: number): boolean {
    return bytes <= 0 || ((this.#byOwner.get(owner) ?? 0) + bytes <= this.perOwnerBytes && this.#held + bytes <= this.totalBytes);
  }

  /**
   * Reserves `bytes` for `owner`; returns the release (safe to call twice), or throws
   * OUTPUT_BUDGET_EXCEEDED. `what` starts the refusal's message (default: a maxOutputBytes's
   * reservation), `details` are added to it.
   */
  reserve(owner: string, bytes: number, refusal: { what?: string; hint?: string; details?: Record<string, unknown> } = {}): () => void {
    if (bytes <= 0) return NOTHING;
    const mine = this.#byOwner.get(owner) ?? 0;
    if (!this.fits(owner, bytes)) {
      const mib = (n: number): number => Math.ceil(n / 2 ** 20);
      const ownerFull = mine + bytes > this.perOwnerBytes;
      const whose =
        ownerFull && this.ownerShare < 1
          ? `${this.names.owner} (${mib(this.perOwnerBytes)} MiB)`
          : `${this.names.whole} (${mib(this.totalBytes)} MiB)`;
      throw new ApiError(
        'OUTPUT_BUDGET_EXCEEDED',
        `${refusal.what ?? `maxOutputBytes this large reserves ${mib(bytes)} MiB (2 streams past the first ${UNRESERVED_OUTPUT_BYTES >> 20} MiB each)`}, more than is left of ${whose}: ${refusal.hint ?? 'stream the output (Accept: application/x-ndjson), lower maxOutputBytes'}, or ${this.names.otherwise}`,
        {
          ...refusal.details,
          field: 'maxOutputBytes',
          reservedBytes: bytes,
          ownerHeldBytes: mine,
          ownerLimitBytes: this.perOwnerBytes,
          heldBytes: this.#held,
          budgetBytes: this.totalBytes,
          retryable: true,
        },
      );
    }
    this.#held += bytes;
    this.#byOwner.set(owner, mine + bytes);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#held -= bytes;
      const left = (this.#byOwner.get(owner) ?? 0) - bytes;
      if (left > 0) this.#byOwner.set(owner, left);
      else this.#byOwner.delete(owner);
    };
  }
}

const NOTHING = (): void => {};

/**
 * An answer that holds a read's bytes (a background process's output, a file) until it is sent,
 * or an upload's body read whole before its call (until its answer is sent):
 * what it takes past the free 2 MiB is reserved from `budget`, and `hold` gives it back. A client
 * that does not read its answers holds its project's share, then is refused, not the host's memory.
 */
export function holdAnswer(
  budget: OutputBudget,
  owner: string,
  bytes: number,
  what: string,
  hold: Hold | undefined,
  hint = 'read later offsets in parts as the output grows',
): void {
  const over = bytes - 2 * UNRESERVED_OUTPUT_BYTES;
  if (!hold || over <= 0) return;
  hold(budget.reserve(owner, over, { what: `${what} is ${Math.ceil(bytes / 2 ** 20)} MiB`, hint }));
}

/** Takes a reservation, to give back later: once an answer is sent (http/release-when-sent.ts). */
export type Hold = (release: () => void) => void;

/** What a command's result says of how it ran, for a refusal made after it ran. */
export interface RanResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  stdoutBytes: number;
  stderrBytes: number;
}

/**
 * A buffered result's JSON can take more than its reservation: control bytes go as \u00XX, 6
 * bytes for 1, and a command at the default cap reserved nothing. What it takes past the free
 * 2 MiB and `reserved` is reserved too before it is sent. Returns the release of both; when the
 * rest does not fit, gives `release` back and throws RESULT_TOO_LARGE (507, not retryable) saying the
 * command ran and how it ended (`details.ran`, `details.exitCode`).
 */
export function withBodyReserved(
  budget: OutputBudget,
  owner: string,
  reserved: number,
  result: RanResult,
  release: () => void,
): () => void {
  const body = jsonBodyBytes(result.stdout) + jsonBodyBytes(result.stderr);
  const more = body - 2 * UNRESERVED_OUTPUT_BYTES - reserved;
  if (more <= 0) return release;
  let extra: () => void;
  try {
    extra = budget.reserve(owner, more, {
      what: `the command ran (exit code ${result.exitCode}), but its result is ${Math.ceil(body / 2 ** 20)} MiB of JSON (control characters are sent as \\u00XX, 6 bytes each)`,
      hint: 'ask for encoding base64 (4/3 of the bytes), stream the output (Accept: application/x-ndjson), read the answers already sent for',
      details: { ran: true, exitCode: result.exitCode, stdoutBytes: result.stdoutBytes, stderrBytes: result.stderrBytes },
    });
  } catch (err) {
    release();
    // Not the retryable refusal of a command that has not run: running it again runs it again.
    if (err instanceof ApiError) throw new ApiError('RESULT_TOO_LARGE', err.message, { ...err.details, retryable: false });
    throw err;
  }
  return () => {
    release();
    extra();
  };
}

/**
 * A buffered command's whole life under the output budget: its cap's reservation (outputReservation)
 * made before `run` starts it, its JSON's excess reserved once it ran (withBodyReserved), and both
 * handed to `hold` (given back once the answer is sent) or, without one, given back at its return.
 */
export async function withOutputReserved<R extends RanResult>(
  budget: OutputBudget,
  owner: string,
  maxOutputBytes: number,
  run: () => Promise<R>,
  hold?: Hold,
): Promise<R> {
  const reserved = outputReservation(maxOutputBytes);
  const reservation = budget.reserve(owner, reserved);
  let release: (() => void) | undefined = reservation;
  try {
    const result = await run();
    release = withBodyReserved(budget, owner, reserved, result, reservation);
    if (hold) {
      hold(release);
      release = undefined;
    }
    return result;
  } finally {
    release?.();
  }
}
