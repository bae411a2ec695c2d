/**
 * `dsec bench hardening`: the arms (raw crun with and without dsec's defences, dsec with and without
 * its extras) timed alternately, and network policy switches. What it measures and why: the
 * options' comment in hardening-result.ts; targets and rendering: hardening-report.ts.
 */
import { Sandbox, type Session } from '@dsec/sdk';
import { round } from '../stats.js';
import {
  LANDLOCK_PATH,
  SECCOMP_BPF_ANNOTATION,
  defaultSeccompProfile,
  compileSeccompProfile,
  sandboxRuleset,
  type NetworkPolicy,
} from 'dsec/container';
import { SpawnHelper, CGROUP_PARENT, cgroupPids, runToolOrThrow, UidRangePool } from 'dsec/host';
import { summarizeLatency } from '../latency.js';
import { ratio } from '../markdown.js';
import { CrunRawPeer } from '../peers/crun-raw.js';
import { DsecApiPeer } from '../peers/dsec-api.js';
import { BENCH_LIMITS } from '../peers/setup.js';
import { BENCH_IMAGE } from '../fixture.js';
import { compileOptions, buildBusyboxImage, startAllInOne } from 'dsec/runtime';
import { join } from 'node:path';
import type { Peer } from '../peers/peer.js';
import { batchSizes, roundOrder } from '../rounds.js';
import { msOf } from './one-sandbox-rounds.js';
import type { BenchScenarioDef, ScenarioContext } from './scenario.js';
import type { HardeningOptions, ArmResult, SwitchResult, HardeningResult } from './hardening-result.js';
import { hardeningTargets, p50, renderHardening } from './hardening-report.js';

/** A link-local destination the allow policy names. Nothing is ever sent to it (see the enforcement check). */
const ALLOWED = '169.254.250.1:80';
const ALLOW: NetworkPolicy = { mode: 'allow', allow: [{ cidr: '169.254.250.1/32', port: 80 }] };

interface Arm {
  label: string;
  what: string;
  create(): Promise<string>;
  exec(id: string): Promise<void>;
  remove(id: string): Promise<void>;
}

function stripAllDefences(config: Record<string, unknown>): void {
  const linux = config['linux'] as Record<string, unknown>;
  delete linux['seccomp'];
  delete linux['maskedPaths'];
  delete linux['readonlyPaths'];
  config['mounts'] = (config['mounts'] as { destination: string }[]).filter((m) => m.destination !== LANDLOCK_PATH);
  (config['process'] as Record<string, unknown>)['noNewPrivileges'] = false;
}

/** dsec arms made through the SDK with extra create or exec fields. */
function dsecArm(
  peer: DsecApiPeer,
  label: string,
  what: string,
  create: Record<string, unknown>,
  run: Record<string, unknown>,
): Arm & { close(): Promise<void> } {
  const live = new Map<string, Sandbox>();
  return {
    label,
    what,
    async create() {
      const sb = await Sandbox.create({
        ...peer.conn,
        image: 'busybox',
        resources: { ...BENCH_LIMITS },
        labels: { bench: 'hardening' },
        ...create,
      });
      live.set(sb.id, sb);
      return sb.id;
    },
    async exec(id) {
      const r = await live.get(id)!.commands.run(['true'], run);
      if (r.exitCode !== 0) throw new Error(`${label}: exec true exited ${r.exitCode}: ${r.stderr.trim()}`);
    },
    async remove(id) {
      await live.get(id)?.kill();
      live.delete(id);
    },
    async close() {
      await Promise.allSettled([...live.values()].map((s) => s.kill()));
      live.clear();
    },
  };
}

/**
 * A dsec arm whose exec is one command in a shell session (one per sandbox): since issue 10 each
 * session command is a shell of its own that restores the session's state, instead of a line fed
 * to one long-lived shell (since issue 32 started ahead, and answered at its markers).
 */
