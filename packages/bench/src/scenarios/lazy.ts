import { randomBytes } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import type { ImageConfig } from '@dsec/sdk/schema';
import { HttpBlobSource, Edge, BlobServerThread, computeChunkIndex, DEFAULT_CHUNK_SIZE } from 'dsec/edge';
import { writeFileAtomic } from 'dsec/host';
import { buildDebianImage, type LayerDigest } from 'dsec/runtime';
import { renderChart } from '../chart-svg.js';
import { summarizeLatency, type LatencySummary } from '../latency.js';
import { mdTable, ratio } from '../markdown.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import type { Peer, PeerUnavailable } from '../peers/peer.js';
import type { BenchReport, PeerResultBase, ScenarioResult } from '../result-types.js';
import { chartSubtitle, renderCommon } from '../report-common.js';
import { check, type TargetCheck } from '../targets.js';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';

export interface LazyOptions {
  /** Rate of the blob store's link, Mbit/s (a token bucket in the blob server). @default 1000 */
  rateMbit: number;
  /** Cold starts per mode and task. @default 2 */
  rounds: number;
  /** Sandboxes created at once on a cold node, per mode. @default 10 */
  burst: number;
  /** Chunk size of the image's per-chunk digest list, KiB: the unit lazy nodes fetch. @default 256 (the store's default) */
  chunkKib: number;
}

/**
 * eager: whole layers before the mount; lazy: chunks on first read, no access trace recorded for
 * the image (its first sandboxes); traced: lazy, with the trace the lazy runs before recorded, which
 * the cold node prefetches as the layer mounts.
 */
type Mode = 'eager' | 'lazy' | 'traced';
const MODES: Mode[] = ['eager', 'lazy', 'traced'];

/** The typical first commands of a task (issue 17), each in a fresh sandbox on a cold node. */
const TASKS: { name: string; cmd: string }[] = [
  { name: 'python3 -c', cmd: 'python3 -c \'import json, sys; print(json.dumps({"ok": sys.version_info[0]}))\'' },
  { name: 'git status', cmd: 'cd /tmp && git init -q repo && cd repo && git status --short && echo clean' },
  {
    name: 'gcc hello',
    cmd: 'printf \'#include <stdio.h>\\nint main(void){puts("hi");return 0;}\\n\' > /tmp/h.c && gcc -O1 -o /tmp/h /tmp/h.c && /tmp/h',
  },
];

const PACKAGES = ['python3', 'build-essential', 'git'];

export interface TaskFigures {
  task: string;
  mode: Mode;
  /** Edge.createSandbox on a cold node (layers fetched whole, or their index and superblock) until it returns. */
  create: LatencySummary;
  /** Create + the task's command until it exits: what a trainer waits for. */
  firstCommand: LatencySummary;
  /** Bytes the blob server sent for the run, median of the rounds. */
  bytesRead: number;
  /** Bytes the blob server sent in each round, in order: how stable the read is. */
  bytesReadRounds: number[];
  /**
   * The edge's count of the image's bytes read (each chunk once, summed over its layers; eager: the
   * whole image), median of the rounds. Prefetched chunks nobody read are not in it.
   */
  imageBytesRead: number;
  errors: string[];
}

export interface BurstFigures {
  mode: Mode;
  count: number;
  /** From the first create until the last sandbox's first command returned. */
  allDoneMs: number;
  /** Each sandbox's create + first command. */
  firstCommand: LatencySummary;
  bytesRead: number;
  errors: string[];
}

export interface LazyPeerResult extends PeerResultBase {
  imageBytes: number;
  imagePackages: string[];
  rateMbit: number;
  chunkKib: number;
  tasks: TaskFigures[];
  burst: BurstFigures[];
}

export interface LazyResult extends ScenarioResult {
  peers: LazyPeerResult[];
}

interface ColdNode {
  edge: Edge;
  dir: string;
}

