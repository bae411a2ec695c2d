import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface, type Interface } from 'node:readline';
import { SIMULATED_EDGES_MAIN } from 'dsec/cluster';
import { DSEC_CLI_MAIN as DSEC_CLI } from 'dsec/runtime';
import { BENCH_IMAGE } from './fixture.js';

/** A child process of the benchmark, its stdout as lines, and a stop that waits for its exit. */
export class BenchChild {
  readonly lines: Interface;
  readonly #stderr: string[] = [];
  readonly exited: Promise<number | null>;

  constructor(
    readonly name: string,
    readonly proc: ChildProcess,
  ) {
    this.lines = createInterface({ input: proc.stdout! });
    proc.stderr!.on('data', (d: Buffer) => {
      this.#stderr.push(d.toString('utf8'));
      if (this.#stderr.length > 50) this.#stderr.shift();
    });
    this.exited = new Promise((r) => proc.once('exit', (code) => r(code)));
  }

  get stderr(): string {
    return this.#stderr.join('').trim().slice(-2000);
  }

  /** The first stdout line matching `re`, or an error with the child's stderr if it exits or times out first. */
  waitFor(re: RegExp, timeoutMs: number): Promise<RegExpExecArray> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => done(new Error(`${this.name} did not print ${re} within ${timeoutMs} ms; stderr: ${this.stderr || '(empty)'}`)),
        timeoutMs,
      );
      const onLine = (line: string): void => {
        const m = re.exec(line);
        if (m) done(undefined, m);
      };
      const onExit = (code: number | null): void =>
        done(new Error(`${this.name} exited (${code}) before it was ready; stderr: ${this.stderr || '(empty)'}`));
      const done = (err?: Error, m?: RegExpExecArray): void => {
        clearTimeout(timer);
        this.lines.off('line', onLine);
        this.proc.off('exit', onExit);
        if (err) reject(err);
        else resolve(m!);
      };
      this.lines.on('line', onLine);
      this.proc.once('exit', onExit);
    });
  }

  /** SIGTERM (the daemons' clean stop), then SIGKILL by pid after `graceMs`. */
  async stop(graceMs = 20_000): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    this.proc.kill('SIGTERM');
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), graceMs);
    await this.exited;
    clearTimeout(timer);
  }
}

/**
 * Node options for the children only, e.g. `DSEC_BENCH_CHILD_NODE_ARGS='--cpu-prof --cpu-prof-dir=/tmp/prof'`
 * to profile the control plane under the benchmark's load (Node refuses --cpu-prof in NODE_OPTIONS).
 */
const CHILD_NODE_ARGS = (process.env['DSEC_BENCH_CHILD_NODE_ARGS'] ?? '').split(/\s+/).filter(Boolean);

function start(name: string, args: string[], env: Record<string, string> = {}): BenchChild {
  const proc = spawn(process.execPath, [...CHILD_NODE_ARGS, ...args], { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  return new BenchChild(name, proc);
}

export interface ControlChild {
  child: BenchChild;
  url: string;
  apiKey: string;
  joinToken: string;
}

/** `dsec control` on a free loopback port and its own data dir (its state there, or in `store`: a postgres:// URL); the busybox image built through its API. */
export async function startControlChild(dataDir: string, store?: string): Promise<ControlChild> {
  const child = start('dsec control', [
    DSEC_CLI,
    'control',
    '--listen',
    '127.0.0.1:0',
    '--data-dir',
    dataDir,
    '--log-level',
    'warn',
    ...(store ? ['--store', store] : []),
  ]);
  try {
    const m = await child.waitFor(/is up at (http:\/\/\S+)/, 60_000);
    const client = JSON.parse(readFileSync(join(dataDir, 'client.json'), 'utf8')) as { apiKey: string; joinToken: string };
    const ctl = { child, url: m[1]!, apiKey: client.apiKey, joinToken: client.joinToken };
    const res = await fetch(`${ctl.url}/v1/images`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ctl.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ builder: 'busybox', name: BENCH_IMAGE }),
    });
    if (res.status !== 201) throw new Error(`building busybox on the control plane: HTTP ${res.status} ${await res.text()}`);
    return ctl;
  } catch (err) {
    await child.stop();
    throw err;
  }
}

export interface SimulatedEdgesChild {
  child: BenchChild;
  edges: { id: string; url: string }[];
  /** What each simulated edge holds now, asked over the child's stdin. */
  stats(): Promise<{ id: string; sandboxes: number; created: number }[]>;
}

/** N simulated edges in one child process of their own, joined to `join`. */
export async function startSimulatedEdgesChild(opts: {
  join: string;
  token: string;
  count: number;
  idPrefix: string;
  runDir: string;
}): Promise<SimulatedEdgesChild> {
  const child = start(
    'simulated edges',
    [SIMULATED_EDGES_MAIN, '--join', opts.join, '--count', String(opts.count), '--id-prefix', opts.idPrefix, '--run-dir', opts.runDir],
    {
      DSEC_JOIN_TOKEN: opts.token,
    },
  );
  try {
    const m = await child.waitFor(/^\{"edges":/, 30_000);
    const { edges } = JSON.parse(m.input) as { edges: { id: string; url: string }[] };
    return {
      child,
      edges,
      async stats() {
        const reply = child.waitFor(/^\{"stats":/, 10_000);
        child.proc.stdin!.write('stats\n');
        return (JSON.parse((await reply).input) as { stats: { id: string; sandboxes: number; created: number }[] }).stats;
      },
    };
  } catch (err) {
    await child.stop();
    throw err;
  }
}

/** A real `dsec edge` daemon (crun sandboxes) on a free loopback port, its own data dir, joined to `join`. */
export async function startEdgeChild(opts: {
  join: string;
  token: string;
  id: string;
  dataDir: string;
  maxSandboxes: number;
}): Promise<{ child: BenchChild; url: string }> {
  const child = start(
    `dsec edge ${opts.id}`,
    [
      DSEC_CLI,
      'edge',
      '--join',
      opts.join,
      '--listen',
      '127.0.0.1:0',
      '--data-dir',
      opts.dataDir,
      '--id',
      opts.id,
      '--max-sandboxes',
      String(opts.maxSandboxes),
      '--log-level',
      'warn',
    ],
    { DSEC_JOIN_TOKEN: opts.token },
  );
  try {
    const m = await child.waitFor(/serves (http:\/\/\S+) and joined/, 60_000);
    return { child, url: m[1]! };
  } catch (err) {
    await child.stop();
    throw err;
  }
}

/** Waits until the control plane lists `ids` as ready edges. */
export async function waitForEdges(url: string, apiKey: string, ids: string[], timeoutMs = 15_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const res = await fetch(`${url}/v1/nodes`, { headers: { authorization: `Bearer ${apiKey}` } });
    const { nodes } = (await res.json()) as { nodes: { id: string; state: string }[] };
    if (ids.every((id) => nodes.some((n) => n.id === id && n.state === 'ready'))) return;
    if (Date.now() > until) throw new Error(`edges ${ids.join(', ')} not all ready after ${timeoutMs} ms: ${JSON.stringify(nodes)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}
