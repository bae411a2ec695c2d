import { Sandbox } from '@dsec/sdk';
import type { SandboxBackend } from '@dsec/sdk/schema';
import { renderChart } from '../chart-svg.js';
import { summarizeLatency, type LatencySummary } from '../latency.js';
import { mdTable, ratio } from '../markdown.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import type { BenchReport, PeerResultBase, ScenarioResult } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import type { TargetCheck } from '../targets.js';
import { vmCheck } from 'dsec/runtime';
import { msOf } from './one-sandbox-rounds.js';
import { HELD_GUEST_MIB, holdAndMeasure, type HeldFigures } from './vm-held.js';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';

export interface VmOptions {
  /** Sandboxes booted (create + first command) per backend. */
  boots: number;
  /** Timed execs of `true` in one idle sandbox per backend. */
  count: number;
  /** Seconds an idle sandbox settles before its memory is read. */
  settle: number;
  /** Sandboxes held at once for the idle memory series (vm-held.ts); absent in older results. */
  held?: number[];
}

/**
 * What is timed: each backend, and a microVM twice: created from its image's snapshot (the
 * edge's default: the first create of the image makes it, outside the timing) and cold-booted
 * (the edge's snapshots off for those creates).
 */
const VARIANTS: { label: string; backend: SandboxBackend; cold?: boolean }[] = [
  { label: 'container', backend: 'container' },
  { label: 'microvm', backend: 'microvm' },
  { label: 'microvm cold boot', backend: 'microvm', cold: true },
  { label: 'vm', backend: 'vm' },
];

/** The change each sandbox makes before its snapshot as an image: 100 files of 4 KiB and one of 8 MiB. */
/** Bytes a server in the sandbox sends through the port route (`sb.ports.connect`), timed as throughput. */
const PORT_BYTES = 32 << 20;