/**
 * Lazy vs eager layer fetching on a cold node (issue 17): a large Debian image (python3,
 * build-essential, git) on a blob store behind a rate-limited link; time to a sandbox's first
 * command and bytes read, per typical task and for a burst. Each start is on a fresh edge with an
 * empty node directory (no layer cache, no chunk cache, no page cache of the layer), driven
 * through the edge API so only the node's work is timed; both modes fetch from the same server
 * over HTTP (eager: the whole blob, hashed; lazy: the chunk index, then chunk-sized ranges).
 */
export async function runLazy(peers: Peer[], opts: LazyOptions, ctx: ScenarioContext): Promise<LazyResult> {
  const dsec = peers.find((p): p is DsecApiPeer => p instanceof DsecApiPeer);
  const dropped: PeerUnavailable[] = peers
    .filter((p) => p.name !== 'dsec')
    .map((p) => ({
      name: p.name,
      reason: "the lazy scenario compares dsec's own two ways of fetching layers (eager, lazy); the peers pull whole images",
    }));
  if (!dsec) throw new Error('the lazy scenario needs the dsec peer');
  const fixture = ctx.fixture;
  if (!fixture) throw new Error("the lazy scenario needs the run's fixture (its in-process dsec)");
  ctx.say(`building the debian image with ${PACKAGES.join(', ')} (debootstrap: a few minutes the first time)`);
  const built = await buildDebianImage(fixture.dsec.images, { name: 'bench-lazy', packages: PACKAGES, progress: (m) => ctx.say(`  ${m}`) });
  const manifest = fixture.dsec.images.get(built.id)!;
  const layers = manifest.layers as LayerDigest[];
  const store = fixture.dsec.images.layers;
  const imageBytes = layers.reduce((n, l) => n + store.size(l), 0);
  // The image's chunk lists at the asked chunk size (recorded at the store's when it was built).
  for (const l of layers)
    writeFileAtomic(store.chunkIndexPath(l), JSON.stringify(await computeChunkIndex(store.path(l), opts.chunkKib * 1024)));
  const token = randomBytes(16).toString('hex');
  const server = await BlobServerThread.start({
    storeRoot: join(fixture.dir, 'dsec'),
    chunkSize: store.chunkSize,
    token,
    rateBytesPerSec: (opts.rateMbit * 1e6) / 8,
    host: '127.0.0.1',
  });
  const log = pino({ level: 'silent' });
  let nodes = 0;
  const tracePath = (l: LayerDigest) => store.chunkIndexPath(l).replace('.chunks.json', '.prefetch.json');
  const coldNode = async (mode: Mode): Promise<ColdNode> => {
    const dir = join(fixture.dir, `lazy-node-${nodes++}`);
    // eager and lazy start with no access trace for the image, so a lazy run records its own;
    // traced keeps the one the last lazy run recorded (the edge's shutdown waits for it to land).
    if (mode !== 'traced') for (const l of layers) rmSync(tracePath(l), { force: true });
    else if (!layers.every((l) => existsSync(tracePath(l)))) throw new Error('no access trace was recorded by the lazy runs');
    const edge = new Edge({
      // An edge id of its own (ids are exclusive on a host); its sandboxes keep the run's prefix, so a crash's leftovers are swept with the run's.
      id: `${fixture.names.edgeId}cold`,
      nodeDir: dir,
      blobs: new HttpBlobSource(server.url, token),
      maxSandboxes: Math.max(opts.burst, 4),
      layerCacheBytes: 20 * 1024 ** 3,
      ...(mode !== 'eager' ? { lazy: { source: () => ({ url: server.url, token }) } } : {}),
      log,
    });
    await edge.start();
    return { edge, dir };
  };
  const dropNode = async (n: ColdNode): Promise<void> => {
    await n.edge.shutdown({ killAll: true });
    rmSync(n.dir, { recursive: true, force: true });
  };
  const sandboxId = () => `sb-${fixture.names.edgeId}-lz${randomBytes(5).toString('hex')}`;
  /** The image's bytes the edge read lazily: its layers' read counts summed (eager: its whole layers). */
  const imageRead = async (edge: Edge, mode: Mode): Promise<number> => {
    if (mode === 'eager') return imageBytes;
    const lazy = (await edge.info()).layerCache.lazy?.layers ?? [];
    return layers.reduce((n, l) => n + (lazy.find((f) => f.digest === l)?.readBytes ?? 0), 0);
  };
  const firstCommand = async (edge: Edge, config: ImageConfig, cmd: string): Promise<{ create: number; total: number }> => {
    const id = sandboxId();
    const t0 = performance.now();
    await edge.createSandbox({ id, layers, config, env: {}, limits: { cpu: 1, memoryMiB: 1024, pids: 1024 } });
    const created = performance.now();
    const r = await edge.exec(id, { cmd: ['/bin/sh', '-c', cmd], timeoutMs: 300_000 });
    const done = performance.now();
    if (r.exitCode !== 0) throw new Error(`${cmd}: exit ${r.exitCode}: ${r.stderr.slice(0, 300)}`);
    return { create: created - t0, total: done - t0 };
  };
  const served = async () => (await server.stats()).bytesServed;

  const tasks: TaskFigures[] = [];
  const bursts: BurstFigures[] = [];
  try {
    for (const task of TASKS) {
      for (const mode of MODES) {
        const create: number[] = [];
        const total: number[] = [];
        const bytes: number[] = [];
        const readByEdge: number[] = [];
        const errors: string[] = [];
        for (let i = 0; i < opts.rounds && !ctx.signal.aborted; i++) {
          const node = await coldNode(mode);
          try {
            const before = await served();
            const t = await firstCommand(node.edge, manifest.config, task.cmd);
            create.push(t.create);
            total.push(t.total);
            bytes.push((await served()) - before);
            readByEdge.push(await imageRead(node.edge, mode));
          } catch (err) {
            errors.push((err as Error).message);
          } finally {
            await dropNode(node);
          }
        }
        const fig = {
          task: task.name,
          mode,
          create: summarizeLatency(create),
          firstCommand: summarizeLatency(total),
          bytesRead: median(bytes),
          bytesReadRounds: bytes,
          imageBytesRead: median(readByEdge),
          errors,
        };
        tasks.push(fig);
        ctx.say(
          `${task.name.padEnd(11)} ${mode.padEnd(6)} first command p50 ${fig.firstCommand.p50} ms, read ${mib(fig.bytesRead)} MiB of ${mib(imageBytes)} MiB ` +
            `(${pct(fig.imageBytesRead, imageBytes)} % of the image read by the edge's count; rounds ${bytes.map(mib).join(', ')} MiB)`,
        );
      }
    }
    for (const mode of ['eager', 'lazy'] as Mode[]) {
      if (ctx.signal.aborted) break;
      const node = await coldNode(mode);
      const errors: string[] = [];
      try {
        const before = await served();
        const t0 = performance.now();
        const each = await Promise.all(
          Array.from({ length: opts.burst }, async () => {
            try {
              return (await firstCommand(node.edge, manifest.config, TASKS[0]!.cmd)).total;
            } catch (err) {
              errors.push((err as Error).message);
              return undefined;
            }
          }),
        );
        const fig = {
          mode,
          count: opts.burst,
          allDoneMs: Math.round(performance.now() - t0),
          firstCommand: summarizeLatency(each.filter((x): x is number => x !== undefined)),
          bytesRead: (await served()) - before,
          errors,
        };
        bursts.push(fig);
        ctx.say(`burst of ${opts.burst} ${mode.padEnd(5)}: all first commands done in ${fig.allDoneMs} ms, read ${mib(fig.bytesRead)} MiB`);
      } finally {
        await dropNode(node);
      }
    }
  } finally {
    await server.close();
  }
  return {
    peers: [
      {
        name: 'dsec',
        description:
          `a cold edge (empty node dir) per start, through the edge API: createSandbox with the image's layer, then exec of the task; ` +
          `eager fetches the whole layer from the blob server before mounting it, lazy mounts it through dsec-chunk-fuse and fetches ${opts.chunkKib} KiB chunks on first read; ` +
          `blob server on loopback, rate-limited to ${opts.rateMbit} Mbit/s`,
        version: dsec.version,
        errors: [
          ...tasks.flatMap((t) => t.errors.map((e) => `${t.task} ${t.mode}: ${e}`)),
          ...bursts.flatMap((b) => b.errors.map((e) => `burst ${b.mode}: ${e}`)),
        ],
        imageBytes,
        imagePackages: PACKAGES,
        rateMbit: opts.rateMbit,
        chunkKib: opts.chunkKib,
        tasks,
        burst: bursts,
      },
    ],
    dropped,
  };
}

