import type { Command } from 'commander';
import { Pool, Sandbox, type Terminal } from '@dsec/sdk';
import { DEFAULT_EXEC_TIMEOUT_MS, type NetworkPolicyRequest, type PoolInfo } from '@dsec/sdk/schema';
import { UsageError, choiceArg, intArg, positiveArg } from '../args.js';
import { Progress, withProgress } from '../progress.js';
import { stdinForCommand, stdinOptions, streamToTerminal, writeOut } from '../exec-io.js';
import { collectKv, collectList, printTable } from '../output.js';

interface CreateFlags {
  backend?: 'container' | 'microvm' | 'vm';
  memory?: number;
  cpu?: number;
  pids?: number;
  env?: Record<string, string>;
  label?: Record<string, string>;
  rm?: boolean;
  timeout?: number;
  layer?: string[];
  ttl?: number;
  idleTimeout?: number;
  onExpiry: 'stop' | 'pause';
  network?: string;
  allow?: string[];
  interactive?: boolean;
  json?: boolean;
  count?: number;
  pool?: string;
  volume?: string[];
}

/**
 * A mode and `--allow DEST`s (repeatable) → a policy; --allow alone means allow. `what` names
 * where the mode came from in messages (`--network` for run, `MODE` for `dsec network`).
 */
function networkPolicy(mode: string | undefined, allow: string[] | undefined, what: string): NetworkPolicyRequest | undefined {
  const m = mode ?? (allow?.length ? 'allow' : undefined);
  if (m === undefined) return undefined;
  if (m !== 'none' && m !== 'allow' && m !== 'open') throw new UsageError(`${what} must be none, allow or open, got ${JSON.stringify(m)}`);
  if (m !== 'allow' && allow?.length) throw new UsageError(`--allow only goes with ${what === 'MODE' ? 'mode' : what} allow`);
  if (m === 'allow' && !allow?.length) {
    throw new UsageError(
      `${what === 'MODE' ? 'mode' : what} allow needs at least one --allow DEST (CIDR, CIDR:port, host or host:port); use none to allow nothing`,
    );
  }
  return m === 'allow' ? { mode: m, allow: allow ?? [] } : { mode: m };
}

/** A pool in one line: fill, claims, misses and refill times. */
export function poolSummary(p: PoolInfo): string {
  const times = [
    p.refillMsP50 !== undefined ? `refill p50 ${p.refillMsP50} ms` : '',
    p.claimMsP50 !== undefined ? `claim p50 ${p.claimMsP50} ms` : '',
  ].filter(Boolean);
  const failed = p.refillFailures ? `, ${p.refillFailures} refills failed (last: ${p.lastRefillError ?? '?'})` : '';
  return `${p.ready}/${p.size} ready, ${p.creating} creating, ${p.claims} claims, ${p.misses} misses${times.length ? `, ${times.join(', ')}` : ''}${failed}`;
}

/** `NAME:PATH[:ro]` → a volume mount. */
function volumeArg(v: string): { name: string; path: string; readOnly?: boolean } {
  const m = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/.exec(v);
  if (!m) throw new UsageError(`--volume takes NAME:PATH or NAME:PATH:ro (PATH absolute), got ${JSON.stringify(v)}`);
  return m[3] === 'ro' ? { name: m[1]!, path: m[2]!, readOnly: true } : { name: m[1]!, path: m[2]! };
}

const TIMEOUT_HELP = `kill the command (its whole process tree) after this many ms (default ${DEFAULT_EXEC_TIMEOUT_MS}; exit 137)`;

/**
 * Attaches this terminal to a sandbox terminal: raw keystrokes in, output out, resizes forwarded.
 * Raw mode starts before connecting so early keystrokes are neither echoed locally nor lost.
 */
