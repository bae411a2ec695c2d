import { createHash, randomBytes } from 'node:crypto';
import { Image, Sandbox, resolveConnection } from '@dsec/sdk';
import { printTable } from '../output.js';
import type { ServerOptions } from '../../config/options.js';
import { findLeaks } from '../../host/leak-check.js';
import { buildBusyboxImage } from '../../image/builders/busybox.js';
import { ImageStore } from '../../image/image-store.js';
import { LayerStore } from '../../image/layer-store.js';
import { findRunningServer, startAllInOne, type RunningDsec } from '../../runtime/all-in-one.js';
import { round, summarize, type Summary } from './stats.js';

export interface DemoReport {
  ok: boolean;
  sandboxes: number;
  url: string;
  startedServer: boolean;
  wallSeconds: number;
  latencyMs: Record<'create' | 'writeFile' | 'exec' | 'readFile' | 'kill', Summary>;
  createsPerSecond: number;
  failures: string[];
  leaks: string[];
}

const say = (m: string): void => void process.stderr.write(`${m}\n`);

/**
 * The main job: what a trainer does, 50 times at once. Each sandbox gets a task file, runs a
 * program over it, and the result is read back and checked against the host's own computation.
 */
export async function runDemo(opts: {
  options: ServerOptions;
  count: number;
  json: boolean;
  /** The server DSEC_URL names (cli/commands/image-server.ts): the demo runs there, through its API only. */
  remote?: string | undefined;
}): Promise<DemoReport> {
  const { options, count, remote } = opts;
  let server: RunningDsec | undefined;
  // DSEC_URL/DSEC_API_KEY as every client command reads them (the SDK's resolution).
  let conn = remote ? resolveConnection() : await findRunningServer(options.dataDir);
  if (conn) say(`using the dsec already running at ${conn.url}${remote ? ' (DSEC_URL; its host is not checked for leaks from here)' : ''}`);
  else {
    say('starting dsec (control plane + local edge) in this process…');
    server = await startAllInOne({ ...options, listen: '127.0.0.1:0' });
    for (const c of server.doctor) {
      if (c.fixed) say(`doctor: ${c.fixed}`);
      else if (!c.ok) say(`doctor warning: ${c.name}: ${c.detail}`);
    }
    conn = { url: server.url, apiKey: server.apiKey };
    say(`dsec is up at ${conn.url}`);
  }
  if (remote) {
    // The server's image store, not this host's: the image the sandboxes run is the server's.
    say('building the default image (busybox) on the server, if it has none…');
    await Image.build({ ...conn, builder: 'busybox' });
  } else {
    const images = new ImageStore(options.dataDir, new LayerStore(options.dataDir));
    if (!images.resolve('busybox')) say('building the default image (busybox)…');
    await buildBusyboxImage(images, { progress: (m) => say(`  ${m}`) });
  }

  const runLabel = `demo-${randomBytes(3).toString('hex')}`;
  const lat = { create: [] as number[], writeFile: [] as number[], exec: [] as number[], readFile: [] as number[], kill: [] as number[] };
  const failures: string[] = [];
  const created: Sandbox[] = [];
  const timed = async <T>(bucket: number[], fn: () => Promise<T>): Promise<T> => {
    const t = performance.now();
    const v = await fn();
    bucket.push(performance.now() - t);
    return v;
  };

  say(`creating ${count} sandboxes concurrently and running an agent-like step in each…`);
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: count }, async (_, i) => {
      try {
        const sb = await timed(lat.create, () =>
          Sandbox.create({ ...conn, image: 'busybox', resources: { memoryMiB: 64, cpu: 0.5, pids: 64 }, labels: { demo: runLabel } }),
        );
        created.push(sb);
        const words = Array.from({ length: 50 + i }, () => randomBytes(3).toString('hex'));
        const input = words.join(' ') + '\n';
        await timed(lat.writeFile, () => sb.files.write('/work/input.txt', input));
        const r = await timed(lat.exec, () =>
          sb.commands.run('cd /work && wc -w < input.txt > out.txt && md5sum input.txt | cut -d" " -f1 >> out.txt'),
        );
        if (r.exitCode !== 0) throw new Error(`exec exited ${r.exitCode}: ${r.stderr}`);
        const out = (await timed(lat.readFile, () => sb.files.readText('/work/out.txt'))).trim().split('\n');
        const md5 = createHash('md5').update(input).digest('hex');
        if (Number(out[0]) !== words.length || out[1] !== md5)
          throw new Error(`wrong result in sandbox: ${JSON.stringify(out)}, expected ${words.length} ${md5}`);
      } catch (err) {
        failures.push(`sandbox ${i}: ${(err as Error).message}`);
      }
    }),
  );
  const createWall = (performance.now() - t0) / 1000;
  say(`killing ${created.length} sandboxes…`);
  await Promise.all(
    created.map((sb) => timed(lat.kill, () => sb.kill()).catch((err: Error) => failures.push(`kill ${sb.id}: ${err.message}`))),
  );
  const wallSeconds = (performance.now() - t0) / 1000;

  // Mounts, cgroups and containers are the server's host's: checked only when that is this one.
  const leaks = remote ? [] : await findLeaks(options.dataDir, { onlyIds: created.map((s) => s.id) });
  const leftover = await Sandbox.list({ ...conn, labels: { demo: runLabel } });
  for (const s of leftover) leaks.push(`sandbox record ${s.id} (${s.status})`);
  if (server) {
    // With the server stopped, its layer mounts must be gone too (other sandboxes on the host,
    // e.g. another dsec's, are not ours to count).
    await server.close({ killAll: false });
    leaks.push(...(await findLeaks(options.dataDir, { onlyIds: created.map((s) => s.id), includeLayers: true })));
  }

  const report: DemoReport = {
    ok: failures.length === 0 && leaks.length === 0 && created.length === count,
    sandboxes: count,
    url: conn.url,
    startedServer: !!server,
    wallSeconds: round(wallSeconds, 2),
    latencyMs: {
      create: summarize(lat.create),
      writeFile: summarize(lat.writeFile),
      exec: summarize(lat.exec),
      readFile: summarize(lat.readFile),
      kill: summarize(lat.kill),
    },
    createsPerSecond: round(count / createWall, 1),
    failures,
    leaks,
  };
  if (!opts.json) {
    const rows = Object.entries(report.latencyMs).map(([op, s]) => ({
      operation: op,
      count: s.count,
      'p50 ms': s.p50,
      'p99 ms': s.p99,
      'max ms': s.max,
    }));
    printTable(rows, ['operation', 'count', 'p50 ms', 'p99 ms', 'max ms'], false);
    process.stdout.write(
      `${count} sandboxes, ${count} agent steps in ${report.wallSeconds} s: ${report.createsPerSecond} sandboxes/s created and driven concurrently\n`,
    );
    for (const f of failures) process.stdout.write(`FAILED ${f}\n`);
    process.stdout.write(
      leaks.length
        ? `LEAKED:\n  ${leaks.join('\n  ')}\n`
        : remote
          ? 'cleanup verified: no sandbox record left (the server host was not checked for mounts, cgroups, containers or directories)\n'
          : 'cleanup verified: no sandbox, mount, cgroup, crun container or directory left\n',
    );
    process.stdout.write(report.ok ? 'demo ok\n' : 'demo FAILED\n');
  }
  return report;
}