/** Reads PORT_BYTES from `nc` on port 7100 in the sandbox through the port route; MiB/s. */
async function portThroughput(sb: Sandbox): Promise<number> {
  // -e: the connection ends when head does.
  await sb.commands.start(['nc', '-l', '-p', '7100', '-e', 'head', '-c', String(PORT_BYTES), '/dev/zero']);
  for (let attempt = 0; ; attempt++) {
    try {
      const conn = await sb.ports.connect(7100);
      const t0 = performance.now();
      let n = 0;
      for await (const chunk of conn) n += (chunk as Buffer).length;
      if (n !== PORT_BYTES) throw new Error(`the port stream ended after ${n} of ${PORT_BYTES} bytes`);
      return Math.round((n / (1 << 20) / ((performance.now() - t0) / 1000)) * 10) / 10;
    } catch (err) {
      // nc may not listen yet: the route answers PORT_NOT_LISTENING until it does.
      if (attempt >= 100 || !/PORT_NOT_LISTENING|not listening|refused/i.test((err as Error).message)) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

const IMAGE_CHANGE =
  'mkdir -p /bench && i=0; while [ $i -lt 100 ]; do head -c 4096 /dev/urandom > /bench/f$i; i=$((i+1)); done; head -c 8388608 /dev/urandom > /bench/big';

export interface BackendFigures {
  backend: SandboxBackend;
  /** Which variant (VARIANTS); older results have only the backend. */
  label?: string;
  /** A VM's first create of the image on the edge, which makes the image's snapshot (not in create). */
  firstCreateMs?: number;
  /** Sandbox.create until it returns (for a VM: QEMU start → guest agent ready). */
  create: LatencySummary;
  /** The first `true` after create. */
  firstExec: LatencySummary;
  /** create + first exec: what a trainer waits for before its first command returns. */
  bootToFirstCommand: LatencySummary;
  exec: LatencySummary;
  /** The parent's frozen time in a fork of one (a VM: vCPUs stopped for the disk copy and the state save). */
  forkFrozen: LatencySummary;
  /** POST fork (count 1) until the fork's first command returned (a VM: save, restore, resume). */
  forkToFirstCommand: LatencySummary;
  /** POST snapshot of the same change (IMAGE_CHANGE) until the image exists: pack_diff, for a VM through the guest agent's tar. */
  imageSnapshot?: LatencySummary; // absent in results from before VMs snapshotted as images
  /** The time the snapshot's copy ran: a container frozen, a VM's disk frozen (the guest runs; its writers wait). */
  imageFrozen?: LatencySummary;
  /** MiB/s of PORT_BYTES from a server in the sandbox through the port route (a VM: relayed by the agent, flow-controlled). */
  portMiBps?: number;
  /** Host memory of one idle sandbox: the cgroup's charge for a container, QEMU's RSS for a VM. */
  idleMemoryMiB: number;
  errors: string[];
}

export interface VmPeerResult extends PeerResultBase {
  backends: BackendFigures[];
  accel: string;
}

export interface VmResult extends ScenarioResult {
  peers: VmPeerResult[];
  /** Idle memory per sandbox with 1, 10, … held (vm-held.ts). */
  held?: HeldFigures[];
}

/** dsec's three backends side by side in one run, all through the SDK on the same server. */
export async function runVm(peers: Peer[], opts: VmOptions, ctx: ScenarioContext): Promise<VmResult> {
  const dsec = peers.find((p): p is DsecApiPeer => p instanceof DsecApiPeer);
  const dropped: PeerUnavailable[] = peers
    .filter((p) => p.name !== 'dsec')
    .map((p) => ({
      name: p.name,
      reason: 'the vm scenario compares dsec backends with each other (container, microvm, vm); other peers have no VM backend here',
    }));
  if (!dsec) throw new Error('the vm scenario needs the dsec peer');
  const out: BackendFigures[] = [];
  for (const { label, backend, cold } of VARIANTS) {
    const previous = process.env['DSEC_VM_SNAPSHOTS'];
    if (cold) process.env['DSEC_VM_SNAPSHOTS'] = '0'; // read at each create by the in-process edge
    const f = {
      create: [] as number[],
      firstExec: [] as number[],
      boot: [] as number[],
      exec: [] as number[],
      frozen: [] as number[],
      fork: [] as number[],
      image: [] as number[],
      imageFrozen: [] as number[],
    };
    const errors: string[] = [];
    let idleMemoryMiB = NaN;
    let portMiBps = NaN;
    ctx.say(`${label}: ${opts.boots} boots, ${opts.count} execs`);
    let firstCreateMs: number | undefined;
    if (backend !== 'container' && !cold) {
      try {
        const t0 = performance.now();
        await (await Sandbox.create({ ...dsec.conn, backend, resources: { memoryMiB: 256, cpu: 1 }, labels: { bench: 'vm' } })).kill();
        firstCreateMs = Math.round(performance.now() - t0);
      } catch (err) {
        errors.push(`first create: ${(err as Error).message}`);
      }
    }
    for (let i = 0; i < opts.boots && !ctx.signal.aborted; i++) {
      let sb: Sandbox | undefined;
      try {
        const t0 = performance.now();
        sb = await Sandbox.create({ ...dsec.conn, backend, resources: { memoryMiB: 256, cpu: 1 }, labels: { bench: 'vm' } });
        const created = performance.now();
        const r = await sb.commands.run(['true']);
        const done = performance.now();
        if (r.exitCode !== 0) throw new Error(`true exited ${r.exitCode}: ${r.stderr}`);
        f.create.push(created - t0);
        f.firstExec.push(done - created);
        f.boot.push(done - t0);
        // A live fork of one: the snapshot (the parent frozen meanwhile) and the fork's first command.
        const tf = performance.now();
        const forked = await sb.fork(1);
        const child = forked.sandboxes[0];
        try {
          if (!child) throw new Error(`fork failed: ${forked.result.failures.map((x) => x.message).join('; ')}`);
          const rc = await child.commands.run(['true']);
          if (rc.exitCode !== 0) throw new Error(`true in the fork exited ${rc.exitCode}: ${rc.stderr}`);
          f.fork.push(performance.now() - tf);
          f.frozen.push(forked.result.snapshot.frozenMs);
        } finally {
          await child?.kill().catch((e: Error) => errors.push(`kill fork: ${e.message}`));
        }
        // A snapshot as an image of the same change in every backend (the image goes with the sandbox).
        const w = await sb.commands.run(['sh', '-c', IMAGE_CHANGE]);
        if (w.exitCode !== 0) throw new Error(`writing the change exited ${w.exitCode}: ${w.stderr}`);
        const ts = performance.now();
        const snap = await sb.snapshot();
        f.image.push(performance.now() - ts);
        f.imageFrozen.push(snap.frozenMs);
        if (i === 0) {
          portMiBps = await portThroughput(sb);
          for (let j = 0; j < opts.count && !ctx.signal.aborted; j++) f.exec.push(await msOf(() => sb!.commands.run(['true'])));
          await new Promise((r) => setTimeout(r, opts.settle * 1000));
          const usage = (await sb.refresh()).usage;
          idleMemoryMiB = usage ? Math.round((usage.memoryBytes / (1 << 20)) * 10) / 10 : NaN;
        }
      } catch (err) {
        errors.push((err as Error).message);
      } finally {
        await sb?.kill().catch((e: Error) => errors.push(`kill: ${e.message}`));
      }
    }
    if (cold) {
      if (previous === undefined) delete process.env['DSEC_VM_SNAPSHOTS'];
      else process.env['DSEC_VM_SNAPSHOTS'] = previous;
    }
    out.push({
      backend,
      label,
      ...(firstCreateMs !== undefined ? { firstCreateMs } : {}),
      create: summarizeLatency(f.create),
      firstExec: summarizeLatency(f.firstExec),
      bootToFirstCommand: summarizeLatency(f.boot),
      exec: summarizeLatency(f.exec),
      forkFrozen: summarizeLatency(f.frozen),
      forkToFirstCommand: summarizeLatency(f.fork),
      imageSnapshot: summarizeLatency(f.image),
      imageFrozen: summarizeLatency(f.imageFrozen),
      portMiBps,
      idleMemoryMiB,
      errors,
    });
  }
  const held: HeldFigures[] = [];
  for (const n of opts.held ?? []) {
    for (const kind of ['container', 'microvm', 'microvm-cold'] as const) {
      if (ctx.signal.aborted) break;
      ctx.say(`idle memory: ${n} ${kind} held`);
      held.push(await holdAndMeasure(dsec.conn, kind, n, opts.settle, ctx));
    }
  }
  const accel = (await vmCheck()).detail;
  return {
    held,
    peers: [
      {
        name: 'dsec',
        description:
          'Sandbox.create({ backend }) then commands.run(["true"]) through the SDK; container: crun; microvm: QEMU -M microvm; vm: QEMU q35',
        version: dsec.version,
        errors: [
          ...out.flatMap((b) => b.errors.map((e) => `${b.label ?? b.backend}: ${e}`)),
          ...held.flatMap((h) => h.errors.map((e) => `${h.held} ${h.kind} held: ${e}`)),
        ],
        backends: out,
        accel,
      },
    ],
    dropped,
  };
}

function rows(r: VmResult): (string | number)[][] {
  const b = r.peers[0]?.backends ?? [];
  const c = b.find((x) => x.backend === 'container');
  const metric = (name: string, get: (x: BackendFigures) => number | undefined): (string | number)[] => [
    name,
    ...b.map((x) => get(x) ?? 'n/a'),
    ...b.filter((x) => x.backend !== 'container').map((x) => (c ? ratio(get(x) ?? NaN, get(c) ?? NaN) : 'n/a')),
  ];
  return [
    metric('boot to first command p50 (ms)', (x) => x.bootToFirstCommand.p50),
    metric('boot to first command max (ms)', (x) => x.bootToFirstCommand.max),
    metric("first create of the image (makes a VM's snapshot) (ms)", (x) => x.firstCreateMs),
    metric('create p50 (ms)', (x) => x.create.p50),
    metric('first exec p50 (ms)', (x) => x.firstExec.p50),
    metric('exec `true` p50 (ms)', (x) => x.exec.p50),
    metric('exec `true` p99 (ms)', (x) => x.exec.p99),
    metric('fork of one: parent frozen p50 (ms)', (x) => x.forkFrozen.p50),
    metric('fork of one: to its first command p50 (ms)', (x) => x.forkToFirstCommand.p50),
    metric('snapshot as an image, 8 MiB + 100 files p50 (ms)', (x) => x.imageSnapshot?.p50 ?? NaN),
    metric('snapshot as an image: copy (frozen) p50 (ms)', (x) => x.imageFrozen?.p50 ?? NaN),
    metric('port route, 32 MiB from the sandbox (MiB/s, higher is better)', (x) => x.portMiBps ?? NaN),
    metric('host memory per idle sandbox (MiB)', (x) => x.idleMemoryMiB),
  ];
}

/** The idle memory series: per sandbox, at each number held. */
function renderHeld(held: HeldFigures[]): string[] {
  if (held.length === 0) return [];
  return [
    `Idle host memory per sandbox with N held at once (microVMs of ${HELD_GUEST_MIB} MiB guest RAM, 1 CPU; each ran \`true\`, then ` +
      'the settle): the cgroup charge (a page shared by siblings is charged once) and the drop of MemAvailable over the N ' +
      '(also what lies outside the cgroups, and whatever else the host did meanwhile).',
    '',
    mdTable(
      ['sandbox', 'held', 'cgroup charge per sandbox (MiB)', 'MemAvailable drop per sandbox (MiB)', 'made'],
      held.map((h) => [h.kind === 'microvm-cold' ? 'microvm cold boot' : h.kind, h.held, h.cgroupMiB, h.memAvailableDropMiB, h.made]),
    ),
    '',
  ];
}

export function renderVm(report: BenchReport<VmResult>, svgName: string): { markdown: string; svg: string } {
  const { result } = report;
  const o = report.options as unknown as VmOptions;
  const b = result.peers[0]?.backends ?? [];
  const svg = renderChart(`dsec bench vm — ${report.startedAt}`, chartSubtitle(report), [
    {
      title: 'boot to first command p50',
      unit: 'ms',
      better: 'lower',
      bars: b.map((x) => ({ label: x.label ?? x.backend, value: x.bootToFirstCommand.p50 })),
    },
    { title: 'exec true p50', unit: 'ms', better: 'lower', bars: b.map((x) => ({ label: x.label ?? x.backend, value: x.exec.p50 })) },
    {
      title: 'host memory per idle sandbox',
      unit: 'MiB',
      better: 'lower',
      bars: b.map((x) => ({ label: x.label ?? x.backend, value: x.idleMemoryMiB })),
    },
  ]);
  const md = [
    `# dsec bench vm — ${report.startedAt}`,
    '',
    `dsec's backends side by side on one server, all through the SDK: ${o.boots} sandboxes booted per backend (create, then ` +
      `\`true\`), a fork of one from each (snapshot, then the fork's first \`true\`: a container's fork is a pack_diff image and a ` +
      `new container, a VM's a save of its memory and disk and a restore), a snapshot as an image of the same change in each (100 files of 4 KiB and one of ` +
      `8 MiB: pack_diff, for a VM a tar of the overlay upper from the guest agent with the guest's disk frozen, unpacked and packed on the edge), 32 MiB read from \`nc\` in the first through the port route (a VM's relayed by the guest agent ` +
      `with a 256 KiB window per connection), ${o.count} execs of \`true\` in the first, and its host memory after ${o.settle} s idle (256 MiB, 1 CPU each). ` +
      `VM accelerator: ${result.peers[0]?.accel ?? 'n/a'}. Memory is the sandbox's cgroup charge: for a VM, QEMU's ` +
      '(guest RAM it touched, guest kernel, TCG cache, device state, page cache of its disks).',
    '',
    mdTable(
      [
        'metric',
        ...b.map((x) => x.label ?? x.backend),
        ...b.filter((x) => x.backend !== 'container').map((x) => `${x.label ?? x.backend} ÷ container`),
      ],
      rows(result),
    ),
    '',
    ...renderHeld(result.held ?? []),
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const vmScenario: BenchScenarioDef<VmOptions, VmResult> = {
  name: 'vm',
  summary:
    'microVM and VM backends against containers: boot to first command, fork (snapshot and restore), snapshot as an image, exec latency, host memory per idle sandbox',
  flags: [
    { key: 'boots', long: 'boots', description: 'sandboxes booted per backend', default: 5, min: 1 },
    { key: 'count', long: 'count', short: 'n', description: 'timed execs per backend', default: 50, min: 1 },
    { key: 'settle', long: 'settle', description: 'seconds idle before memory is read', default: 5, min: 0 },
    {
      key: 'held',
      long: 'held',
      description: 'sandboxes held at once for idle memory per sandbox (e.g. 1,10,50; 0 skips it)',
      default: [1, 10],
      min: 0,
      list: true,
    },
  ],
  maxSandboxes: (o) => Math.max(4, ...(o.held ?? []).map((n) => n + 1)),
  run: runVm,
  targets: (): TargetCheck[] => [],
  render: renderVm,
  lines: (r) =>
    (r.peers[0]?.backends ?? []).map(
      (b) =>
        `${(b.label ?? b.backend).padEnd(17)} boot→first command p50 ${b.bootToFirstCommand.p50} ms  fork→first command p50 ${b.forkToFirstCommand.p50} ms (frozen ${b.forkFrozen.p50} ms)  exec p50 ${b.exec.p50} ms  idle ${b.idleMemoryMiB} MiB`,
    ),
  headline: (r) =>
    (r.peers[0]?.backends ?? [])
      .filter((b) => b.backend !== 'container')
      .flatMap((b) => [
        {
          metric: `${b.label ?? b.backend} boot to first command p50 (ms)`,
          better: 'lower' as const,
          values: { dsec: b.bootToFirstCommand.p50 },
        },
        { metric: `${b.label ?? b.backend} exec p50 (ms)`, better: 'lower' as const, values: { dsec: b.exec.p50 } },
      ]),
};
