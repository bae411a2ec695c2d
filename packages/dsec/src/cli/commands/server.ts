import type { Command } from 'commander';
import { DEFAULT_EXEC_TIMEOUT_MS, DEFAULT_MAX_OUTPUT_BYTES, MAX_FILE_BYTES, MAX_STDIN_BYTES } from '@dsec/sdk/schema';
import { ServerOptions, compileOptions } from '../../config/options.js';
import { DEFAULT_LIMITS } from '../../control/control-plane.js';

/** An option's default, from the one schema that defines it. */
function dflt(key: keyof typeof ServerOptions.properties): string {
  return String((ServerOptions.properties[key] as { default?: unknown }).default);
}
import { doctorPassed, formatChecks, runDoctor } from '../../host/doctor.js';
import { vmCheck } from '../../runtime/vm-check.js';
import { startAllInOne } from '../../runtime/all-in-one.js';
import { DSEC_OOM_SCORE_ADJ, SANDBOX_OOM_SCORE_ADJ, protectFromOomKiller } from '../../host/node-memory.js';
import { stopOnSignals } from '../stop-signals.js';

export function registerServerCommands(program: Command): void {
  program
    .command('up')
    .description('run the control plane and a local edge in one process (embedded defaults)')
    .option('--listen <host:port>', `address of the HTTP API (env DSEC_LISTEN, default ${dflt('listen')})`)
    .option('--data-dir <dir>', `state directory (env DSEC_DATA_DIR, default ${dflt('dataDir')})`)
    .option('--store <url>', 'postgres://… to keep state in PostgreSQL; default SQLite in the data dir (env DSEC_STORE)')
    .option('--edge-id <id>', `this node's edge id, part of every sandbox id (env DSEC_EDGE_ID, default ${dflt('edgeId')})`)
    .option('--max-sandboxes <n>', `admission limit of the local edge (env DSEC_MAX_SANDBOXES, default ${dflt('maxSandboxes')})`)
    .option(
      '--min-free-disk-mib <n>',
      `the edge refuses creates (507 NODE_DISK_FULL) while its data dir's filesystem has less free; 0: never (env DSEC_MIN_FREE_DISK_MIB, default ${dflt('minFreeDiskMiB')})`,
    )
    .option(
      '--min-available-memory-mib <n>',
      `the edge refuses creates (503 NODE_MEMORY_PRESSURE) while the node has less memory available; 0: never (env DSEC_MIN_AVAILABLE_MEMORY_MIB, default ${dflt('minAvailableMemoryMiB')})`,
    )
    .option(
      '--max-memory-pressure <percent>',
      `the edge refuses creates (503 NODE_MEMORY_PRESSURE) while PSI memory full avg10 is at least this; 0: never (env DSEC_MAX_MEMORY_PRESSURE, default ${dflt('maxMemoryPressure')})`,
    )
    .option('--layer-cache-mib <n>', `budget of the node layer cache in MiB (env DSEC_LAYER_CACHE_MIB, default ${dflt('layerCacheMiB')})`)
    .option(
      '--layer-fetch <mode>',
      `eager (whole layers before start) | lazy (chunks on first read, through FUSE) (env DSEC_LAYER_FETCH, default ${dflt('layerFetch')})`,
    )
    .option(
      '--userns',
      `run container sandboxes in user namespaces of their own: root inside is a host uid range, not host root (env DSEC_USERNS, default ${dflt('userns')})`,
    )
    .option(
      '--no-userns',
      'opt out: container sandboxes run as host root (env DSEC_USERNS=false); see docs/SECURITY.md for what that gives up',
    )
    .option(
      '--userns-pool <n>',
      `user namespaces kept made ahead for creates, each with its uid range claimed; 0: none (env DSEC_USERNS_POOL, default ${dflt('usernsPool')})`,
    )
    .option('--layer-chunk-kib <n>', `chunk size recorded for new layers (env DSEC_LAYER_CHUNK_KIB, default ${dflt('layerChunkKiB')})`)
    .option(
      '--trajectory-retention-hours <n>',
      `how long a killed sandbox's trajectory stays readable (dsec log ID); 0: deleted at kill (env DSEC_TRAJECTORY_RETENTION_HOURS, default ${dflt('trajectoryRetentionHours')})`,
    )
    .option(
      '--output-budget-mib <n>',
      `output buffered results (exec, session exec, fn calls) may hold at once past the default 1 MiB per stream; a larger maxOutputBytes reserves its worst case or is refused (env DSEC_OUTPUT_BUDGET_MIB, default ${dflt('outputBudgetMiB')})`,
    )
    .option(
      '--ports-listen <host:port>',
      "address of the port-link origin: pages sandboxes serve through signed links run there, never on the API's origin (env DSEC_PORTS_LISTEN, default the API's host at its port + 8)",
    )
    .option(
      '--ports-url <url>',
      'base URL port links are made with, e.g. behind a proxy (env DSEC_PORTS_URL, default http://<host the API was called by>:<ports port>)',
    )
    .option(
      '--registry-allow <hosts>',
      "registries (comma-separated HOST[:PORT]) project keys may name in image push and pull, besides the cluster's (DSEC_REGISTRY); admin keys may name any (env DSEC_REGISTRY_ALLOW)",
    )
    .option('--log-level <level>', `debug|info|warn|error|silent (env DSEC_LOG_LEVEL, default ${dflt('logLevel')})`)
    .addHelpText(
      'after',
      `\nSandbox defaults (per create request): ${DEFAULT_LIMITS.cpu} CPU, ${DEFAULT_LIMITS.memoryMiB} MiB memory, ${DEFAULT_LIMITS.pids} pids, no disk limit, network none, image busybox.\n` +
        `Command defaults: timeout ${DEFAULT_EXEC_TIMEOUT_MS / 1000} s (exit 137), ${DEFAULT_MAX_OUTPUT_BYTES >> 20} MiB kept per stream, stdin at most ${MAX_STDIN_BYTES >> 20} MiB; files at most ${MAX_FILE_BYTES >> 20} MiB.`,
    )
    .action(
      async (flags: {
        listen?: string;
        dataDir?: string;
        store?: string;
        edgeId?: string;
        maxSandboxes?: string;
        minFreeDiskMib?: string;
        minAvailableMemoryMib?: string;
        maxMemoryPressure?: string;
        layerCacheMib?: string;
        layerFetch?: string;
        layerChunkKib?: string;
        userns?: boolean;
        usernsPool?: string;
        trajectoryRetentionHours?: string;
        outputBudgetMib?: string;
        registryAllow?: string;
        portsListen?: string;
        portsUrl?: string;
        logLevel?: string;
      }) => {
        const { layerCacheMib, layerChunkKib, minFreeDiskMib, minAvailableMemoryMib, outputBudgetMib, ...rest } = flags; // commander spells the flags' keys layerCacheMib, …
        const opts = compileOptions({
          ...rest,
          layerCacheMiB: layerCacheMib,
          layerChunkKiB: layerChunkKib,
          minFreeDiskMiB: minFreeDiskMib,
          minAvailableMemoryMiB: minAvailableMemoryMib,
          outputBudgetMiB: outputBudgetMib,
        });
        const oom = protectFromOomKiller();
        const signals = stopOnSignals('draining; sandboxes keep running and are adopted at the next start');
        const dsec = await startAllInOne(opts);
        signals.running(() => dsec.close(), dsec.log);
        if (!oom.ok)
          dsec.log.warn(
            `cannot lower dsec's OOM score to ${DSEC_OOM_SCORE_ADJ} (${oom.why}; it needs CAP_SYS_RESOURCE): the kernel still kills sandboxes' processes first, which run at +${SANDBOX_OOM_SCORE_ADJ}`,
          );
        process.stdout.write(`dsec is up at ${dsec.url} (data dir ${opts.dataDir})\n`);
        if (dsec.newKey) process.stdout.write(`API key (shown once; also in ${opts.dataDir}/client.json, mode 0600): ${dsec.apiKey}\n`);
        process.stdout.write(`client config: ${opts.dataDir}/client.json\n`);
      },
    );

  program
    .command('doctor')
    .description('check this host can run sandboxes and apply the host fixes dsec knows')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--no-fix', 'only look; change nothing')
    .option('--max-sandboxes <n>', 'check (and raise) the host limits for this many sandboxes (env DSEC_MAX_SANDBOXES; default 4000)')
    .option('--json', 'machine-readable output')
    .action(async (flags: { dataDir?: string; fix: boolean; json?: boolean; maxSandboxes?: string }) => {
      const opts = compileOptions({ dataDir: flags.dataDir, maxSandboxes: flags.maxSandboxes });
      const checks = [...runDoctor({ dataDir: opts.dataDir, fix: flags.fix, maxSandboxes: opts.maxSandboxes }), await vmCheck()];
      if (flags.json) process.stdout.write(JSON.stringify(checks, null, 2) + '\n');
      else process.stdout.write(formatChecks(checks) + '\n');
      const ok = doctorPassed(checks);
      if (!flags.json)
        process.stdout.write(ok ? 'this host can run dsec sandboxes\n' : 'this host cannot run dsec sandboxes: fix the FAIL lines above\n');
      process.exitCode = ok ? 0 : 1;
    });
}