function dsecSessionArm(peer: DsecApiPeer, label: string, what: string): Arm & { close(): Promise<void> } {
  const inner = dsecArm(peer, label, what, {}, {});
  const sessions = new Map<string, Session>();
  return {
    ...inner,
    async exec(id) {
      let s = sessions.get(id);
      if (!s) {
        s = await (await Sandbox.connect(id, peer.conn)).sessions.create();
        sessions.set(id, s);
      }
      const r = await s.run('true');
      if (r.exitCode !== 0) throw new Error(`${label}: session true exited ${r.exitCode}: ${r.stderr.trim()}`);
    },
    async remove(id) {
      sessions.delete(id);
      await inner.remove(id);
    },
  };
}

function peerArm(peer: Peer, label: string, what: string, cmd?: string[]): Arm {
  return {
    label,
    what,
    create: () => peer.create(),
    exec: async (id) => void (await peer.exec(id, cmd)),
    remove: (id) => peer.remove(id),
  };
}

/**
 * Raw `crun exec ID true` on the crun arm's container, started by a dsec-spawn of its own
 * (posix_spawn from a small process) rather than by this large Node process's fork, as dsec's
 * edge starts it: the floor without the fork every other raw arm (and any Node caller) pays.
 */
function spawnedCrunArm(crun: CrunRawPeer, spawner: SpawnHelper): Arm {
  return {
    label: 'crun spawn',
    what: "raw crun exec ID true started by posix_spawn from a small helper (dsec-spawn), not by a fork of the bench's Node process",
    create: () => crun.create(),
    exec: async (id) => {
      const r = await spawner.run('crun', [...crun.crun.globalArgs(), 'exec', id, 'true'], { stdio: 'pipe' });
      if (r.code !== 0) throw new Error(`crun exec exited ${r.code}: ${r.stderr.trim()}`);
    },
    remove: (id) => crun.remove(id),
  };
}

const MAX_ERRORS = 3;

/** `op` of every arm `count` times, in rounds with the arms alternating, after `warmup` untimed. */
async function alternate(
  arms: Arm[],
  opts: HardeningOptions,
  ctx: ScenarioContext,
  what: string,
  op: (arm: Arm) => Promise<number>,
): Promise<ArmResult[]> {
  const lat = new Map(arms.map((a) => [a, [] as number[]]));
  const errors = new Map(arms.map((a) => [a, [] as string[]]));
  const once = async (a: Arm, keep: boolean): Promise<void> => {
    if (errors.get(a)!.length >= MAX_ERRORS) return;
    try {
      const ms = await op(a);
      if (keep) lat.get(a)!.push(ms);
    } catch (err) {
      errors.get(a)!.push((err as Error).message);
      ctx.say(`${a.label}: ${what} failed: ${(err as Error).message}`);
    }
  };
  for (const a of arms) for (let i = 0; i < opts.warmup; i++) await once(a, false);
  const sizes = batchSizes(opts.count, opts.rounds);
  for (const [r, size] of sizes.entries()) {
    for (const a of roundOrder(arms, r)) {
      for (let i = 0; i < size; i++) {
        ctx.signal.throwIfAborted();
        await once(a, true);
      }
    }
    ctx.say(`  ${what}: round ${r + 1}/${sizes.length} done`);
  }
  return arms.map((a) => ({ label: a.label, what: a.what, latency: summarizeLatency(lat.get(a)!), errors: errors.get(a)! }));
}

/**
 * A second in-process dsec beside the run's, with the opt-out `userns: false` (sandboxes as host
 * root, no user namespace), on its own data dir and edge id under the run's dir.
 */
async function startOptOutDsec(ctx: ScenarioContext, version: string): Promise<{ peer: DsecApiPeer; close(): Promise<void> }> {
  const edgeId = `${ctx.names.edgeId}u`;
  const options = compileOptions(
    { dataDir: join(ctx.names.dir, 'dsec-no-userns'), listen: '127.0.0.1:0', logLevel: 'silent', edgeId, maxSandboxes: 16, userns: false },
    {},
  );
  const server = await startAllInOne(options);
  try {
    await buildBusyboxImage(server.images, { name: BENCH_IMAGE });
  } catch (err) {
    await server.close({ killAll: true });
    throw err;
  }
  const peer = new DsecApiPeer(
    { url: server.url, apiKey: server.apiKey },
    BENCH_IMAGE,
    BENCH_LIMITS,
    { bench: 'hardening' },
    version,
    `sb-${edgeId}-`,
  );
  return {
    peer,
    close: async () => {
      await peer.close();
      await server.close({ killAll: true });
    },
  };
}

