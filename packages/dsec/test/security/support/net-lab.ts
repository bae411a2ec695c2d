/**
 * Network fixtures for the red-team suite, all on this machine: a "mirror" in a network namespace
 * the test creates (veth pair on a link-local /30 that dsec's own links never use), TCP and UDP
 * listeners on the host, and a look at dsec's host guard table. Everything is removed by the
 * fixture's close(); child processes are killed by their PID.
 */
import assert from 'node:assert/strict';
import { type ChildProcess, execFileSync, spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createSocket, type Socket as UdpSocket } from 'node:dgram';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';

function ip(args: string[]): string {
  return execFileSync('ip', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

/** Whether any host address or route already touches 169.254.<third>.<base>/30. */
function subnetInUse(third: number, base: number): boolean {
  const prefix = `169.254.${third}.`;
  const used = new Set<number>();
  for (const line of ip(['-4', '-o', 'addr', 'show']).split('\n')) {
    const m = /inet (169\.254\.\d+\.\d+)/.exec(line);
    if (m?.[1]?.startsWith(prefix)) used.add(Number(m[1].split('.')[3]));
  }
  for (const line of ip(['-4', 'route', 'show']).split('\n')) {
    const m = /^(169\.254\.\d+\.\d+)/.exec(line);
    if (m?.[1]?.startsWith(prefix)) used.add(Number(m[1].split('.')[3]));
  }
  return [...used].some((last) => last >= base && last < base + 4);
}

/**
 * A /30 in 169.254.252.0/24 (or .251, .249), none of which dsec's links use in practice (they
 * start at 169.254.1.0 and need thousands of sandboxes to get near 250) and never 169.254.169.254.
 * A random block, checked against the host's addresses and routes (other engineers build mirrors too).
 */
function pickSubnet(): { host: string; peer: string } {
  for (const third of [252, 251, 249]) {
    const blocks = [...Array(64).keys()].sort(() => Math.random() - 0.5);
    for (const b of blocks) {
      const base = b * 4;
      if (!subnetInUse(third, base)) return { host: `169.254.${third}.${base + 1}`, peer: `169.254.${third}.${base + 2}` };
    }
  }
  throw new Error('no free link-local /30 for the mirror');
}

function waitExit(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => child.once('exit', () => resolve()));
}

/** Kills a child process by its PID and waits for it to go. */
async function killChild(child: ChildProcess | undefined): Promise<void> {
  if (!child?.pid) return;
  if (child.exitCode === null && child.signalCode === null) {
    try {
      process.kill(child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  await waitExit(child);
}

/**
 * A mirror: a network namespace reached over a veth pair from the host, with busybox httpd on
 * the given TCP ports and a UDP sink (node) that records every datagram it receives.
 */
export class Mirror {
  readonly ns = `dsec-rt-${randomBytes(3).toString('hex')}`;
  readonly hostIf = `rtm${randomBytes(3).toString('hex')}h`;
  /** The mirror's end of the link (inside the namespace). */
  readonly peerIf = `rtm${randomBytes(3).toString('hex')}p`;
  /** Host side of the link (a host address, like a sandbox's gateway). */
  readonly hostAddress: string;
  /** The mirror's address. */
  readonly address: string;
  readonly body = `MIRROR-${randomBytes(6).toString('hex')}`;
  readonly #children: ChildProcess[] = [];
  #udp: ChildProcess | undefined;
  #udpLog = '';
  readonly #www: string;
  #created = { ns: false, link: false };

  private constructor() {
    const s = pickSubnet();
    this.hostAddress = s.host;
    this.address = s.peer;
    this.#www = mkdtempSync(join(tmpdir(), 'dsec-redteam-www-'));
  }

  /** Creates the namespace and link, starts httpd on `tcpPorts` and the UDP sink on `udpPort`. */
  static async start(tcpPorts: number[], udpPort: number): Promise<Mirror> {
    const m = new Mirror();
    try {
      await m.#setUp(tcpPorts, udpPort);
    } catch (err) {
      await m.close();
      throw err;
    }
    return m;
  }

  async #setUp(tcpPorts: number[], udpPort: number): Promise<void> {
    writeFileSync(join(this.#www, 'index.html'), `${this.body}\n`);
    ip(['netns', 'add', this.ns]);
    this.#created.ns = true;
    ip(['link', 'add', this.hostIf, 'type', 'veth', 'peer', 'name', this.peerIf]);
    this.#created.link = true;
    ip(['link', 'set', this.peerIf, 'netns', this.ns]);
    ip(['addr', 'add', `${this.hostAddress}/30`, 'dev', this.hostIf]);
    ip(['link', 'set', this.hostIf, 'up']);
    ip(['-n', this.ns, 'addr', 'add', `${this.address}/30`, 'dev', this.peerIf]);
    ip(['-n', this.ns, 'link', 'set', this.peerIf, 'up']);
    ip(['-n', this.ns, 'link', 'set', 'lo', 'up']);
    // Replies go back through the host whether or not dsec masquerades the sandbox's traffic.
    ip(['-n', this.ns, 'route', 'add', 'default', 'via', this.hostAddress]);
    for (const port of tcpPorts) {
      const c = spawn('ip', ['netns', 'exec', this.ns, 'busybox', 'httpd', '-f', '-p', `${this.address}:${port}`, '-h', this.#www], {
        stdio: 'ignore',
      });
      this.#children.push(c);
    }
    const sink = `const s=require('dgram').createSocket('udp4');s.on('message',(m,r)=>process.stdout.write(JSON.stringify({from:r.address,data:m.toString('latin1')})+'\\n'));s.bind(${udpPort},'0.0.0.0',()=>process.stdout.write('READY\\n'))`;
    this.#udp = spawn('ip', ['netns', 'exec', this.ns, process.execPath, '-e', sink], { stdio: ['ignore', 'pipe', 'ignore'] });
    this.#children.push(this.#udp);
    this.#udp.stdout!.setEncoding('utf8').on('data', (d: string) => (this.#udpLog += d));
    // Ready when httpd answers and the sink said so (polled, bounded by a count).
    for (let i = 0; i < 100; i++) {
      const ready = this.#udpLog.includes('READY') && tcpPorts.every((p) => this.#httpOk(p));
      if (ready) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`mirror ${this.ns} did not come up`);
  }

  /** A request from inside the mirror's own namespace (a positive control for httpd). */
  #httpOk(port: number): boolean {
    const r = spawnSync(
      'ip',
      ['netns', 'exec', this.ns, 'sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 2 ${this.address} ${port}`],
      { encoding: 'utf8', timeout: 10_000 },
    );
    return r.stdout?.includes(this.body) ?? false;
  }

  /** Datagrams the UDP sink received so far. */
  udpReceived(): { from: string; data: string }[] {
    return this.#udpLog
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { from: string; data: string });
  }

  async close(): Promise<void> {
    for (const c of this.#children) await killChild(c);
    if (this.#created.link) spawnSync('ip', ['link', 'del', this.hostIf]);
    if (this.#created.ns) spawnSync('ip', ['netns', 'del', this.ns]);
    rmSync(this.#www, { recursive: true, force: true });
  }
}

/** A TCP listener on the host (all addresses) and a UDP sink, recording who connected / sent. */
export class HostListeners {
  readonly connections: string[] = [];
  readonly datagrams: { from: string; data: string }[] = [];
  readonly #sockets = new Set<Socket>();
  private constructor(
    private readonly tcp: Server,
    private readonly udp: UdpSocket,
  ) {}

  get tcpPort(): number {
    return (this.tcp.address() as AddressInfo).port;
  }

  get udpPort(): number {
    return this.udp.address().port;
  }

  /** Listens on `host` (0.0.0.0 by default), port 0 for both. */
  static async start(host = '0.0.0.0'): Promise<HostListeners> {
    const tcp = createServer();
    const udp = createSocket('udp4');
    const l = new HostListeners(tcp, udp);
    tcp.on('connection', (s) => {
      l.connections.push(s.remoteAddress ?? '?');
      l.#sockets.add(s);
      s.on('error', () => {}); // a peer that resets (or a sandbox that is killed) is expected
      s.on('close', () => l.#sockets.delete(s));
      s.end('HOST-LISTENER\n');
    });
    udp.on('message', (m, r) => l.datagrams.push({ from: r.address, data: m.toString('latin1') }));
    await new Promise<void>((resolve) => tcp.listen(0, host, resolve));
    await new Promise<void>((resolve) => udp.bind(0, '0.0.0.0', resolve));
    return l;
  }

  async close(): Promise<void> {
    // A connection whose sandbox was killed never closes by itself: destroy every one.
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.tcp.close(() => resolve()));
    await new Promise<void>((resolve) => this.udp.close(() => resolve()));
  }
}

/** Connects from the host itself (a positive control: the listener is reachable on `address`). */
export async function hostCanConnect(address: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect({ host: address, port, timeout: 5000 });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
    s.once('timeout', () => {
      s.destroy();
      resolve(false);
    });
  });
}

/** Sends one UDP datagram from the host (positive control for the UDP sink). */
export async function hostSendUdp(address: string, port: number, data: string): Promise<void> {
  const s = createSocket('udp4');
  await new Promise<void>((resolve, reject) => s.send(data, port, address, (err) => (err ? reject(err) : resolve())));
  await new Promise<void>((resolve) => s.close(() => resolve()));
}

/**
 * dsec's host guard rulesets as nft prints them (each edge owns a table inet dsec_host_<edge>),
 * or undefined when there is none.
 */
export function hostGuardTable(): string | undefined {
  const tables = spawnSync('nft', ['list', 'tables'], { encoding: 'utf8' })
    .stdout.split('\n')
    .map((l) => /^table inet (dsec_host_\S+)$/.exec(l.trim())?.[1])
    .filter((t): t is string => t !== undefined);
  if (tables.length === 0) return undefined;
  return tables.map((t) => spawnSync('nft', ['list', 'table', 'inet', t], { encoding: 'utf8' }).stdout).join('\n');
}

/** Asserts the host guard is in place with its drop rules (the defence the test relies on). */
export function assertHostGuardInPlace(context: string): void {
  const t = hostGuardTable();
  assert.ok(
    t !== undefined,
    `${context}: dsec's host guard table (inet dsec_host_<edge>) is missing from the host while this server has linked sandboxes — ` +
      'another dsec edge on this host removed it (Edge.start → HostGuard.removeStale(), or Edge.shutdown → HostGuard.remove())',
  );
  assert.match(t, /iifname "dsh\*" drop/, 'host guard: input from sandbox links is not dropped');
  assert.match(t, /iifname "dsh\*" oifname "dsh\*" drop/, 'host guard: sandbox-to-sandbox forwarding is not dropped');
}

/** The host's own non-loopback IPv4 addresses on stable interfaces (not dsec links, not test veths). */
export function hostStableAddresses(): string[] {
  const out: string[] = [];
  for (const [name, addrs] of Object.entries(networkInterfaces())) {
    if (/^(lo|dsh|dsp|rtm)/.test(name)) continue;
    for (const a of addrs ?? []) if (a.family === 'IPv4' && !a.internal && !a.address.startsWith('169.254.')) out.push(a.address);
  }
  return out;
}

/** MAC address of a host interface. */
export function macOf(ifname: string): string {
  return ip(['-o', 'link', 'show', 'dev', ifname]).match(/link\/ether ([0-9a-f:]{17})/)?.[1] ?? assert.fail(`no MAC for ${ifname}`);
}

/** The IPv6 link-local address of a host interface, if it has one. */
export function linkLocal6Of(ifname: string): string | undefined {
  return /inet6 (fe80::[0-9a-f:]+)\/64/.exec(ip(['-6', '-o', 'addr', 'show', 'dev', ifname]))?.[1];
}

/** IPv6 routes of the host on one interface (`ip -6 route show dev X`). */
export function ipv6RoutesOn(ifname: string): string {
  return ip(['-6', 'route', 'show', 'dev', ifname]);
}

/** Runs a probe binary on the host inside network namespace `ns`; returns its outcome text. */
export function runInNetns(ns: string, bin: string): { status: number | null; stdout: string } {
  const r = spawnSync('ip', ['netns', 'exec', ns, bin], { encoding: 'utf8', timeout: 30_000 });
  return { status: r.status, stdout: r.stdout };
}

/** ifindex of an interface inside namespace `ns`. */
export function ifindexIn(ns: string, ifname: string): number {
  return Number(/^(\d+):/.exec(ip(['-n', ns, '-o', 'link', 'show', 'dev', ifname]))?.[1]);
}
