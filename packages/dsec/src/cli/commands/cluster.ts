import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import { Connection, readNdjson } from '@dsec/sdk';
import type { DrainProgress, NodeInfo } from '@dsec/sdk/schema';
import { compileOptions, OptionsError } from '../../config/options.js';
import { DEFAULT_CPU_OVERCOMMIT } from '../../control/edges/edge-registry.js';
import { startControlPlane } from '../../runtime/all-in-one.js';
import { startEdgeDaemon } from '../../runtime/edge-daemon.js';
import { DSEC_OOM_SCORE_ADJ, SANDBOX_OOM_SCORE_ADJ, protectFromOomKiller } from '../../host/node-memory.js';
import { credentialsFromEnv, type RegistryCredentials } from '../../image/registry/registry-auth.js';
import { parseRegistryRef, RegistryRefError, type RegistryRef } from '../../image/registry/registry-ref.js';
import { collectKv, printTable } from '../output.js';
import { stopOnSignals } from '../stop-signals.js';

/** What a stopping daemon of the cluster says: its sandboxes outlive it. */
const ADOPTED = 'stopping; sandboxes keep running and are adopted at the next start';

function wholeNumber(name: string, v: string | undefined, dflt: number): number {
  if (v === undefined) return dflt;
  if (!/^\d+$/.test(v)) throw new OptionsError(`invalid option ${name}: ${JSON.stringify(v)} is not a whole number`);
  return Number(v);
}