export async function runHardening(peers: Peer[], opts: HardeningOptions, ctx: ScenarioContext): Promise<HardeningResult> {
  const dsec = peers.find((p): p is DsecApiPeer => p instanceof DsecApiPeer);
  const crun = peers.find((p): p is CrunRawPeer => p instanceof CrunRawPeer);
  if (!dsec || !crun) throw new Error('dsec bench hardening needs dsec and raw crun');
  ctx.say('starting a second dsec without user namespaces (DSEC_USERNS=false) beside the run’s…');
  const optOutDsec = await startOptOutDsec(ctx, dsec.version);
  const crunUserns = crun.usernsVariant('userns', new UidRangePool(`${ctx.names.edgeId}r`));
  const noSeccomp = crun.variant('noseccomp', (c) => void delete (c['linux'] as Record<string, unknown>)['seccomp']);
  // The same filter precompiled, as dsec's edge hands it to crun (edge/seccomp-bpf.ts): what compiling once per edge saves.
  const seccompBpf = (await compileSeccompProfile(defaultSeccompProfile())).toString('base64');
  const precompiled = crun.variant('bpf', (c) => {
    delete (c['linux'] as Record<string, unknown>)['seccomp'];
    c['annotations'] = { [SECCOMP_BPF_ANNOTATION]: seccompBpf };
  });
  const bare = crun.variant('bare', stripAllDefences);
  const spawner = new SpawnHelper();
  const dsecNet = dsecArm(
    dsec,
    'dsec+net',
    'dsec create with network allow [one CIDR:port]: + veth link, host guard, nft ruleset',
    { network: { mode: 'allow', allow: [ALLOWED] } },
    {},
  );
  const dsecLandlock = dsecArm(
    dsec,
    'dsec+ll',
    'dsec exec `true` with writablePaths ["/tmp"] (through dsec-landlock)',
    {},
    { writablePaths: ['/tmp'] },
  );
  const dsecSession = dsecSessionArm(
    dsec,
    'dsec session',
    'one `true` in a shell session: a fresh shell per command (started ahead, in a Landlock domain of its own) restoring the session state; answered at its markers, its status on its own fd 3',
  );
  const result: Partial<HardeningResult> = {};
  try {
    ctx.say('create: crun with dsec defaults, without seccomp, bare; dsec default, dsec with a network policy…');
    const createArms: Arm[] = [
      peerArm(
        crun,
        'crun',
        "raw crun run -d with dsec's config: seccomp deny list, masked/read-only /proc paths, Landlock helper mount, no_new_privs",
      ),
      peerArm(
        precompiled,
        'crun bpf',
        `the same with the filter precompiled once (${SECCOMP_BPF_ANNOTATION}, as dsec's edge does), not compiled by crun per create`,
      ),
      peerArm(noSeccomp, 'crun -sec', 'the same without the seccomp filter'),
      peerArm(bare, 'crun bare', 'the same without seccomp, masked/read-only paths, the Landlock helper mount or no_new_privs'),
      peerArm(
        crunUserns,
        'crun userns',
        "the first arm's config in a user namespace of its own: dsec-idmap (namespace owned by the range, id-mapped layer as an overlay lower fd) + crun joining it",
      ),
      peerArm(
        dsec,
        'dsec',
        'dsec create (policy none: loopback only), default edge: in a user namespace (range claim, dsec-idmap, id-mapped layers, crun joins it)',
      ),
      peerArm(optOutDsec.peer, 'dsec no-userns', 'dsec create on an edge with the opt-out DSEC_USERNS=false: sandboxes as host root'),
      dsecNet,
    ];
    // Each create is removed right after (untimed), so the population stays the same for every arm.
    result.create = await alternate(createArms, opts, ctx, 'create', async (a) => {
      let id = '';
      const t = await msOf(async () => void (id = await a.create()));
      await a.remove(id);
      return t;
    });

    ctx.say('exec: with and without Landlock…');
    const execArms: Arm[] = [
      peerArm(crun, 'crun', 'raw crun exec ID true'),
      peerArm(
        crun,
        'crun+iso',
        `raw crun exec ID ${LANDLOCK_PATH} --isolate -- true (the Landlock domain of its own every dsec command now gets)`,
        [LANDLOCK_PATH, '--isolate', '--', 'true'],
      ),
      peerArm(crun, 'crun+ll', `raw crun exec ID ${LANDLOCK_PATH} --rw /tmp -- true`, [LANDLOCK_PATH, '--rw', '/tmp', '--', 'true']),
      peerArm(crunUserns, 'crun userns', 'raw crun exec ID true into a user-namespaced container'),
      spawnedCrunArm(crun, spawner),
      peerArm(dsec, 'dsec', 'dsec exec `true` (isolated: through dsec-landlock --isolate), in a user-namespaced sandbox (the default)'),
      peerArm(optOutDsec.peer, 'dsec no-userns', 'dsec exec `true` in a sandbox of the opt-out edge (host root)'),
      dsecLandlock,
      dsecSession,
    ];
    const ids = new Map<Arm, string>();
    try {
      for (const a of execArms) ids.set(a, await a.create());
      result.exec = await alternate(execArms, opts, ctx, 'exec', (a) => msOf(() => a.exec(ids.get(a)!)));
    } finally {
      for (const [a, id] of ids) await a.remove(id).catch(() => undefined);
    }

    result.switch = await measureSwitches(dsec, opts, ctx);
  } finally {
    await dsecNet.close();
    await dsecLandlock.close();
    await dsecSession.close();
    await noSeccomp.close();
    await precompiled.close();
    await bare.close();
    await crunUserns.close();
    await optOutDsec.close();
    await spawner.close();
  }
  return {
    peers: [
      { name: 'dsec', description: dsec.description, version: dsec.version, errors: [] },
      { name: 'crun', description: crun.description, version: crun.version, errors: [] },
    ],
    dropped: [],
    create: result.create ?? [],
    exec: result.exec ?? [],
    switch: result.switch!,
  };
}