function median(xs: number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
}

function mib(bytes: number): number {
  return Math.round((bytes / 1048576) * 10) / 10;
}

function pct(part: number, whole: number): number {
  return Math.round((part / whole) * 1000) / 10;
}

function pair(r: LazyPeerResult, task: string): { eager?: TaskFigures; lazy?: TaskFigures; traced?: TaskFigures } {
  const of = (mode: Mode) => r.tasks.find((t) => t.task === task && t.mode === mode);
  return { eager: of('eager'), lazy: of('lazy'), traced: of('traced') };
}

export function lazyTargets(result: LazyResult): TargetCheck[] {
  const r = result.peers[0];
  if (!r) return [];
  const out: TargetCheck[] = [];
  for (const t of TASKS) {
    const { eager, lazy, traced } = pair(r, t.name);
    if (!eager || !lazy) continue;
    out.push(check(`${t.name}: lazy reads ≤ 15 % of the image's bytes`, pct(lazy.bytesRead, r.imageBytes), 15, '%'));
    out.push(
      check(`${t.name}: first command on a cold node ≥ 3× sooner than eager`, eager.firstCommand.p50 / lazy.firstCommand.p50, 3, '×', {
        atLeast: true,
      }),
    );
    if (traced)
      out.push(
        check(
          `${t.name}: with a recorded access trace, first command on a cold node ≥ 5× sooner than eager`,
          eager.firstCommand.p50 / traced.firstCommand.p50,
          5,
          '×',
          { atLeast: true },
        ),
      );
  }
  return out;
}

