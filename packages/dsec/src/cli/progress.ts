/**
 * A live progress line on a terminal (redrawn in place), or one line per step when the output is
 * a pipe or a file, so logs stay readable.
 */
export class ProgressLine {
  readonly #tty: boolean;
  #last = '';
  #lastPrint = 0;

  constructor(
    readonly label: string,
    readonly out: NodeJS.WriteStream = process.stderr,
  ) {
    this.#tty = out.isTTY === true;
  }

  /** done/total with extra counters; a non-terminal gets a line at most every 10 % (and at the end). */
  update(done: number, total: number, extra: Record<string, number> = {}): void {
    const pct = total ? Math.floor((done / total) * 100) : 100;
    const counters = Object.entries(extra).map(([k, v]) => `${k} ${v}`).join(', ');
    if (this.#tty) {
      const width = 30;
      const filled = Math.round((pct / 100) * width);
      const line = `${this.label} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${done}/${total} ${pct}%${counters ? ` (${counters})` : ''}`;
      if (line !== this.#last) this.out.write(`\r${line}\x1b[K`);
      this.#last = line;
      return;
    }
    const step = Math.floor(pct / 10);
    if (step > this.#lastPrint || done === total) {
      this.#lastPrint = step;
      const line = `${this.label}: ${done}/${total} (${pct}%)${counters ? ` ${counters}` : ''}`;
      if (line !== this.#last) this.out.write(`${line}\n`);
      this.#last = line;
    }
  }

  end(): void {
    if (this.#tty && this.#last) this.out.write('\n');
  }
}