async function measureSwitches(dsec: DsecApiPeer, opts: HardeningOptions, ctx: ScenarioContext): Promise<SwitchResult> {
  const create = (): Promise<Sandbox> => Sandbox.create({ ...dsec.conn, image: 'busybox', labels: { bench: 'hardening' } });
  ctx.say(`policy switch: first attach on ${opts.attaches} fresh sandboxes…`);
  const firstAttach: number[] = [];
  for (let i = 0; i < opts.attaches; i++) {
    const sb = await create();
    try {
      firstAttach.push(await msOf(() => sb.setNetwork({ mode: 'allow', allow: [ALLOWED] })));
    } finally {
      await sb.kill();
    }
  }
  ctx.say(`policy switch: ${opts.switches} switches none ⇄ allow, in blocks of 10 alternating with the old nsenter + nft way…`);
  const sb = await create();
  try {
    const link = await sb.setNetwork({ mode: 'allow', allow: [ALLOWED] });
    const pid = cgroupPids(`${CGROUP_PARENT}/${sb.id}`)[0];
    if (!pid) throw new Error(`no process found in ${sb.id}'s cgroup`);
    const put: number[] = [];
    const applied: number[] = [];
    const spawned: number[] = [];
    // Blocks of 10 of each way, alternating: interleaving every switch with a spawn would time the
    // PUT right after this process forked, which slows everything in it for a while (see the note
    // in docs/BENCHMARKS.md), and measure that rather than the switch.
    const policyFor = (i: number): { mode: 'none' } | { mode: 'allow'; allow: string[] } =>
      i % 2 === 0 ? { mode: 'none' } : { mode: 'allow', allow: [ALLOWED] };
    for (let done = 0; done < opts.switches; done += 10) {
      const block = Math.min(10, opts.switches - done);
      for (let i = done; i < done + block; i++) {
        ctx.signal.throwIfAborted();
        let appliedMs = NaN;
        put.push(await msOf(async () => void ({ appliedMs } = await sb.setNetwork(policyFor(i)))));
        applied.push(appliedMs);
      }
      for (let i = done; i < done + block; i++) {
        // The same rulesets, the way they were applied before dsec-nft.
        const ruleset = sandboxRuleset(i % 2 === 0 ? { mode: 'none', allow: [] } : ALLOW, link.gateway);
        spawned.push(await msOf(() => runToolOrThrow('nsenter', [`--target=${pid}`, '--net', '--', 'nft', '-f', '-'], { input: ruleset })));
      }
    }
    await sb.setNetwork({ mode: 'none' });
    // Enforcement, seen from inside: under none a TCP connect is refused by the sandbox's own
    // ruleset (a reset made in its netns: nothing leaves it).
    const t = performance.now();
    const r = await sb.commands.run(['nc', '-w', '2', ALLOWED.split(':')[0]!, '80'], { timeoutMs: 10_000 });
    const enforcement = `${r.exitCode === 0 ? 'CONNECTED (not enforced!)' : (r.stderr.trim().split('\n').pop() ?? `exit ${r.exitCode}`)} after ${round(performance.now() - t, 1)} ms (exec included)`;
    return {
      put: summarizeLatency(put),
      applied: summarizeLatency(applied),
      nsenterNft: summarizeLatency(spawned),
      firstAttach: summarizeLatency(firstAttach),
      enforcement,
    };
  } finally {
    await sb.kill();
  }
}

