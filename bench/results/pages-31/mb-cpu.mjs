// CPU time (this process, user+sys) per page: page()+fast-json-stringify vs pageJson, alternating, same process.
import { StateStore } from '/work/wt-pages/packages/dsec/dist/src/control/state-store.js';
import { SandboxList } from '/work/wt-pages/packages/sdk/dist/schema/index.js';
import { createRequire } from 'node:module';
const require = createRequire('/work/wt-pages/packages/dsec/package.json');
const ser = require('fast-json-stringify')(JSON.parse(JSON.stringify(SandboxList)));
const store = await StateStore.open('/var/tmp/pages-mb/state.db');
const t = { objects: [], json: [] };
const cpu = () => {
  const c = process.cpuUsage();
  return (c.user + c.system) / 1000;
};
for (let r = 0; r < 8; r++) {
  let after;
  for (;;) {
    const f = { labels: { 'hold-batch': '0' }, limit: 1000, ...(after ? { after } : {}) };
    const c0 = cpu();
    const p = await store.sandboxes.page(f);
    const a = ser(p);
    const c1 = cpu();
    const b = await store.sandboxes.pageJson(f);
    const c2 = cpu();
    if (a !== b) throw new Error('differ');
    t.objects.push(c1 - c0);
    t.json.push(c2 - c1);
    if (!p.next) break;
    after = p.next;
  }
}
const qq = (v, f) => {
  const s = [...v].sort((x, y) => x - y);
  return s[Math.floor(f * (s.length - 1))].toFixed(2);
};
const sum = (v) => v.reduce((a, b) => a + b, 0);
for (const [k, v] of Object.entries(t))
  console.log(k, 'cpu ms/page mean', (sum(v) / v.length).toFixed(2), 'p50', qq(v, 0.5), 'n', v.length);
await store.close();
