/** Where progress goes: stderr, or any stream with the same shape (tests pass a fake terminal). */
export interface ProgressOutput {
  write(s: string): unknown;
  isTTY?: boolean;
  columns?: number;
}

const SPINNER = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
const BAR_WIDTH = 30;

export interface ProgressOptions {
  /** Clock in ms (tests fix it); performance.now() by default. */
  now?: () => number;
  /** Redraw interval of the spinner and elapsed time on a terminal; 0 turns the timer off. @default 100 */
  tickMs?: number;
}

/**
 * Progress of one long piece of work, for people. On a terminal: one status line at the bottom,
 * redrawn in place (a bar with counts, rate and time left when the total is known, a spinner with
 * the current step and elapsed time when it is not), with log lines scrolling above it. Anywhere
 * else (a pipe, a file, CI): plain lines, one per step, and for a bar one at most every 10 % and
 * at the end, so logs stay readable and grep-able.
 */
export class Progress {
  readonly #tty: boolean;
  readonly #now: () => number;
  readonly #started: number;
  #done = 0;
  #total: number | undefined;
  #extra: Record<string, number> = {};
  #step = '';
  #drawn = '';
  #lastDecile = -1;
  #lastPlain = '';
  #frame = 0;
  #partial = '';
  #timer: NodeJS.Timeout | undefined;
  #ended = false;

  constructor(
    readonly label: string,
    readonly out: ProgressOutput = process.stderr,
    opts: ProgressOptions = {},
  ) {
    this.#tty = out.isTTY === true;
    this.#now = opts.now ?? (() => performance.now());
    this.#started = this.#now();
    const tick = opts.tickMs ?? 100;
    if (this.#tty && tick > 0) {
      this.#timer = setInterval(() => {
        this.#frame++;
        this.#draw();
      }, tick);
      this.#timer.unref();
    }
  }

  /** Whether the output is a terminal (live redraws) rather than plain lines. */
  get tty(): boolean {
    return this.#tty;
  }

  /** done of total, with counters shown beside it (`placed 12, failed 1`). */
  update(done: number, total: number, extra: Record<string, number> = {}): void {
    this.#done = done;
    this.#total = total;
    this.#extra = extra;
    if (this.#tty) return this.#draw();
    const pct = total ? Math.floor((done / total) * 100) : 100;
    const decile = Math.floor(pct / 10);
    if (decile > this.#lastDecile || done === total) {
      this.#lastDecile = decile;
      const counters = Object.entries(extra)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ');
      this.#plain(`${this.label}: ${done}/${total} (${pct}%)${counters ? ` ${counters}` : ''}`);
    }
  }

  /** The step under way now (`Step 3/7 : RUN make`, `packing with mkfs.erofs`). */
  step(text: string): void {
    this.#step = text;
    if (this.#tty) this.#draw();
    else this.#plain(`${this.label}: ${text}`);
  }

  /**
   * Text for the log (a build's output, a message): above the status line on a terminal. Partial
   * lines are held until their newline, so a chunk of command output never splits the status.
   */
  log(text: string): void {
    const lines = (this.#partial + text).split('\n');
    this.#partial = lines.pop() ?? '';
    if (lines.length === 0) return;
    if (this.#tty) {
      this.out.write(`\r\x1b[K${lines.join('\n')}\n`);
      this.#drawn = '';
      this.#draw();
    } else this.out.write(`${lines.join('\n')}\n`);
  }

  /** Ends the status line (a terminal keeps its last state on screen), with a closing line if given. */
  end(summary?: string): void {
    if (this.#ended) return;
    this.#ended = true;
    clearInterval(this.#timer);
    if (this.#partial) this.log('\n');
    if (this.#tty) {
      if (this.#drawn) this.out.write('\n');
      if (summary) this.out.write(`${summary}\n`);
    } else if (summary) this.#plain(summary);
  }

  /** Seconds since the start, as shown. */
  elapsed(): string {
    return seconds((this.#now() - this.#started) / 1000);
  }

  #plain(line: string): void {
    if (line === this.#lastPlain) return;
    this.#lastPlain = line;
    this.out.write(`${line}\n`);
  }

  /** The status line as it is now. */
  render(): string {
    const elapsedS = (this.#now() - this.#started) / 1000;
    let line: string;
    if (this.#total !== undefined) {
      const total = this.#total;
      const pct = total ? Math.floor((this.#done / total) * 100) : 100;
      const filled = Math.round((pct / 100) * BAR_WIDTH);
      const counters = Object.entries(this.#extra)
        .map(([k, v]) => `${k} ${v}`)
        .join(', ');
      const rate = elapsedS > 0 ? this.#done / elapsedS : 0;
      const left = rate > 0 && this.#done < total ? ` · ${seconds((total - this.#done) / rate)} left` : '';
      line =
        `${this.label} [${'#'.repeat(filled)}${'.'.repeat(BAR_WIDTH - filled)}] ${this.#done}/${total} ${pct}%` +
        `${counters ? ` (${counters})` : ''} · ${rate >= 10 ? Math.round(rate) : rate.toFixed(1)}/s${left}` +
        `${this.#step ? ` · ${this.#step}` : ''}`;
    } else {
      line = `${SPINNER[this.#frame % SPINNER.length]} ${this.label}${this.#step ? `: ${this.#step}` : ''} (${seconds(elapsedS)})`;
    }
    const width = this.out.columns;
    // One terminal row: a wrapped status line could not be redrawn in place.
    return width && line.length > width - 1 ? `${line.slice(0, Math.max(0, width - 2))}…` : line;
  }

  #draw(): void {
    if (this.#ended) return;
    const line = this.render();
    if (line === this.#drawn) return;
    this.out.write(`\r${line}\x1b[K`);
    this.#drawn = line;
  }
}

/** 0.4 s, 12.3 s, 4m05s. */
function seconds(s: number): string {
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  return `${m}m${String(Math.floor(s % 60)).padStart(2, '0')}s`;
}

/** Runs `work` with a live indicator (a spinner and the time on a terminal; two lines elsewhere). */
export async function withProgress<T>(label: string, work: (p: Progress) => Promise<T>, out: ProgressOutput = process.stderr): Promise<T> {
  const p = new Progress(label, out);
  if (!p.out.isTTY) p.step('started');
  try {
    const result = await work(p);
    p.end(`${label}: done in ${p.elapsed()}`);
    return result;
  } catch (err) {
    p.end(`${label}: failed after ${p.elapsed()}`);
    throw err;
  }
}