export const hardeningScenario: BenchScenarioDef<HardeningOptions, HardeningResult> = {
  name: 'hardening',
  summary: "the cost of dsec's defences: create and exec with and without them, and network policy switch latency",
  flags: [
    { key: 'count', long: 'count', short: 'n', description: 'timed creates and execs per arm', default: 60, min: 1 },
    { key: 'rounds', long: 'rounds', description: 'alternating rounds', default: 6, min: 1 },
    { key: 'warmup', long: 'warmup', description: 'untimed creates and execs per arm first', default: 3, min: 0 },
    { key: 'switches', long: 'switches', description: 'timed policy switches', default: 100, min: 2 },
    { key: 'attaches', long: 'attaches', description: 'fresh sandboxes whose first link is timed', default: 10, min: 1 },
  ],
  maxSandboxes: () => 20,
  run: runHardening,
  targets: hardeningTargets,
  render: renderHardening,
  lines: (r) => [
    ...r.create.map((a) => `create ${a.label.padEnd(10)} p50 ${a.latency.p50} ms  p99 ${a.latency.p99} ms`),
    ...r.exec.map((a) => `exec   ${a.label.padEnd(10)} p50 ${a.latency.p50} ms  p99 ${a.latency.p99} ms`),
    `userns: create p50 ${ratio(p50(r.create, 'dsec'), p50(r.create, 'dsec no-userns'))} (dsec default vs opt-out), ${ratio(p50(r.create, 'crun userns'), p50(r.create, 'crun'))} (crun); exec p50 ${ratio(p50(r.exec, 'dsec'), p50(r.exec, 'dsec no-userns'))} (dsec), ${ratio(p50(r.exec, 'crun userns'), p50(r.exec, 'crun'))} (crun)`,
    `switch PUT p50 ${r.switch.put.p50} ms (edge ${r.switch.applied.p50} ms; nsenter+nft ${r.switch.nsenterNft.p50} ms; first link ${r.switch.firstAttach.p50} ms)`,
    `enforcement: ${r.switch.enforcement}`,
  ],
  headline: (r) => [
    {
      metric: 'hardening: create p50 with defences (ms)',
      better: 'lower',
      values: { dsec: p50(r.create, 'dsec'), crun: p50(r.create, 'crun') },
    },
    { metric: 'hardening: policy switch p50 (ms)', better: 'lower', values: { dsec: r.switch.put.p50 } },
  ],
};