export function renderLazy(report: BenchReport<LazyResult>, svgName: string): { markdown: string; svg: string } {
  const r = report.result.peers[0];
  const o = report.options as unknown as LazyOptions;
  if (!r) return { markdown: `# dsec bench lazy — ${report.startedAt}\n\nno result`, svg: '' };
  const rows: (string | number)[][] = [];
  for (const t of TASKS) {
    const { eager, lazy, traced } = pair(r, t.name);
    if (!eager || !lazy) continue;
    rows.push([
      t.name,
      eager.firstCommand.p50,
      lazy.firstCommand.p50,
      ratio(eager.firstCommand.p50, lazy.firstCommand.p50),
      traced ? traced.firstCommand.p50 : '—',
      traced ? ratio(eager.firstCommand.p50, traced.firstCommand.p50) : '—',
      eager.create.p50,
      lazy.create.p50,
      mib(lazy.bytesRead),
      `${pct(lazy.bytesRead, r.imageBytes)} %`,
      (lazy.bytesReadRounds ?? []).map(mib).join(', '),
      `${pct(lazy.imageBytesRead, r.imageBytes)} %`,
      traced ? `${pct(traced.bytesRead, r.imageBytes)} %` : '—',
    ]);
  }
  const burstRows = r.burst.map((b) => [
    b.mode,
    b.count,
    b.allDoneMs,
    b.firstCommand.p50,
    b.firstCommand.max,
    mib(b.bytesRead),
    b.errors.length,
  ]);
  const svg = renderChart(`dsec bench lazy — ${report.startedAt}`, chartSubtitle(report), [
    {
      title: 'first command on a cold node p50',
      unit: 'ms',
      better: 'lower',
      bars: r.tasks.map((t) => ({ label: `${t.task} ${t.mode}`, value: t.firstCommand.p50 })),
    },
    {
      title: 'bytes read from the blob store',
      unit: 'MiB',
      better: 'lower',
      bars: r.tasks.map((t) => ({ label: `${t.task} ${t.mode}`, value: mib(t.bytesRead) })),
    },
  ]);
  const md = [
    `# dsec bench lazy — ${report.startedAt}`,
    '',
    `A Debian bookworm image with ${r.imagePackages.join(', ')} (one EROFS layer, lz4, ${mib(r.imageBytes)} MiB) on a blob server behind a ` +
      `${r.rateMbit} Mbit/s link (a token bucket in the server, loopback). Every start is on a cold edge: a fresh node directory, so no ` +
      'layer cache, no chunk cache and no page cache of the layer; driven through the edge API (createSandbox, then exec of the task). ' +
      '**eager** downloads the whole layer (hashed) before mounting it; **lazy** fetches the chunk index, mounts the layer through ' +
      `dsec-chunk-fuse and fetches ${r.chunkKib} KiB chunks on first read, with no access trace recorded for the image; **traced** is lazy ` +
      'on a cold node with the access trace the last lazy start recorded (the chunks it read, kept with the layer in the blob store), ' +
      `which the node prefetches as the layer mounts. ${o.rounds} cold start(s) per task and mode; p50 in ms; bytes are what the ` +
      "blob server sent; the image's bytes read (each chunk once, the edge's per-layer counts summed over the image, prefetched chunks " +
      'nobody read left out) are in the last column but one.',
    '',
    mdTable(
      [
        'task',
        'eager first command',
        'lazy first command',
        'eager ÷ lazy',
        'traced first command',
        'eager ÷ traced',
        'eager create',
        'lazy create',
        'lazy MiB read',
        'lazy % of image',
        'lazy MiB each round',
        "lazy % of image read, edge's count",
        'traced % of image',
      ],
      rows,
    ),
    '',
    `Burst: ${o.burst} sandboxes created at once on a cold edge, each running \`${TASKS[0]!.name}\`.`,
    '',
    mdTable(
      ['mode', 'sandboxes', 'all first commands done (ms)', 'first command p50', 'first command max', 'MiB read', 'errors'],
      burstRows,
    ),
    '',
    ...renderCommon(report, svgName),
  ];
  return { markdown: md.join('\n'), svg };
}

