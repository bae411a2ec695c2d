/** One small chart: a metric, one horizontal bar per peer, and the issue's target if it has one. */
export interface ChartPanel {
  title: string;
  unit: string;
  better: 'lower' | 'higher';
  bars: { label: string; value: number }[];
  target?: { value: number; label: string };
}

const COLORS: Record<string, string> = { dsec: '#2563eb', crun: '#6b7280', podman: '#7c3aed', docker: '#0891b2' };
const PANEL_W = 470;
const LABEL_W = 70;
const VALUE_W = 80;
const BAR_H = 22;
const GAP = 8;
const COLS = 2;

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

function fmt(v: number): string {
  if (!Number.isFinite(v)) return 'n/a';
  if (Math.abs(v) >= 100) return v.toFixed(0);
  if (Math.abs(v) >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

function panelHeight(p: ChartPanel): number {
  return 46 + p.bars.length * (BAR_H + GAP) + (p.target ? 16 : 0);
}

function renderPanel(p: ChartPanel, x: number, y: number): string {
  const plotW = PANEL_W - LABEL_W - VALUE_W - 20;
  const values = p.bars.map((b) => b.value).filter(Number.isFinite);
  const max = Math.max(...values, p.target?.value ?? 0, 1e-9) * 1.05;
  const scale = (v: number): number => (Math.max(0, v) / max) * plotW;
  const out: string[] = [`<g transform="translate(${x},${y})">`];
  out.push(`<text x="0" y="16" class="t">${esc(p.title)}</text>`);
  out.push(`<text x="0" y="32" class="s">${esc(`${p.unit}, ${p.better} is better`)}</text>`);
  p.bars.forEach((b, i) => {
    const by = 42 + i * (BAR_H + GAP);
    const w = Number.isFinite(b.value) ? scale(b.value) : 0;
    out.push(`<text x="${LABEL_W - 6}" y="${by + BAR_H / 2 + 4}" class="l" text-anchor="end">${esc(b.label)}</text>`);
    out.push(`<rect x="${LABEL_W}" y="${by}" width="${w.toFixed(1)}" height="${BAR_H}" rx="3" fill="${COLORS[b.label] ?? '#9ca3af'}"/>`);
    out.push(`<text x="${(LABEL_W + w + 6).toFixed(1)}" y="${by + BAR_H / 2 + 4}" class="v">${esc(fmt(b.value))}</text>`);
  });
  if (p.target && Number.isFinite(p.target.value)) {
    const tx = LABEL_W + scale(p.target.value);
    const bottom = 42 + p.bars.length * (BAR_H + GAP);
    out.push(`<line x1="${tx.toFixed(1)}" y1="38" x2="${tx.toFixed(1)}" y2="${bottom}" class="target"/>`);
    out.push(`<text x="${tx.toFixed(1)}" y="${bottom + 12}" class="tl" text-anchor="middle">${esc(p.target.label)}</text>`);
  }
  out.push('</g>');
  return out.join('\n');
}

/** A self-contained SVG (no fonts, scripts or links) of panels laid out two to a row. */
export function renderChart(title: string, subtitle: string, panels: ChartPanel[]): string {
  const rows: ChartPanel[][] = [];
  for (let i = 0; i < panels.length; i += COLS) rows.push(panels.slice(i, i + COLS));
  const parts: string[] = [];
  let y = 62;
  for (const row of rows) {
    row.forEach((p, c) => parts.push(renderPanel(p, 20 + c * (PANEL_W + 20), y)));
    y += Math.max(...row.map(panelHeight)) + 18;
  }
  const width = 20 + COLS * (PANEL_W + 20);
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${y}" viewBox="0 0 ${width} ${y}" font-family="sans-serif">`,
    '<style>.h{font-size:18px;font-weight:bold}.sub{font-size:12px;fill:#4b5563}.t{font-size:14px;font-weight:bold}.s{font-size:11px;fill:#6b7280}',
    '.l{font-size:12px}.v{font-size:12px;fill:#111827}.tl{font-size:10px;fill:#dc2626}.target{stroke:#dc2626;stroke-width:1.5;stroke-dasharray:4 3}</style>',
    `<rect width="${width}" height="${y}" fill="#ffffff"/>`,
    `<text x="20" y="28" class="h">${esc(title)}</text>`,
    `<text x="20" y="48" class="sub">${esc(subtitle)}</text>`,
    ...parts,
    '</svg>',
    '',
  ].join('\n');
}
