import { InvalidArgumentError } from 'commander';
import Table from 'cli-table3';

/** Prints rows as a table for people, or as JSON for scripts (`--json`). */
export function printTable(rows: Record<string, unknown>[], columns: string[], json: boolean): void {
  if (json) {
    process.stdout.write(JSON.stringify(rows, null, 2) + '\n');
    return;
  }
  const table = new Table({ head: columns.map((c) => c.toUpperCase()), style: { head: [], border: [] }, chars: borderless });
  for (const r of rows) table.push(columns.map((c) => String(r[c] ?? '')));
  process.stdout.write(table.toString() + '\n');
}

const borderless = {
  top: '',
  'top-mid': '',
  'top-left': '',
  'top-right': '',
  bottom: '',
  'bottom-mid': '',
  'bottom-left': '',
  'bottom-right': '',
  left: '',
  'left-mid': '',
  mid: '',
  'mid-mid': '',
  right: '',
  'right-mid': '',
  middle: '  ',
};

export function humanBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}

/** Collects repeated `--opt k=v` flags into a map. */
export function collectKv(value: string, prev: Record<string, string> = {}): Record<string, string> {
  const i = value.indexOf('=');
  if (i <= 0) throw new InvalidArgumentError(`expected KEY=VALUE, got ${JSON.stringify(value)}`);
  return { ...prev, [value.slice(0, i)]: value.slice(i + 1) };
}

export function collectList(value: string, prev: string[] = []): string[] {
  return [...prev, value];
}