async function runTerminal(sb: Sandbox, cmd: string[], cwd: string | undefined, interactive: boolean): Promise<number> {
  const stdin = process.stdin;
  const early: Buffer[] = [];
  let term: Terminal | undefined;
  const onInput = (d: Buffer): void => {
    if (term) term.write(d);
    else early.push(d);
  };
  if (interactive) {
    if (stdin.isTTY) stdin.setRawMode(true);
    stdin.on('data', onInput);
    stdin.resume();
  }
  const onResize = (): void => term?.resize(process.stdout.columns || 80, process.stdout.rows || 24);
  process.stdout.on('resize', onResize);
  try {
    term = await sb.terminal({
      cmd,
      cwd,
      cols: process.stdout.columns || 80,
      rows: process.stdout.rows || 24,
      onData: (d) => void process.stdout.write(d),
    });
    for (const d of early.splice(0)) term.write(d);
    return await term.exited;
  } finally {
    process.stdout.off('resize', onResize);
    if (interactive) {
      stdin.off('data', onInput);
      if (stdin.isTTY) stdin.setRawMode(false);
      stdin.pause();
    }
  }
}

/** `dsec kill|pause|resume --label k=v`: one bulk call; prints the ids done, says which failed. */
async function bulk(action: 'kill' | 'pause' | 'resume', ids: string[], labels: Record<string, string>): Promise<void> {
  if (ids.length) throw new UsageError(`give sandbox ids or --label, not both`);
  const r = await (action === 'kill'
    ? Sandbox.killAll({ labels })
    : action === 'pause'
      ? Sandbox.pauseAll({ labels })
      : Sandbox.resumeAll({ labels }));
  for (const id of r.ids) process.stdout.write(`${id}\n`);
  for (const f of r.failures) process.stderr.write(`dsec: ${action} ${f.id} failed: ${f.message} (${f.code})\n`);
  if (r.failures.length) process.exitCode = 1;
}

