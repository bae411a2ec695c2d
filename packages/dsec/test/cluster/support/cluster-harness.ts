/**
 * A cluster on one machine, for tests and demos: one control plane (`dsec control`) and N edge
 * daemons (`dsec edge --join`), each a real child process. Every edge lives in its own network
 * namespace, joined to the control plane by a bridge with link-local addresses (169.254.X.0/24,
 * a third octet no dsec link uses in practice and never 169.254.169.254), so an edge can be cut
 * off with nftables and a stranger can be put on the bridge. Edges have their own data dirs: no
 * filesystem is shared, layers come over the blob endpoint. Only the network namespace is
 * separate (nsenter --net), so the edges' mounts and cgroups stay visible to the leak checks.
 */
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Connection } from '@dsec/sdk';
import type { NodeInfo } from '@dsec/sdk/schema';
import { ownerGone, ownerTag } from '../../../src/host/process-owner.js';
import { makeDataDir, newEdgeId } from '../../helpers/server.js';

const MAIN = resolve(fileURLToPath(import.meta.url), '../../../../src/cli/main.js');

function sh(cmd: string, args: string[], opts: { allowFail?: boolean } = {}): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0 && !opts.allowFail) throw new Error(`${cmd} ${args.join(' ')} failed: ${r.stderr}`);
  return r.stdout;
}

/**
 * Each harness's owner (host/process-owner.ts), in a file named after its tag: a test process
 * killed before close() leaves its namespaces and bridge (with the bridge's /24) on the host, and
 * the next harness removes those whose owner is gone.
 */
export const HARNESS_OWNERS = '/run/dsec-test-harness';

/** Removes the namespaces (`dsec-<tag>-*`) and bridge (`dsbr<tag>`) of harnesses whose owner process is gone. */
export function sweepAbandonedHarnesses(): string[] {
  const swept: string[] = [];
  for (const tag of existsSync(HARNESS_OWNERS) ? readdirSync(HARNESS_OWNERS) : []) {
    if (!ownerGone(readFileSync(join(HARNESS_OWNERS, tag), 'utf8').trim())) continue;
    removeHarnessNetwork(tag);
    rmSync(join(HARNESS_OWNERS, tag), { force: true });
    swept.push(tag);
  }
  return swept;
}

function removeHarnessNetwork(tag: string): void {
  for (const ns of existsSync('/run/netns') ? readdirSync('/run/netns') : []) {
    if (ns.startsWith(`dsec-${tag}-`)) sh('ip', ['netns', 'delete', ns], { allowFail: true });
  }
  sh('ip', ['link', 'delete', `dsbr${tag}`], { allowFail: true });
}

/** A fresh tag, its owner file written, after the sweep (which frees an abandoned bridge's /24 for claimSubnet). */
function claimTag(): string {
  sweepAbandonedHarnesses();
  const tag = randomBytes(3).toString('hex');
  mkdirSync(HARNESS_OWNERS, { recursive: true });
  writeFileSync(join(HARNESS_OWNERS, tag), ownerTag());
  return tag;
}

/** A locally administered unicast MAC for the bridge of harness `tag` (six hex digits). */
function bridgeMac(tag: string): string {
  return `02:d5:ec:${tag.slice(0, 2)}:${tag.slice(2, 4)}:${tag.slice(4, 6)}`;
}

/**
 * Each harness's /24, claimed by a file `<HARNESS_SUBNETS>/<third>` created with O_EXCL and holding
 * the owner (host/process-owner.ts): two harnesses started at once (test files run in parallel,
 * scripts/run-tests.mjs) both saw a free /24 in the host's addresses before either had added its
 * bridge's, and took the same one. A claim whose owner is gone is taken over.
 */
export const HARNESS_SUBNETS = '/run/dsec-test-harness-subnets';

/** A /24 in 169.254.{247,246,245,244}.0 that no live harness claims and no host address or route touches. */
function claimSubnet(): number {
  mkdirSync(HARNESS_SUBNETS, { recursive: true });
  const used = sh('ip', ['-4', '-o', 'addr', 'show']) + sh('ip', ['-4', 'route', 'show']);
  for (const third of [247, 246, 245, 244]) {
    const claim = join(HARNESS_SUBNETS, String(third));
    if (existsSync(claim) && ownerGone(readFileSync(claim, 'utf8').trim())) rmSync(claim, { force: true });
    if (used.includes(`169.254.${third}.`)) continue;
    try {
      writeFileSync(claim, ownerTag(), { flag: 'wx' });
      return third;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
    }
  }
  throw new Error('no free link-local /24 for the cluster bridge');
}

