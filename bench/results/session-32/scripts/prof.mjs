import { readFileSync } from 'node:fs';
const p = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const byId = new Map(p.nodes.map((n) => [n.id, n]));
const parent = new Map();
for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
const self = new Map();
const dt = p.timeDeltas;
let total = 0;
const counts = new Map();
p.samples.forEach((id, i) => {
  counts.set(id, (counts.get(id) ?? 0) + (dt[i] ?? 0));
  total += dt[i] ?? 0;
});
const incl = new Map();
for (const [id, t] of counts) {
  const n = byId.get(id);
  const k = `${n.callFrame.functionName || '(anon)'} ${n.callFrame.url.replace(/.*\/(packages|node_modules)\//, '')}:${n.callFrame.lineNumber}`;
  self.set(k, (self.get(k) ?? 0) + t);
  const seen = new Set();
  for (let x = id; x !== undefined; x = parent.get(x)) {
    const m = byId.get(x);
    const kk = `${m.callFrame.functionName || '(anon)'} ${m.callFrame.url.replace(/.*\/(packages|node_modules)\//, '')}:${m.callFrame.lineNumber}`;
    if (seen.has(kk)) continue;
    seen.add(kk);
    incl.set(kk, (incl.get(kk) ?? 0) + t);
  }
}
const filt = process.argv[3] ? new RegExp(process.argv[3]) : null;
console.log('total ms', (total / 1000).toFixed(0));
console.log('--- self');
for (const [k, t] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 30)) console.log((t / 1000).toFixed(1).padStart(8), k);
console.log('--- inclusive' + (filt ? ` /${filt.source}/` : ''));
for (const [k, t] of [...incl]
  .filter(([k]) => !filt || filt.test(k))
  .sort((a, b) => b[1] - a[1])
  .slice(0, 60))
  console.log((t / 1000).toFixed(1).padStart(8), k);