export function registerSandboxCommands(program: Command): void {
  program
    .command('run')
    .description('create a sandbox from IMAGE; with -- CMD, run CMD in it and print its output')
    .argument('<image>', 'image name or id')
    .argument('[cmd...]', 'command to run after --')
    .option(
      '--backend <kind>',
      'container (default) | microvm | vm (a QEMU guest with its own kernel)',
      choiceArg(['container', 'microvm', 'vm'] as const),
    )
    .option('-m, --memory <MiB>', 'memory limit in MiB (default 512)', intArg(1))
    .option('-c, --cpu <cores>', 'CPU cores (default 1)', positiveArg)
    .option('--pids <n>', 'process limit (default 512)', intArg(1))
    .option('-e, --env <KEY=VALUE>', 'environment variable (repeatable)', collectKv)
    .option('-l, --label <KEY=VALUE>', 'label (repeatable)', collectKv)
    .option('--layer <image>', 'stack this image or layer over the base (repeatable, in order)', collectList)
    .option(
      '-v, --volume <NAME:PATH[:ro]>',
      'mount a named volume (dsec volume create) at PATH, read-write unless :ro (repeatable)',
      collectList,
    )
    .option('--ttl <seconds>', 'absolute lifetime (default none)', intArg(1))
    .option('--idle-timeout <seconds>', 'stop (or pause, see --on-expiry) after this long without activity (default none)', intArg(1))
    .option('--on-expiry <action>', 'stop | pause', choiceArg(['stop', 'pause'] as const), 'stop')
    .option('--network <mode>', 'egress policy: none (default, loopback only) | allow | open')
    .option('--allow <dest>', 'with --network allow: CIDR, CIDR:port, host or host:port (repeatable)', collectList)
    .option('--rm', 'kill the sandbox after CMD finishes')
    .option('--timeout <ms>', TIMEOUT_HELP, intArg(1))
    .option('-i, --interactive', "send this terminal's stdin to CMD (piped or redirected stdin is sent without -i)")
    .option('--json', 'print the sandbox (and result) as JSON (output as utf8 text)')
    .option('-n, --count <n>', 'create N sandboxes as one batch (up to 32000) with a live progress bar; prints their ids', intArg(1))
    .option('--pool <name>', "claim a ready sandbox from this warm pool (the other flags must match the pool's spec; see dsec pool ls)")
    .action(async (image: string, cmd: string[], f: CreateFlags) => {
      const resources: Record<string, number> = {};
      if (f.memory !== undefined) resources['memoryMiB'] = f.memory;
      if (f.cpu !== undefined) resources['cpu'] = f.cpu;
      if (f.pids !== undefined) resources['pids'] = f.pids;
      const network = networkPolicy(f.network, f.allow, '--network'); // before any work
      const volumes = f.volume?.map(volumeArg);
      if (f.count !== undefined && f.count > 1) {
        if (cmd.length) throw new UsageError('--count creates sandboxes only; run commands in them with dsec exec');
        const bar = new Progress(`creating ${f.count} sandboxes`);
        const { batchId, sandboxes, failures } = await Sandbox.createMany(f.count, {
          image,
          backend: f.backend,
          resources,
          env: f.env,
          labels: f.label,
          layers: f.layer,
          ttlSeconds: f.ttl,
          idleTimeoutSeconds: f.idleTimeout,
          onExpiry: f.onExpiry,
          network,
          volumes,
          onProgress: (_e, p) => bar.update(p.running + p.failed, p.count, { placed: p.placed, running: p.running, failed: p.failed }),
        });
        bar.end();
        if (f.json) process.stdout.write(JSON.stringify({ batchId, sandboxes: sandboxes.map((x) => x.info), failures }, null, 2) + '\n');
        else {
          for (const x of sandboxes) process.stdout.write(`${x.id}\n`);
          for (const x of failures) process.stderr.write(`item ${x.index} failed: ${x.reason} (${x.code})\n`);
          process.stderr.write(`batch ${batchId}: ${sandboxes.length} running, ${failures.length} failed\n`);
        }
        if (failures.length) process.exitCode = 1;
        return;
      }
      const stdin = cmd.length ? await stdinOptions(stdinForCommand(f.interactive ?? false)) : {};
      const sb = await Sandbox.create({
        image,
        backend: f.backend,
        resources,
        env: f.env,
        labels: f.label,
        layers: f.layer,
        ttlSeconds: f.ttl,
        idleTimeoutSeconds: f.idleTimeout,
        onExpiry: f.onExpiry,
        network,
        volumes,
        pool: f.pool,
      });
      try {
        if (cmd.length === 0) {
          // Nothing to run: the id is the output (`ID=$(dsec run busybox)`), on stdout.
          process.stdout.write(f.json ? JSON.stringify(sb.info, null, 2) + '\n' : `${sb.id}\n`);
          return;
        }
        // With a command, stdout is the command's: the id goes to stderr.
        if (!f.json) process.stderr.write(`${sb.id}\n`);
        const opts = { ...stdin, ...(f.timeout ? { timeoutMs: f.timeout } : {}) };
        if (f.json) {
          const r = await sb.commands.run(cmd, opts);
          process.stdout.write(JSON.stringify({ sandbox: sb.info, result: r }, null, 2) + '\n');
          process.exitCode = r.exitCode;
        } else {
          process.exitCode = await streamToTerminal(sb, cmd, { ...opts, uncapped: true });
        }
      } finally {
        if (f.rm) await sb.kill();
      }
    });

  program
    .command('exec')
    .description("run a command in a sandbox: dsec exec [options] ID CMD ARGS… (everything after ID is the command's; `--` is optional)")
    .argument('<id>', 'sandbox id')
    .argument('<cmd...>', 'command and arguments')
    .option('-w, --cwd <dir>', "working directory (default the image's)")
    .option('-e, --env <KEY=VALUE>', 'environment variable (repeatable)', collectKv)
    .option('--timeout <ms>', TIMEOUT_HELP, intArg(1))
    .option('--json', 'print the whole result as JSON (output as utf8 text, capped at 1 MiB per stream)')
    .option('-i, --interactive', "send this terminal's stdin to the command (piped or redirected stdin is sent without -i)")
    .option('-t, --tty', 'run under a pseudo-terminal (e.g. dsec exec -it ID bash)')
    // Options after the sandbox id are the command's: `dsec exec ID ls -w /tmp` runs `ls -w /tmp`.
    .passThroughOptions()
    .action(
      async (
        id: string,
        cmd: string[],
        f: { cwd?: string; env?: Record<string, string>; timeout?: number; json?: boolean; tty?: boolean; interactive?: boolean },
      ) => {
        if (cmd[0] === '--') cmd = cmd.slice(1);
        else if (cmd[0]?.startsWith('-')) {
          // No program starts with '-': this is one of dsec's options given after the id.
          throw new UsageError(
            `${cmd[0]} comes after the sandbox id, where everything is the command's; put dsec's options before the id: dsec exec ${cmd[0]} … ${id} CMD`,
          );
        }
        if (cmd.length === 0) throw new UsageError('no command: dsec exec ID CMD ARGS…');
        const sb = await Sandbox.connect(id);
        if (f.tty) {
          process.exitCode = await runTerminal(sb, cmd, f.cwd, f.interactive ?? false);
          return;
        }
        const opts = {
          cwd: f.cwd,
          env: f.env,
          ...(await stdinOptions(stdinForCommand(f.interactive ?? false))),
          ...(f.timeout ? { timeoutMs: f.timeout } : {}),
        };
        if (f.json) {
          const r = await sb.commands.run(cmd, opts);
          process.stdout.write(JSON.stringify(r, null, 2) + '\n');
          process.exitCode = r.exitCode;
        } else {
          process.exitCode = await streamToTerminal(sb, cmd, { ...opts, uncapped: true });
        }
      },
    );

  program
    .command('ps')
    .description('list sandboxes')
    .option('-l, --label <KEY=VALUE>', 'only sandboxes with this label (repeatable)', collectKv)
    .option('--json', 'machine-readable output')
    .action(async (f: { label?: Record<string, string>; json?: boolean }) => {
      const list = await Sandbox.list({ labels: f.label });
      const rows = list.map((s) => ({
        ...s,
        memory: `${s.resources.memoryMiB} MiB`,
        cpu: s.resources.cpu,
        labels: Object.entries(s.labels)
          .map(([k, v]) => `${k}=${v}`)
          .join(','),
        reason: s.reason ?? '',
      }));
      // Once projects are in use (any sandbox outside `default`), each row says whose it is.
      const projects = list.some((s) => s.project !== undefined && s.project !== 'default');
      printTable(
        f.json ? list : rows,
        ['id', ...(projects ? ['project'] : []), 'status', 'image', 'cpu', 'memory', 'createdAt', 'labels', 'reason'],
        f.json ?? false,
      );
      // Warm pools hold sandboxes too (labelled dsec.pool-ready until claimed): one line each.
      if (!f.json) for (const { info: p } of await Pool.list()) process.stdout.write(`pool ${p.name}: ${poolSummary(p)}\n`);
    });

  program
    .command('kill')
    .description('kill sandboxes and remove everything they had (killing one already gone succeeds)')
    .argument('[ids...]', 'sandbox ids')
    .option('-l, --label <KEY=VALUE>', 'every sandbox with this label (repeatable: all must match)', collectKv)
    .action(async (ids: string[], f: { label?: Record<string, string> }) => {
      if (f.label) await bulk('kill', ids, f.label);
      else {
        if (ids.length === 0) throw new UsageError('give sandbox ids or --label KEY=VALUE');
        for (const id of ids) {
          await Sandbox.kill(id);
          process.stdout.write(`${id}\n`);
        }
      }
    });

  program
    .command('network')
    .description("switch a running sandbox's egress policy (in force when the command returns)")
    .argument('<id>', 'sandbox id')
    .argument('<mode>', 'none | allow | open')
    .option('--allow <dest>', 'with allow: CIDR, CIDR:port, host or host:port (repeatable)', collectList)
    .option('--json', 'machine-readable output')
    .action(async (id: string, mode: string, f: { allow?: string[]; json?: boolean }) => {
      const policy = networkPolicy(mode, f.allow, 'MODE')!;
      const r = await (await Sandbox.connect(id)).setNetwork(policy);
      if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
      else
        process.stdout.write(
          `${r.mode}${r.allow.length ? ` ${r.allow.map((a) => (a.port ? `${a.cidr}:${a.port}` : a.cidr)).join(' ')}` : ''} (applied in ${r.appliedMs} ms)\n`,
        );
    });

  program
    .command('pause')
    .description('freeze sandboxes (memory stays resident)')
    .argument('[ids...]', 'sandbox ids')
    .option('-l, --label <KEY=VALUE>', 'every running sandbox with this label (repeatable: all must match)', collectKv)
    .action(async (ids: string[], f: { label?: Record<string, string> }) => {
      if (f.label) return bulk('pause', ids, f.label);
      if (ids.length === 0) throw new UsageError('give sandbox ids or --label KEY=VALUE');
      for (const id of ids) process.stdout.write(`${(await (await Sandbox.connect(id)).pause()).id}\n`);
    });

  program
    .command('resume')
    .description('thaw paused sandboxes')
    .argument('[ids...]', 'sandbox ids')
    .option('-l, --label <KEY=VALUE>', 'every paused sandbox with this label (repeatable: all must match)', collectKv)
    .action(async (ids: string[], f: { label?: Record<string, string> }) => {
      if (f.label) return bulk('resume', ids, f.label);
      if (ids.length === 0) throw new UsageError('give sandbox ids or --label KEY=VALUE');
      for (const id of ids) process.stdout.write(`${(await (await Sandbox.connect(id)).resume()).id}\n`);
    });

  program
    .command('migrate')
    .description('move a sandbox to another node (same id, files, labels, policy, trajectory); calls on it wait meanwhile')
    .argument('<id>', 'sandbox id')
    .option('--edge <id>', 'the edge to move to (default: placement picks one)')
    .option('--pool <name>', 'the pool to move into (default: its own)')
    .option('--restart-processes', "end the container's running processes instead of refusing the move (they cannot move)")
    .option('--json', 'machine-readable output')
    .action(async (id: string, f: { edge?: string; pool?: string; restartProcesses?: boolean; json?: boolean }) => {
      const sb = await Sandbox.connect(id);
      const r = await withProgress(`moving ${id}`, () =>
        sb.migrate({
          ...(f.edge ? { edge: f.edge } : {}),
          ...(f.pool ? { pool: f.pool } : {}),
          ...(f.restartProcesses ? { restartProcesses: true } : {}),
        }),
      );
      if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
      else {
        const ended = r.endedProcesses.length ? `; ended ${r.endedProcesses.map((p) => `${p.pid} (${p.cmd})`).join(', ')}` : '';
        process.stdout.write(
          `${id}: ${r.from} -> ${r.to} in ${Math.round(r.ms)} ms (held ${Math.round(r.heldMs)} ms, ${r.bytes} bytes moved${ended})\n`,
        );
      }
    });

  program
    .command('snapshot')
    .description("capture a sandbox's changes as an image (pack_diff); create from the printed image id to restore")
    .argument('<id>', 'sandbox id')
    .option('--name <name>', 'tag the image (a named image is kept)')
    .option('--keep', 'keep the unnamed image after the sandbox is gone (default: deleted with it and the sandboxes started from it)')
    .option('--scrub <path>', 'leave this path out (repeatable; replaces the default list)', collectList)
    .option('--json', 'machine-readable output')
    .action(async (id: string, f: { name?: string; keep?: boolean; scrub?: string[]; json?: boolean }) => {
      // One call: the edge freezes, copies and packs the sandbox's changes (large ones take a while).
      const sb = await Sandbox.connect(id);
      const { image: _image, ...snap } = await withProgress(`snapshotting ${id}`, () =>
        sb.snapshot({ name: f.name, scrub: f.scrub, ...(f.keep ? { keep: true } : {}) }),
      );
      if (f.json) process.stdout.write(JSON.stringify(snap, null, 2) + '\n');
      else {
        const notes = [
          snap.layerAdded ? '' : 'unchanged: no new layer',
          snap.kept ? '' : `deleted with ${id} and the sandboxes started from it; --name or --keep to keep it`,
        ].filter(Boolean);
        process.stdout.write(`${snap.imageId}${notes.length ? ` (${notes.join('; ')})` : ''}\n`);
      }
    });

  program
    .command('fork')
    .description('snapshot a sandbox once and start N sandboxes from it')
    .argument('<id>', 'sandbox id')
    .option('-n, --count <n>', 'how many', '1')
    .option('--json', 'machine-readable output')
    .action(async (id: string, f: { count: string; json?: boolean }) => {
      const { result } = await (await Sandbox.connect(id)).fork(Number(f.count));
      if (f.json) process.stdout.write(JSON.stringify(result, null, 2) + '\n');
      else for (const s of result.sandboxes) process.stdout.write(`${s.id}\n`);
      for (const e of result.failures) process.stderr.write(`dsec: a fork failed: ${e.message} (${e.code})\n`);
      if (result.failures.length) process.exitCode = 1;
    });

  program
    .command('replay')
    .description('rebuild a sandbox from its image and trajectory log as a new sandbox')
    .argument('<id>', 'sandbox id')
    .option('--json', 'machine-readable output')
    .action(async (id: string, f: { json?: boolean }) => {
      const { result } = await (await Sandbox.connect(id)).replay();
      if (f.json) process.stdout.write(JSON.stringify(result, null, 2) + '\n');
      else {
        const skipped = result.skipped ? `, ${result.skipped} skipped` : '';
        process.stdout.write(`${result.sandbox.id} (${result.replayed} steps replayed, ${result.diverged} diverged${skipped})\n`);
        for (const s of result.steps) {
          if (s.skipped) process.stderr.write(`dsec: step ${s.seq} (${s.kind}) skipped: ${s.skipReason ?? ''}\n`);
          else if (s.diverged)
            process.stderr.write(
              `dsec: step ${s.seq} (${s.kind}) diverged: ${s.error ?? `exit ${s.replayedExitCode} where the log has ${s.loggedExitCode}`}\n`,
            );
        }
      }
    });

  program
    .command('log')
    .description(
      "a sandbox's trajectory: every command, file change, network switch and pause with its result (kept 24 h after a kill by default); " +
        'with --label or --batch, every step of many sandboxes as NDJSON on stdout, one {sandboxId, seq, kind, request, result, …} line each (`dsec log --label run=7 > run.jsonl`)',
    )
    .argument('[id]', 'sandbox id')
    .option(
      '-l, --label <KEY=VALUE>',
      'every sandbox with this label, live or killed within the retention time (repeatable: all must match)',
      collectKv,
    )
    .option('--batch <id>', 'every sandbox of this batch (with --label: those of them that match)')
    .option('--lineage', "a fork's log continuing its parent's: its ancestors' steps first, each up to where it was forked")
    .option('--json', 'machine-readable output')
    .action(async (id: string | undefined, f: { label?: Record<string, string>; batch?: string; lineage?: boolean; json?: boolean }) => {
      if (f.label || f.batch !== undefined) {
        if (id !== undefined) throw new UsageError('give a sandbox id or --label/--batch, not both');
        if (f.lineage) throw new UsageError('--lineage reads one sandbox: give its id');
        return writeTrajectories({ ...(f.label ? { labels: f.label } : {}), ...(f.batch !== undefined ? { batch: f.batch } : {}) });
      }
      if (id === undefined) throw new UsageError('give a sandbox id, or --label KEY=VALUE / --batch ID for many sandboxes');
      // Also of a sandbox killed within the retention time.
      const t = await Sandbox.trajectory(id, { limit: 10000, ...(f.lineage ? { lineage: true } : {}) });
      for (const missing of t.lineageMissing ?? [])
        process.stderr.write(`dsec: the steps of ancestor ${missing} and before are missing: its trajectory is no longer kept\n`);
      if (f.json) return printTable(t.entries, [], true);
      const rows = t.entries.map((e) => ({
        ...(f.lineage ? { sandbox: e.sandboxId } : {}),
        seq: e.seq,
        at: e.at,
        kind: e.kind,
        what: JSON.stringify(e.request['cmd'] ?? e.request['path'] ?? e.request['from'] ?? '').slice(0, 60),
        exit: e.exitCode ?? '',
        ms: e.durationMs === undefined ? '' : Math.round(e.durationMs),
      }));
      printTable(rows, [...(f.lineage ? ['sandbox'] : []), 'seq', 'at', 'kind', 'what', 'exit', 'ms'], false);
    });
}

/** Lines gathered before a write: one write per step would cost a syscall each on a big run. */
const LOG_CHUNK = 64 << 10;

/**
 * `dsec log --label/--batch`: the server's NDJSON as it comes, to stdout, waiting for the pipe
 * (`> run.jsonl`, `| jq`) to take each chunk so a slow reader holds the stream instead of memory.
 */
async function writeTrajectories(sel: { labels?: Record<string, string>; batch?: string }): Promise<void> {
  let out = '';
  for await (const line of Sandbox.trajectories(sel)) {
    out += `${JSON.stringify(line)}\n`;
    if (out.length >= LOG_CHUNK) {
      await writeOut(process.stdout, out);
      out = '';
    }
  }
  if (out) await writeOut(process.stdout, out);
}
