/** Collects a terminal's output and waits (by polling a bounded number of times) for text in it. */
import { pollUntil } from './sandbox-procs.js';

export class TermCapture {
  #text = '';
  readonly onData = (data: Uint8Array): void => {
    this.#text += Buffer.from(data).toString('utf8');
  };

  get text(): string {
    return this.#text;
  }

  /** Output received after `from` (a previous length of text). */
  since(from: number): string {
    return this.#text.slice(from);
  }

  /** Waits until the output after `from` matches; returns the match or undefined. */
  async waitFor(re: RegExp, from = 0, tries = 300): Promise<RegExpMatchArray | undefined> {
    let m: RegExpMatchArray | null = null;
    await pollUntil(() => (m = this.#text.slice(from).match(re)) !== null, { tries, intervalMs: 50 });
    return m ?? undefined;
  }
}
