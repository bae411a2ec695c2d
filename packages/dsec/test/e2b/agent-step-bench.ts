/**
 * One agent step — write a file, run a command over it, read the result — through E2B's SDK →
 * dsec and through dsec's own SDK → dsec, in one run on one server, rounds interleaved so the
 * shared machine's noise falls on both alike. Each phase is timed apart so the difference can be
 * placed. Writes bench/results/e2b-agent-step-<time>.{json,md} with the command that made them.
 *
 *   node packages/dsec/dist/test/e2b/agent-step-bench.js [--rounds N]   (root; builds or reuses `base`)
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Sandbox as DsecSandbox } from '@dsec/sdk';
import { Sandbox as E2bSandbox } from 'e2b';
import { startTestServer } from '../helpers/server.js';
import { ensureBaseImage } from './base-image.js';

interface Phases {
  write: number;
  run: number;
  read: number;
  total: number;
}

const SCRIPT = 'import sys\nnums = [int(x) for x in open(sys.argv[1]).read().split()]\nprint(sum(nums))\n';
const INPUT = Array.from({ length: 100 }, (_, i) => String(i)).join(' ');

function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
}

const round2 = (n: number): number => Math.round(n * 100) / 100;

async function timed<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t = performance.now();
  const v = await f();
  return [v, performance.now() - t];
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const i = args.indexOf('--rounds');
  const rounds = i >= 0 ? Number(args[i + 1]) : 30;
  if (!Number.isInteger(rounds) || rounds < 1) throw new Error('--rounds must be a positive integer');
  const server = await startTestServer();
  try {
    await ensureBaseImage(server.dsec.images, (m) => process.stderr.write(`${m}\n`));
    const res = await fetch(`${server.url}/v1/e2b/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: '{}',
    });
    const { key } = (await res.json()) as { key: string };
    Object.assign(process.env, { E2B_API_URL: server.url, E2B_SANDBOX_URL: server.url, E2B_API_KEY: key });

    const e2b = await E2bSandbox.create('base', { timeoutMs: 3_600_000 });
    const dsec = await DsecSandbox.create({ ...server.conn, image: 'base' });
    // Both run as root in /root so the work is the same; E2B's default user would add a setpriv.
    const e2bStep = async (n: number): Promise<Phases> => {
      const [, write] = await timed(() => e2b.files.write(`/root/in-${n}.txt`, INPUT, { user: 'root' }));
      const [, run] = await timed(() =>
        e2b.commands.run(`python3 -c '${SCRIPT.replace(/'/g, "'\\''")}' /root/in-${n}.txt > /root/out-${n}.txt`, { user: 'root' }),
      );
      const [out, read] = await timed(() => e2b.files.read(`/root/out-${n}.txt`, { user: 'root' }));
      if (out !== '4950\n') throw new Error(`E2B step read ${JSON.stringify(out)}`);
      return { write, run, read, total: write + run + read };
    };
    const dsecStep = async (n: number): Promise<Phases> => {
      const [, write] = await timed(() => dsec.files.write(`/root/in-${n}.txt`, INPUT));
      const [r, run] = await timed(() =>
        dsec.commands.run(`python3 -c '${SCRIPT.replace(/'/g, "'\\''")}' /root/in-${n}.txt > /root/out-${n}.txt`),
      );
      if (r.exitCode !== 0) throw new Error(`dsec step: ${r.stderr}`);
      const [out, read] = await timed(() => dsec.files.readText(`/root/out-${n}.txt`));
      if (out !== '4950\n') throw new Error(`dsec step read ${JSON.stringify(out)}`);
      return { write, run, read, total: write + run + read };
    };
    // Attribution: E2B's endpoints without its SDK (plain fetch, on the E2B sandbox), and dsec's SDK
    // running the command the way E2B's SDK does (a login bash, on the dsec sandbox, over the input
    // its own step wrote): the differences place the overhead.
    const headers = { 'e2b-sandbox-id': e2b.sandboxId, 'x-access-token': (e2b as unknown as { envdAccessToken: string }).envdAccessToken };
    const rawStep = async (n: number): Promise<Phases> => {
      const [, write] = await timed(async () => {
        const r = await fetch(`${server.url}/files?path=/root/raw-in-${n}.txt&username=root`, {
          method: 'POST',
          headers: { ...headers, 'content-type': 'application/octet-stream' },
          body: INPUT,
        });
        if (r.status !== 200) throw new Error(`raw write: ${r.status}`);
        await r.arrayBuffer();
      });
      const [, run] = await timed(async () => {
        const r = await dsec.commands.run([
          '/bin/bash',
          '-l',
          '-c',
          `python3 -c '${SCRIPT.replace(/'/g, "'\\''")}' /root/in-${n}.txt > /root/raw-out-${n}.txt`,
        ]);
        if (r.exitCode !== 0) throw new Error(`login-shell step: ${r.stderr}`);
      });
      const [out, read] = await timed(async () =>
        (await fetch(`${server.url}/files?path=/root/out-${n}.txt&username=root`, { headers })).text(),
      );
      if (out !== '4950\n') throw new Error(`raw step read ${JSON.stringify(out)}`);
      return { write, run, read, total: write + run + read };
    };
    // warm-up: first calls open connections and fill caches
    await e2bStep(-1);
    await dsecStep(-1);
    await rawStep(-1);
    const samples: { e2b: Phases[]; dsec: Phases[]; attribution: Phases[] } = { e2b: [], dsec: [], attribution: [] };
    for (let n = 0; n < rounds; n++) {
      if (n % 2 === 0) {
        samples.e2b.push(await e2bStep(n));
        samples.dsec.push(await dsecStep(n));
      } else {
        samples.dsec.push(await dsecStep(n));
        samples.e2b.push(await e2bStep(n));
      }
      samples.attribution.push(await rawStep(n));
    }
    await e2b.kill();
    await dsec.kill();

    const phases = ['write', 'run', 'read', 'total'] as const;
    type Row = { e2bP50: number; dsecP50: number; e2bP95: number; dsecP95: number; ratioP50: number; attributionP50: number };
    const summary = Object.fromEntries(
      phases.map((p): [string, Row] => {
        const e = samples.e2b.map((s) => s[p]);
        const d = samples.dsec.map((s) => s[p]);
        const a = samples.attribution.map((s) => s[p]);
        return [
          p,
          {
            e2bP50: round2(quantile(e, 0.5)),
            dsecP50: round2(quantile(d, 0.5)),
            e2bP95: round2(quantile(e, 0.95)),
            dsecP95: round2(quantile(d, 0.95)),
            ratioP50: round2(quantile(e, 0.5) / quantile(d, 0.5)),
            attributionP50: round2(quantile(a, 0.5)),
          },
        ];
      }),
    ) as Record<(typeof phases)[number], Row>;
    const stamp = new Date()
      .toISOString()
      .replace(/[-:]/g, '')
      .replace(/\.\d+Z$/, 'Z');
    const command = `node packages/dsec/dist/test/e2b/agent-step-bench.js --rounds ${rounds}`;
    const outDir = 'bench/results';
    mkdirSync(outDir, { recursive: true });
    const base = join(outDir, `e2b-agent-step-${stamp}`);
    writeFileSync(`${base}.json`, JSON.stringify({ command, rounds, at: new Date().toISOString(), summary, samples }, null, 2) + '\n');
    const md = [
      `# One agent step: E2B SDK → dsec vs dsec SDK → dsec`,
      '',
      `Command: \`${command}\` (${new Date().toISOString()}; ${rounds} rounds each, interleaved, after one warm-up; one server, one \`base\` sandbox per SDK).`,
      '',
      'Step: write a 290-byte file, run `python3` over it writing its answer to a file, read the answer back. Milliseconds.',
      '',
      '| phase | E2B SDK p50 | dsec SDK p50 | ratio (E2B/dsec) | E2B SDK p95 | dsec SDK p95 | attribution p50 |',
      '|---|---|---|---|---|---|---|',
      ...phases.map(
        (p) =>
          `| ${p} | ${summary[p].e2bP50} | ${summary[p].dsecP50} | ${summary[p].ratioP50} | ${summary[p].e2bP95} | ${summary[p].dsecP95} | ${summary[p].attributionP50} |`,
      ),
      '',
      "Attribution column: write and read are E2B's `/files` endpoint called with plain `fetch` (no E2B SDK), so E2B SDK − attribution",
      "is the E2B SDK client's own cost and attribution − dsec SDK is the E2B server path (token and user lookup, the existence check",
      "for ownership); run is dsec's SDK running the command as E2B's SDK does (`/bin/bash -l -c`, a login shell), so attribution −",
      'dsec SDK is the login shell and E2B SDK − attribution is the E2B process path (a background process followed over a Connect',
      'stream, and the SDK). The total row of the attribution column is their sum, not a step of its own.',
      '',
    ].join('\n');
    writeFileSync(`${base}.md`, md);
    process.stdout.write(`${md}\nresults: ${base}.json\n         ${base}.md\n`);
  } finally {
    await server.close();
  }
}

await main();