export interface HarnessEdge {
  index: number;
  id: string;
  netns: string;
  address: string;
  dataDir: string;
  url: string;
  proc?: ChildProcess;
  log: string[];
}

export class ClusterHarness {
  readonly tag = claimTag();
  readonly bridge = `dsbr${this.tag}`;
  readonly third = claimSubnet();
  readonly controlAddress = `169.254.${this.third}.1`;
  readonly controlPort = 20_000 + Math.floor(Math.random() * 20_000);
  readonly controlDir = makeDataDir();
  readonly edges: HarnessEdge[] = [];
  control?: ChildProcess;
  controlLog: string[] = [];
  apiKey = '';
  joinToken = '';

  get url(): string {
    return `http://${this.controlAddress}:${this.controlPort}`;
  }

  get conn(): { url: string; apiKey: string } {
    return { url: this.url, apiKey: this.apiKey };
  }

  /** The bridge, N edge namespaces, the control plane with busybox, and N joined edges. */
  async start(
    edges: number,
    opts: {
      lostAfterMs: number;
      /** More flags for `dsec control` (e.g. the burst pool's). */
      controlArgs?: string[];
      /** More flags for edge `index`'s `dsec edge` (e.g. its pool, its --max-sandboxes). */
      edgeArgs?: (index: number) => string[];
    },
  ): Promise<void> {
    this.lostAfterMs = opts.lostAfterMs;
    this.controlArgs = opts.controlArgs ?? [];
    this.edgeArgs = opts.edgeArgs ?? (() => []);
    this.addBridge();
    sh(process.execPath, [MAIN, 'image', 'build', 'busybox', '--data-dir', this.controlDir]);
    await this.startControl();
    for (let i = 0; i < edges; i++) {
      const e: HarnessEdge = {
        index: i,
        id: newEdgeId(),
        netns: this.addNetns(`e${i}`, 10 + i),
        address: `169.254.${this.third}.${10 + i}`,
        dataDir: makeDataDir(),
        url: '',
        log: [],
      };
      e.url = `http://${e.address}:7071`;
      this.edges.push(e);
      await this.startEdge(e);
    }
    await this.waitFor(async () => (await this.nodes()).filter((n) => n.state === 'ready').length === edges, 'every edge joined');
  }

  lostAfterMs = 10_000;
  controlArgs: string[] = [];
  edgeArgs: (index: number) => string[] = () => [];

  /**
   * The bridge, with the control plane's address and a MAC of its own. Without one, a bridge takes
   * the lowest MAC of its ports and changes it as ports join (an edge, the stranger): an edge that
   * had learnt the old one, now another port's, sends to it, and the bridge hands those frames up
   * as not its own, so the kernel drops them. The edge was cut off until its ARP entry expired
   * (15–55 s): lost, and a batch placed on the other two (1 cluster run in 5 had such an outage).
   */
  addBridge(): void {
    sh('ip', ['link', 'add', this.bridge, 'type', 'bridge']);
    sh('ip', ['link', 'set', this.bridge, 'address', bridgeMac(this.tag)]);
    sh('ip', ['addr', 'add', `${this.controlAddress}/24`, 'dev', this.bridge]);
    sh('ip', ['link', 'set', this.bridge, 'up']);
  }

