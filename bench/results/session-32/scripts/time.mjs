// Tiny timing script: an in-process all-in-one dsec on a data dir of our own; exec vs session run.
import { randomBytes } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
const WT = process.env.WT ?? '/work/wt-session';
const { startDsec } = await import(`${WT}/packages/dsec/dist/test/helpers/server.js`);
const { buildBusyboxBashImage } = await import(`${WT}/packages/dsec/dist/test/engine/support/bash-image.js`);
const { Sandbox } = await import(`${WT}/packages/sdk/dist/index.js`);
const N = Number(process.env.N ?? 200);
const edgeId = `sf${randomBytes(3).toString('hex')}`;
const dataDir = `/var/tmp/sessfast-${edgeId}`;
mkdirSync(dataDir);
const dsec = await startDsec(dataDir, { edgeId, userns: process.env.DSEC_USERNS !== 'false' });
const conn = { url: dsec.url, apiKey: dsec.apiKey };
const q = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};
const fmt = (a) => `p50 ${q(a, 0.5).toFixed(2)} p90 ${q(a, 0.9).toFixed(2)} p99 ${q(a, 0.99).toFixed(2)} min ${Math.min(...a).toFixed(2)}`;
function cpu() {
  const u = process.cpuUsage();
  return u.user + u.system;
}
process.on('uncaughtException', async (e) => {
  console.error(e);
  await dsec.close({ killAll: true }).catch(() => {});
  rmSync(dataDir, { recursive: true, force: true });
  process.exit(1);
});
try {
  await buildBusyboxBashImage(dsec.images);
  const arms = (process.env.ARMS ?? 'exec,sh,bash,bashstate').split(',');
  const results = {};
  for (const arm of arms) {
    const sb = await Sandbox.create({ ...conn, image: arm.startsWith('bash') ? 'busybox-bash' : 'busybox' });
    let run;
    if (arm === 'exec') run = () => sb.commands.run(['true']);
    else {
      const s = await sb.sessions.create();
      if (arm === 'bashstate') await s.run('for i in $(seq 1 50); do eval "v$i=$i"; done; f() { echo hi; }; export A=1; cd /tmp');
      run = () => s.run('true');
    }
    for (let i = 0; i < 10; i++) await run();
    globalThis.__chunks = { fd3: 0, out: 0, err: 0 };
    const lat = [],
      server = [],
      cpuMs = [];
    const c0 = cpu();
    for (let i = 0; i < N; i++) {
      const t = performance.now();
      const r = await run();
      lat.push(performance.now() - t);
      server.push(r.durationMs);
      if (r.cpuMs !== undefined) cpuMs.push(r.cpuMs);
      if (r.exitCode !== 0) throw new Error(`${arm}: ${JSON.stringify(r)}`);
    }
    const cpuUs = (cpu() - c0) / N;
    if (globalThis.__chunks)
      console.log(
        '   chunks per op',
        JSON.stringify(Object.fromEntries(Object.entries(globalThis.__chunks).map(([k, v]) => [k, (v / N).toFixed(2)]))),
      );
    const pt = (globalThis.__procTrace ?? []).splice(0).slice(-N);
    if (pt.length)
      console.log(
        '   proc p50/p90 from ctor:',
        ['ctorEnd', 'spawnEv', 'exitEv', 'closeEv']
          .map((k) => {
            const v = pt.map((t) => t[k] - t.ctor).filter((x) => !Number.isNaN(x));
            return `${k} ${q(v, 0.5).toFixed(2)}/${q(v, 0.9).toFixed(2)}`;
          })
          .join(' | '),
      );
    const nt = (globalThis.__noteTrace ?? []).splice(0).slice(-N);
    if (nt.length)
      console.log(
        '   journal note ms p50/p90/p99/max',
        q(nt, 0.5).toFixed(3),
        q(nt, 0.9).toFixed(3),
        q(nt, 0.99).toFixed(3),
        Math.max(...nt).toFixed(3),
      );
    const tr = (globalThis.__sessTrace ?? []).splice(0).slice(-N);
    if (tr.length) {
      const keys = ['oomBefore', 'startShell', 'spawnEv', 'errMarker', 'outMarker', 'exitEv', 'exited', 'fd3End', 'raced', 'end', 'done'];
      const row = keys.map((k) => {
        const v = tr.map((t) => (t[k] ?? t.proc?.[k]) - t.started).filter((x) => !Number.isNaN(x));
        return v.length ? `${k} ${q(v, 0.5).toFixed(2)}/${q(v, 0.9).toFixed(2)}` : `${k} -`;
      });
      console.log('   trace p50/p90 ms from start:', row.join(' | '));
      const v = tr.map((t) => t.started - t.received);
      console.log('   queue', q(v, 0.5).toFixed(3));
    }
    results[arm] = { lat, server };
    console.log(
      `${arm.padEnd(9)} rtt ${fmt(lat)} | server ${fmt(server)} | node cpu ${cpuUs.toFixed(0)} us/op | cmd cpu p50 ${cpuMs.length ? (q(cpuMs, 0.5) * 1000).toFixed(0) : '-'} us mean ${cpuMs.length ? ((cpuMs.reduce((a, b) => a + b, 0) / cpuMs.length) * 1000).toFixed(0) : '-'} us`,
    );
    await sb.kill();
  }
  if (process.env.HIST)
    for (const [k, v] of Object.entries(results)) {
      const h = {};
      for (const x of v.lat) {
        const b = Math.floor(x);
        h[b] = (h[b] ?? 0) + 1;
      }
      console.log(k, JSON.stringify(h));
    }
} finally {
  await dsec.close({ killAll: true });
  rmSync(dataDir, { recursive: true, force: true });
}
console.log('load', (await import('node:fs')).readFileSync('/proc/loadavg', 'utf8').trim());
