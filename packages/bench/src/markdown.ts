import type { ProfileRow } from './breakdown.js';
import type { TargetCheck } from './targets.js';

function cell(v: string | number | undefined): string {
  if (v === undefined) return 'n/a';
  if (typeof v === 'number') return Number.isFinite(v) ? String(v) : 'n/a';
  return v.replace(/\|/g, '\\|').replace(/\n/g, ' ');
}

const NUMERIC = /^(n\/a|-?[\d.]+(×|%)?)$/;

/** A GitHub-flavoured markdown table; columns of numbers are right-aligned, the rest left-aligned. */
export function mdTable(headers: string[], rows: (string | number | undefined)[][]): string {
  const align = headers.map((_, i) =>
    rows.every((r) => typeof r[i] === 'number' || r[i] === undefined || NUMERIC.test(String(r[i]))) ? '---:' : ':---',
  );
  return [headers, align, ...rows].map((r) => `| ${r.map(cell).join(' | ')} |`).join('\n');
}

/** "1.23×", or n/a when either side is missing. */
export function ratio(a: number, b: number): string {
  const r = a / b;
  return Number.isFinite(r) ? `${r.toFixed(2)}×` : 'n/a';
}

export function targetsTable(targets: TargetCheck[]): string {
  return mdTable(
    ['target', 'measured', 'result', 'margin'],
    targets.map((t) => [t.target, t.measured, t.ok === undefined ? 'not judged' : t.ok ? 'met' : 'MISSED', t.note]),
  );
}

export function profileTable(rows: ProfileRow[]): string {
  return mdTable(
    ['step', 'ms per op (mean)', '% of total'],
    rows.map((r) => [
      `${'&nbsp;&nbsp;&nbsp;&nbsp;'.repeat(r.depth)}${r.depth > 0 ? '└ ' : ''}${r.step}`,
      r.msPerOp.toFixed(2),
      `${r.percent.toFixed(1)}%`,
    ]),
  );
}