  /** A network namespace on the bridge with address .host; returns its name. */
  addNetns(name: string, host: number): string {
    const ns = `dsec-${this.tag}-${name}`;
    const veth = `dsv${this.tag}${name}`.slice(0, 15);
    sh('ip', ['netns', 'add', ns]);
    sh('ip', ['link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    sh('ip', ['link', 'set', veth, 'master', this.bridge, 'up']);
    sh('ip', ['-n', ns, 'addr', 'add', `169.254.${this.third}.${host}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', ns, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    return ns;
  }

  async startControl(): Promise<void> {
    this.controlLog = [];
    this.control = spawn(
      process.execPath,
      [
        MAIN,
        'control',
        '--listen',
        `${this.controlAddress}:${this.controlPort}`,
        '--data-dir',
        this.controlDir,
        '--edge-lost-after',
        String(this.lostAfterMs),
        '--log-level',
        process.env['DSEC_TEST_LOG_LEVEL'] ?? 'warn',
        ...this.controlArgs,
      ],
      {
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    const log = this.controlLog;
    this.control.stdout!.on('data', (d: Buffer) => log.push(d.toString()));
    this.control.stderr!.on('data', (d: Buffer) => log.push(d.toString()));
    await this.waitFor(
      async () =>
        existsSync(join(this.controlDir, 'client.json')) &&
        (await fetch(`${this.url}/healthz`).then(
          (r) => r.ok,
          () => false,
        )),
      'the control plane answers',
      () => this.controlLog.join(''),
    );
    const client = JSON.parse(readFileSync(join(this.controlDir, 'client.json'), 'utf8')) as { apiKey: string; joinToken: string };
    this.apiKey = client.apiKey;
    this.joinToken = client.joinToken;
  }

  async startEdge(e: HarnessEdge): Promise<void> {
    e.log = [];
    e.proc = spawn(
      'nsenter',
      [
        `--net=/run/netns/${e.netns}`,
        process.execPath,
        MAIN,
        'edge',
        '--join',
        this.url,
        '--token',
        this.joinToken,
        '--listen',
        `${e.address}:7071`,
        '--data-dir',
        e.dataDir,
        '--id',
        e.id,
        '--label',
        `node=n${e.index}`,
        '--log-level',
        process.env['DSEC_TEST_LOG_LEVEL'] ?? 'warn',
        ...this.edgeArgs(e.index),
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    const log = e.log;
    e.proc.stdout!.on('data', (d: Buffer) => log.push(d.toString()));
    e.proc.stderr!.on('data', (d: Buffer) => log.push(d.toString()));
    await this.waitFor(
      async () => log.join('').includes('joined'),
      `edge ${e.id} joined`,
      () => log.join(''),
    );
  }

  /** SIGKILL, as a crash: nothing is cleaned up, sandboxes keep running. */
  async crash(p: ChildProcess | undefined): Promise<void> {
    if (!p?.pid || p.exitCode !== null || p.signalCode !== null) return;
    const gone = new Promise((r) => p.once('exit', r));
    p.kill('SIGKILL');
    await gone;
  }

  async stop(p: ChildProcess | undefined): Promise<void> {
    if (!p?.pid || p.exitCode !== null || p.signalCode !== null) return;
    const gone = new Promise((r) => p.once('exit', r));
    p.kill('SIGTERM');
    await gone;
  }

  /** Drops every packet on the edge's link (nftables in its namespace): a network partition. */
  cut(e: HarnessEdge): void {
    const rules = `table inet dsec_harness_cut {\n chain in { type filter hook input priority -10; policy accept; iifname "eth0" drop; }\n chain out { type filter hook output priority -10; policy accept; oifname "eth0" drop; }\n}\n`;
    execFileSync('ip', ['netns', 'exec', e.netns, 'nft', '-f', '-'], { input: rules });
  }

  heal(e: HarnessEdge): void {
    sh('ip', ['netns', 'exec', e.netns, 'nft', 'delete', 'table', 'inet', 'dsec_harness_cut']);
  }

  async nodes(): Promise<NodeInfo[]> {
    return (await new Connection(this.conn).json<{ nodes: NodeInfo[] }>('GET', '/v1/nodes')).nodes;
  }

  async waitFor(
    check: () => Promise<boolean> | boolean,
    what: string,
    detail: () => string = () => '',
    timeoutMs = 60_000,
  ): Promise<number> {
    const t0 = Date.now();
    for (;;) {
      if (
        await Promise.resolve()
          .then(check)
          .catch(() => false)
      )
        return Date.now() - t0;
      if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}\n${detail().slice(-3000)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Everything down: sandboxes killed through the API, processes stopped, namespaces and bridge removed. */
  async close(): Promise<void> {
    // An edge that is down is started again so that its sandboxes are killed through the API and
    // it stops cleanly; one that drained and left the cluster has none, and stays down.
    const left = (e: HarnessEdge): boolean => e.proc?.exitCode === 0 && e.log.join('').includes('drained and left the cluster');
    for (const e of this.edges)
      if ((!e.proc || e.proc.exitCode !== null || e.proc.signalCode !== null) && !left(e)) await this.startEdge(e).catch(() => undefined);
    if (this.control && this.control.exitCode === null && this.control.signalCode === null) {
      const conn = new Connection(this.conn);
      const { sandboxes } = await conn.json<{ sandboxes: { id: string }[] }>('GET', '/v1/sandboxes').catch(() => ({ sandboxes: [] }));
      await Promise.allSettled(sandboxes.map((s) => conn.json('DELETE', `/v1/sandboxes/${s.id}`)));
    }
    for (const e of this.edges) await this.stop(e.proc);
    await this.stop(this.control);
    removeHarnessNetwork(this.tag);
    rmSync(join(HARNESS_SUBNETS, String(this.third)), { force: true });
    rmSync(join(HARNESS_OWNERS, this.tag), { force: true });
  }
}
