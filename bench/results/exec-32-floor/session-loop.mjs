// `node session-loop.mjs <dsec checkout, built> [count] [--session] [--prof out.cpuprofile]`:
// starts dsec in this process on a scratch data dir, one busybox sandbox, and times `true` through
// the TypeScript SDK `count` times after 30 untimed: commands.run, or with --session one session's
// run. Prints the p50 and mean, and the CPU each command took: this process (SDK, HTTP, control
// plane, edge), the edge's dsec-spawn, and its children (commands' starters and the commands).
const root = process.argv[2];
const n = Number(process.argv[3] ?? 300);
const profOut = process.argv.includes('--prof') ? process.argv[process.argv.indexOf('--prof') + 1] : undefined;
const session = process.argv.includes('--session');
const { mkdtempSync, rmSync, writeFileSync } = await import('node:fs');
const require_fs = await import('node:fs');
const dir = mkdtempSync('/var/tmp/dsec-loop-');
const { compileOptions: co } = await import(`${root}/packages/dsec/dist/src/config/options.js`);
const { buildBusyboxImage: bb } = await import(`${root}/packages/dsec/dist/src/image/builders/busybox.js`);
const { startAllInOne: start } = await import(`${root}/packages/dsec/dist/src/runtime/all-in-one.js`);
const options = co(
  { dataDir: `${dir}/dsec`, listen: '127.0.0.1:0', logLevel: 'silent', edgeId: 'loop' + process.pid.toString(16), maxSandboxes: 2 },
  {},
);
const dsec = await start(options);
const med = (x) => [...x].sort((p, q) => p - q)[Math.floor(x.length / 2)];
try {
  await bb(dsec.images, { name: 'busybox', progress: () => {} });
  const { Sandbox } = await import(`${root}/packages/sdk/dist/index.js`);
  const sb = await Sandbox.create({ url: dsec.url, apiKey: dsec.apiKey, image: 'busybox' });
  let run;
  if (session) {
    const s = await sb.sessions.create();
    run = () => s.run('true');
  } else run = () => sb.commands.run(['true']);
  for (let i = 0; i < 30; i++) await run();
  let insp;
  if (profOut) {
    const { Session } = await import('node:inspector/promises');
    insp = new Session();
    insp.connect();
    await insp.post('Profiler.enable');
    await insp.post('Profiler.setSamplingInterval', { interval: 50 });
    await insp.post('Profiler.start');
  }
  const spawnPid = dsec.edge.crun.spawner.pid;
  const pst = () => {
    const f = require_fs.readFileSync(`/proc/${spawnPid}/stat`, 'utf8').split(') ')[1].split(' ');
    return { self: (+f[11] + +f[12]) * 10, kids: (+f[13] + +f[14]) * 10 };
  };
  const cpu0 = process.cpuUsage();
  const s0 = pst();
  const t = [];
  for (let i = 0; i < n; i++) {
    const a = performance.now();
    const r = await run();
    t.push(performance.now() - a);
    if (r.exitCode !== 0) throw new Error(JSON.stringify(r));
  }
  const cpu1 = process.cpuUsage(cpu0);
  const s1 = pst();
  console.log(
    `cpu per exec: node ${((cpu1.user + cpu1.system) / 1000 / n).toFixed(3)} ms (user ${(cpu1.user / 1000 / n).toFixed(3)} sys ${(cpu1.system / 1000 / n).toFixed(3)}), dsec-spawn ${((s1.self - s0.self) / n).toFixed(3)} ms, its children (starters + commands) ${((s1.kids - s0.kids) / n).toFixed(3)} ms`,
  );
  if (insp) {
    const { profile } = await insp.post('Profiler.stop');
    writeFileSync(profOut, JSON.stringify(profile));
  }
  const mean = t.reduce((a, b) => a + b, 0) / t.length;
  const q = (f) => [...t].sort((p, r) => p - r)[Math.floor(t.length * f)].toFixed(2);
  console.log(
    `${session ? 'session' : 'exec'} p50 ${med(t).toFixed(3)} ms mean ${mean.toFixed(3)} (p10 ${q(0.1)} p25 ${q(0.25)} p75 ${q(0.75)} p90 ${q(0.9)}) | load ${(await import('node:os')).loadavg()[0].toFixed(2)}`,
  );
  await sb.kill();
} finally {
  await dsec.close({ killAll: true });
  rmSync(dir, { recursive: true, force: true });
}