export const lazyScenario: BenchScenarioDef<LazyOptions, LazyResult> = {
  name: 'lazy',
  summary: 'lazy vs eager layer fetching on a cold node: time to first command and bytes read (python3, git, gcc), and a burst',
  flags: [
    { key: 'rateMbit', long: 'rate-mbit', description: "the blob store link's rate in Mbit/s", default: 1000, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'cold starts per task and mode', default: 2, min: 1 },
    { key: 'burst', long: 'burst', description: 'sandboxes created at once on a cold node (the issue asks for 100)', default: 10, min: 1 },
    { key: 'chunkKib', long: 'chunk-kib', description: 'chunk size of the lazy fetches, KiB', default: DEFAULT_CHUNK_SIZE / 1024, min: 4 },
  ],
  maxSandboxes: () => 4,
  run: runLazy,
  targets: lazyTargets,
  render: renderLazy,
  lines: (r) =>
    (r.peers[0]?.tasks ?? []).map(
      (t) => `${t.task.padEnd(11)} ${t.mode.padEnd(5)} first command p50 ${t.firstCommand.p50} ms, ${mib(t.bytesRead)} MiB read`,
    ),
  headline: (r) => {
    const p = r.peers[0];
    if (!p) return [];
    return TASKS.flatMap((t) => {
      const { lazy } = pair(p, t.name);
      return lazy
        ? [
            {
              metric: `lazy ${t.name} first command on a cold node p50 (ms)`,
              better: 'lower' as const,
              values: { dsec: lazy.firstCommand.p50 },
            },
          ]
        : [];
    });
  },
};
