// edge.exec timeline: request → started → exit → close, from the returned HelperChild's events.
// `node edge-exec-timeline.mjs <dsec checkout, built> [count]`: starts dsec in this process on a
// scratch data dir, one busybox sandbox, and times the edge's own exec of `true` (no HTTP, no
// control plane) `count` times after 20 untimed; prints the p50 and the median of each part:
// before the starter is asked, the ask (the write to dsec-spawn), to `started`, to the exit, to
// the pipes' close, after it.
const root = process.argv[2];
const n = Number(process.argv[3] ?? 300);
const { mkdtempSync, rmSync } = await import('node:fs');
const dir = mkdtempSync('/var/tmp/dsec-loop-');
const { compileOptions: co } = await import(`${root}/packages/dsec/dist/src/config/options.js`);
const { buildBusyboxImage: bb } = await import(`${root}/packages/dsec/dist/src/image/builders/busybox.js`);
const { startAllInOne: start } = await import(`${root}/packages/dsec/dist/src/runtime/all-in-one.js`);
const { SpawnHelper } = await import(`${root}/packages/dsec/dist/src/host/spawn-helper.js`);
const marks = [];
const nodeLines = [];
for (const m of ['enter', 'stream']) {
  const orig = SpawnHelper.prototype[m];
  if (!orig) continue;
  SpawnHelper.prototype[m] = function (...a) {
    const t0 = performance.now();
    const h0 = process.hrtime.bigint();
    const c = orig.apply(this, a);
    const rec = { t0, ask: performance.now(), h: { ask0: h0 } };
    rec.h.ask1 = process.hrtime.bigint();
    c.once('spawn', () => {
      rec.started = performance.now();
      rec.h.started = process.hrtime.bigint();
    });
    c.once('exit', () => {
      rec.exit = performance.now();
      rec.h.exit = process.hrtime.bigint();
    });
    c.once('close', () => {
      rec.close = performance.now();
      rec.h.close = process.hrtime.bigint();
    });
    marks.push(rec);
    return c;
  };
}
const options = co(
  { dataDir: `${dir}/dsec`, listen: '127.0.0.1:0', logLevel: 'silent', edgeId: 'loop' + process.pid.toString(16), maxSandboxes: 2 },
  {},
);
const dsec = await start(options);
try {
  await bb(dsec.images, { name: 'busybox', progress: () => {} });
  const { Sandbox } = await import(`${root}/packages/sdk/dist/index.js`);
  const sb = await Sandbox.create({ url: dsec.url, apiKey: dsec.apiKey, image: 'busybox' });
  const t = [];
  const ph = { pre: [], ask: [], started: [], exit: [], close: [], post: [] };
  if (process.env.PAUSE) {
    await dsec.node.exec(sb.id, { cmd: ['true'] });
    console.log('READY', (await import('node:child_process')).execSync('pgrep -x dsec-spawn').toString().trim());
    await new Promise((r) => setTimeout(r, Number(process.env.PAUSE)));
  }
  for (let i = 0; i < n + 20; i++) {
    marks.length = 0;
    const a = performance.now();
    const ha = process.hrtime.bigint();
    const r = await dsec.node.exec(sb.id, { cmd: ['true'] });
    const b = performance.now();
    const hb = process.hrtime.bigint();
    if (i >= 20)
      nodeLines.push(
        `N a ${ha}\nN ask0 ${marks[0].h.ask0}\nN ask1 ${marks[0].h.ask1}\nN started ${marks[0].h.started}\nN exit ${marks[0].h.exit}\nN close ${marks[0].h.close}\nN b ${hb}`,
      );
    if (r.exitCode !== 0) throw new Error(JSON.stringify(r));
    if (i < 20) continue;
    t.push(b - a);
    const m = marks[0];
    ph.pre.push(m.t0 - a);
    ph.ask.push(m.ask - m.t0);
    ph.started.push(m.started - m.ask);
    ph.exit.push(m.exit - m.started);
    ph.close.push(m.close - m.exit);
    ph.post.push(b - m.close);
  }
  const med = (x) => [...x].sort((p, q) => p - q)[Math.floor(x.length / 2)].toFixed(3);
  console.log(
    `edge.exec p50 ${med(t)} ms | before ask ${med(ph.pre)} ask ${med(ph.ask)} →started ${med(ph.started)} →exit ${med(ph.exit)} →close ${med(ph.close)} after ${med(ph.post)} | load ${(await import('node:os')).loadavg()[0].toFixed(2)}`,
  );
  (await import('node:fs')).writeFileSync('/tmp/x32/node.txt', nodeLines.join('\n') + '\n');
  await sb.kill();
} finally {
  await dsec.close({ killAll: true });
  rmSync(dir, { recursive: true, force: true });
}
