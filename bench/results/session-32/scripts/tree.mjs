import { readFileSync } from 'node:fs';
const p = JSON.parse(readFileSync(process.argv[2], 'utf8'));
const target = new RegExp(process.argv[3]);
const depthMax = Number(process.argv[4] ?? 3);
const byId = new Map(p.nodes.map((n) => [n.id, n]));
const selfT = new Map();
p.samples.forEach((id, i) => selfT.set(id, (selfT.get(id) ?? 0) + (p.timeDeltas[i] ?? 0)));
const total = (id) => {
  const n = byId.get(id);
  let t = selfT.get(id) ?? 0;
  for (const c of n.children ?? []) t += total(c);
  return t;
};
const name = (n) =>
  `${n.callFrame.functionName || '(anon)'} ${n.callFrame.url.replace(/.*\/(packages|node_modules)\//, '')}:${n.callFrame.lineNumber}`;
// merge all nodes matching target (top-most), then aggregate subtree by name path
const agg = new Map();
function walk(id, path, depth) {
  const n = byId.get(id);
  const key = path + ' > ' + name(n);
  agg.set(key, (agg.get(key) ?? 0) + total(id));
  if (depth < depthMax) for (const c of n.children ?? []) walk(c, key, depth + 1);
}
function find(id, inside) {
  const n = byId.get(id);
  if (!inside && target.test(name(n))) {
    walk(id, '', 0);
    return;
  }
  for (const c of n.children ?? []) find(c, inside);
}
find(p.nodes[0].id, false);
for (const [k, t] of [...agg].sort((a, b) => a[0].localeCompare(b[0])))
  if (t > 2000) console.log((t / 1000).toFixed(1).padStart(8), k.replace(/ > [^>]*(?= > )/g, '  '));