/** `dsec control` (a control plane for many nodes) and `dsec edge` (one node of it). */
export function registerClusterCommands(program: Command): void {
  program
    .command('control')
    .description('run a control plane with no local edge; edges on other nodes join it with `dsec edge --join URL --token T`')
    .option('--listen <host:port>', 'address of the HTTP API, default 127.0.0.1:7070 (env DSEC_LISTEN)')
    .option('--data-dir <dir>', 'state directory, default /var/lib/dsec (env DSEC_DATA_DIR)')
    .option(
      '--store <url>',
      'postgres://… to keep state in PostgreSQL (replicas on one database share it); default SQLite in the data dir (env DSEC_STORE)',
    )
    .option(
      '--layer-dir <dir>',
      'where layer blobs live, default the data dir; replicas without --registry share one (NFS, CephFS, 3FS) (env DSEC_LAYER_DIR)',
    )
    .option(
      '--registry <host/repository>',
      "the cluster's OCI registry, the control plane's blob store: every image's layers go there (the layer dir is then a cache, so replicas share no directory), and joining edges read them from it (they need no --registry); credentials, with push and delete, from DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD[_FILE] (env DSEC_REGISTRY)",
    )
    .option('--ports-listen <host:port>', "address of the port-link origin (env DSEC_PORTS_LISTEN, default the API's host at its port + 8)")
    .option('--ports-url <url>', 'base URL port links are made with, e.g. behind a proxy (env DSEC_PORTS_URL)')
    .option(
      '--registry-allow <hosts>',
      "registries (comma-separated HOST[:PORT]) project keys may name in image push and pull, besides the cluster's; admin keys may name any; the registry account goes only to the cluster's registry (env DSEC_REGISTRY_ALLOW)",
    )
    .option(
      '--output-budget-mib <n>',
      'output buffered results (exec, session exec, fn calls) may hold at once past the default 1 MiB per stream; a larger maxOutputBytes reserves its worst case or is refused (env DSEC_OUTPUT_BUDGET_MIB, default 1024)',
    )
    .option('--edge-lost-after <ms>', 'an edge silent this long is marked lost and its sandboxes lost', '10000')
    .option(
      '--burst-pool <name>',
      'the pool burstable sandboxes go to when theirs is above the threshold: new creates, and idle ones move there',
      'burst',
    )
    .option('--burst-threshold <fraction>', "a pool's share of slots or memory in use above which it bursts", '0.8')
    .option('--burst-return', 'move burst-pool sandboxes back to their own pool once it has room again')
    .option('--log-level <level>', 'debug|info|warn|error|silent (env DSEC_LOG_LEVEL)')
    .action(
      async (flags: {
        listen?: string;
        dataDir?: string;
        store?: string;
        layerDir?: string;
        registry?: string;
        registryAllow?: string;
        portsListen?: string;
        portsUrl?: string;
        outputBudgetMib?: string;
        edgeLostAfter: string;
        burstPool: string;
        burstThreshold: string;
        burstReturn?: boolean;
        logLevel?: string;
      }) => {
        const opts = compileOptions({
          listen: flags.listen,
          dataDir: flags.dataDir,
          store: flags.store,
          layerDir: flags.layerDir,
          registry: flags.registry,
          registryAllow: flags.registryAllow,
          portsListen: flags.portsListen,
          portsUrl: flags.portsUrl,
          outputBudgetMiB: flags.outputBudgetMib,
          logLevel: flags.logLevel,
        });
        const lost = wholeNumber('--edge-lost-after', flags.edgeLostAfter, 10_000);
        const oom = protectFromOomKiller();
        const threshold = Number(flags.burstThreshold);
        if (!(threshold > 0 && threshold <= 1))
          throw new OptionsError(`--burst-threshold ${flags.burstThreshold}: give a fraction above 0 and at most 1, e.g. 0.8`);
        const burst = { pool: flags.burstPool, threshold, returnHome: flags.burstReturn === true };
        const signals = stopOnSignals(ADOPTED);
        const dsec = await startControlPlane({ ...opts, edgeLostAfterMs: lost, burst });
        signals.running(() => dsec.close(), dsec.log);
        if (!oom.ok)
          dsec.log.warn(`cannot lower the control plane's OOM score to ${DSEC_OOM_SCORE_ADJ} (${oom.why}; it needs CAP_SYS_RESOURCE)`);
        process.stdout.write(`dsec control plane is up at ${dsec.url} (data dir ${opts.dataDir})\n`);
        if (dsec.newKey) process.stdout.write(`API key (shown once; also in ${opts.dataDir}/client.json, mode 0600): ${dsec.apiKey}\n`);
        process.stdout.write(`join token (also in client.json): ${dsec.joinToken}\n`);
        process.stdout.write(`on each node: dsec edge --join ${dsec.url} --token ${dsec.joinToken} --listen <node-address>:7071\n`);
      },
    );

  const edge = program
    .command('edge')
    .description('run this node as an edge of a cluster: crun sandboxes, served to the control plane over the edge protocol')
    .option('--join <url>', "the control plane's URL")
    .option('--token <token>', "the cluster's join token (dsec control prints it; env DSEC_JOIN_TOKEN)")
    .option('--listen <host:port>', 'address the edge protocol listens on', '127.0.0.1:7071')
    .option('--advertise <url>', 'URL the control plane reaches this edge at (default http://<listen>)')
    .option('--data-dir <dir>', 'state directory of this node (env DSEC_DATA_DIR)')
    .option('--id <id>', 'edge id (default: made once and kept in DATA_DIR/edge-id)')
    .option('--pool <name>', 'node pool; "burst" takes burstable sandboxes above the threshold', 'default')
    .option('--label <KEY=VALUE>', 'label for placement (repeatable)', collectKv)
    .option(
      '--cpu-overcommit <ratio>',
      `CPU limits may add up to this many times the node's CPUs (0: no cap; default ${DEFAULT_CPU_OVERCOMMIT})`,
      String(DEFAULT_CPU_OVERCOMMIT),
    )
    .option('--max-sandboxes <n>', 'admission limit of this edge', '4000')
    .option('--layer-cache-mib <n>', 'budget of the node layer cache in MiB', '20480')
    .option(
      '--min-available-memory-mib <n>',
      'refuse creates (503 NODE_MEMORY_PRESSURE) while the node has less memory available; 0: never (env DSEC_MIN_AVAILABLE_MEMORY_MIB, default 256)',
    )
    .option(
      '--max-memory-pressure <percent>',
      'refuse creates (503 NODE_MEMORY_PRESSURE) while PSI memory full avg10 is at least this; 0: never (env DSEC_MAX_MEMORY_PRESSURE, default 40)',
    )
    .option(
      '--layer-fetch <mode>',
      'eager (whole layers from the blob endpoint before start, default) | lazy (chunks on first read, through FUSE) (env DSEC_LAYER_FETCH)',
    )
    .option(
      '--registry <host/repository>',
      'fetch layers (or, lazy, their chunks by Range) from this OCI registry repository first (images pushed there with dsec image push), the control plane for the rest; credentials from DSEC_REGISTRY_USER and DSEC_REGISTRY_PASSWORD[_FILE] (env DSEC_REGISTRY)',
    )
    .option('--log-level <level>', 'debug|info|warn|error|silent (env DSEC_LOG_LEVEL, default info)')
    .action(
      async (flags: {
        registry?: string;
        join?: string;
        token?: string;
        listen: string;
        advertise?: string;
        dataDir?: string;
        id?: string;
        pool: string;
        label?: Record<string, string>;
        cpuOvercommit: string;
        maxSandboxes: string;
        layerCacheMib: string;
        layerFetch?: string;
        logLevel?: string;
        minAvailableMemoryMib?: string;
        maxMemoryPressure?: string;
      }) => {
        const token = flags.token ?? process.env['DSEC_JOIN_TOKEN'];
        if (!flags.join || !/^https?:\/\//.test(flags.join))
          throw new OptionsError('--join <url> is required: the control plane URL that `dsec control` printed');
        if (!token)
          throw new OptionsError('--token <token> is required: the join token that `dsec control` printed (or env DSEC_JOIN_TOKEN)');
        if (!/^[a-z0-9][a-z0-9-]{0,31}$/.test(flags.pool))
          throw new OptionsError(`invalid --pool ${JSON.stringify(flags.pool)}: lowercase letters, digits and -`);
        const ratio = Number(flags.cpuOvercommit);
        if (!Number.isFinite(ratio) || ratio < 0)
          throw new OptionsError(`invalid --cpu-overcommit ${JSON.stringify(flags.cpuOvercommit)}: a number ≥ 0`);
        const base = compileOptions({
          dataDir: flags.dataDir,
          listen: flags.listen,
          logLevel: flags.logLevel,
          layerFetch: flags.layerFetch,
          minAvailableMemoryMiB: flags.minAvailableMemoryMib,
          maxMemoryPressure: flags.maxMemoryPressure,
        });
        const oom = protectFromOomKiller();
        if (!oom.ok)
          process.stderr.write(
            `cannot lower the edge's OOM score to ${DSEC_OOM_SCORE_ADJ} (${oom.why}; it needs CAP_SYS_RESOURCE): the kernel still kills sandboxes' processes first, which run at +${SANDBOX_OOM_SCORE_ADJ}\n`,
          );
        const signals = stopOnSignals(ADOPTED);
        const daemon = await startEdgeDaemon({
          join: flags.join,
          token,
          listen: base.listen,
          advertise: flags.advertise,
          dataDir: base.dataDir,
          id: flags.id,
          pool: flags.pool,
          labels: flags.label ?? {},
          cpuOvercommit: ratio,
          maxSandboxes: wholeNumber('--max-sandboxes', flags.maxSandboxes, 4000),
          minFreeDiskMiB: base.minFreeDiskMiB,
          memoryAdmission: { minAvailableMiB: base.minAvailableMemoryMiB, maxFullPressure: base.maxMemoryPressure },
          layerCacheMiB: wholeNumber('--layer-cache-mib', flags.layerCacheMib, 20480),
          layerFetch: base.layerFetch,
          userns: base.userns,
          usernsPool: base.usernsPool,
          registry: registryOption(flags.registry ?? process.env['DSEC_REGISTRY']),
          logLevel: base.logLevel,
        });
        signals.running(() => daemon.close(), {
          info: (m: string) => process.stderr.write(`${m}\n`),
          error: (_o: object, m: string) => process.stderr.write(`${m}\n`),
        });
        void daemon.left.then(async () => {
          await daemon.close();
          process.stdout.write(`edge ${daemon.id} drained and left the cluster\n`);
          process.exit(0);
        });
        process.stdout.write(`dsec edge ${daemon.id} serves ${daemon.url} and joined ${flags.join}\n`);
      },
    );

  edge
    .command('drain')
    .description('stop new placements on an edge; it leaves the cluster once its last sandbox is gone')
    .argument('<id>', 'edge id (see dsec nodes)')
    .option('--migrate', 'move its sandboxes to other edges now (each that can move), and list those that stay with why')
    .option('--restart-processes', "with --migrate: end containers' running processes so they can move too")
    .option('--json', 'print the node (with --migrate: the result) as JSON')
    .action(async (id: string, f: { json?: boolean; migrate?: boolean; restartProcesses?: boolean }) => {
      const path = `/v1/nodes/${encodeURIComponent(id)}/drain`;
      if (!f.migrate) {
        const node = await new Connection().json<NodeInfo>('POST', path);
        if (f.json) process.stdout.write(JSON.stringify(node, null, 2) + '\n');
        else process.stdout.write(`edge ${node.id} is ${node.state}: ${node.sandboxes} sandboxes left\n`);
        return;
      }
      const res = await new Connection().request('POST', path, {
        json: { migrate: true, ...(f.restartProcesses ? { restartProcesses: true } : {}) },
        accept: 'application/x-ndjson',
        timeoutMs: 24 * 3600_000,
      });
      if (!res.body) throw new Error('the drain answered without a body');
      let total = 0;
      let seen = 0;
      for await (const p of readNdjson<DrainProgress>(res.body)) {
        if (p.type === 'start') total = p.total;
        else if (p.type === 'moved') process.stderr.write(`[${++seen}/${total}] ${p.id} -> ${p.to} (${Math.round(p.ms)} ms)\n`);
        else if (p.type === 'stayed') process.stderr.write(`[${++seen}/${total}] ${p.id} stays: ${p.reason}\n`);
        else if (f.json) process.stdout.write(JSON.stringify({ node: p.node, moved: p.moved, stayed: p.stayed }, null, 2) + '\n');
        else process.stdout.write(`edge ${p.node.id} is ${p.node.state}: ${p.moved.length} moved, ${p.stayed.length} stayed\n`);
      }
    });

  program
    .command('nodes')
    .description('list the edges: pool, state, sandboxes, memory, last heartbeat')
    .option('--json', 'machine-readable output')
    .action(async (f: { json?: boolean }) => {
      const { nodes } = await new Connection().json<{ nodes: NodeInfo[] }>('GET', '/v1/nodes');
      if (f.json) {
        process.stdout.write(JSON.stringify(nodes, null, 2) + '\n');
        return;
      }
      printTable(
        nodes.map((n) => ({
          id: n.id,
          pool: n.pool,
          state: n.state,
          sandboxes: `${n.sandboxes}/${n.maxSandboxes}`,
          memAvail: `${Math.round(n.capacity.memoryAvailableBytes / 1048576)} MiB`,
          util: `${Math.round(n.utilisation * 100)}%`,
          url: n.url ?? '(in-process)',
          lastSeen: n.lastSeenAt,
        })),
        ['id', 'pool', 'state', 'sandboxes', 'memAvail', 'util', 'url', 'lastSeen'],
        false,
      );
    });
}

/** `--registry HOST/REPOSITORY` checked before the edge starts (a typo is one line, not a failed create later). */
function registryOption(text: string | undefined): { ref: RegistryRef; credentials: RegistryCredentials | undefined } | undefined {
  if (text === undefined || text === '') return undefined;
  try {
    return {
      ref: parseRegistryRef(text, { requireName: false }),
      credentials: credentialsFromEnv(process.env, (p) => readFileSync(p, 'utf8')),
    };
  } catch (err) {
    if (err instanceof RegistryRefError) throw new OptionsError(`--registry: ${err.message}`);
    throw err;
  }
}
