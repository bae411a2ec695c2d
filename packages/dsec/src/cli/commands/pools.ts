import type { Command } from 'commander';
import { Pool } from '@dsec/sdk';
import { choiceArg, intArg, positiveArg } from '../args.js';
import { collectKv, collectList, printTable } from '../output.js';
import { poolSummary } from './sandboxes.js';

/** `dsec pool ls|create|rm`: warm pools of ready sandboxes. */
export function registerPoolCommands(program: Command): void {
  const pool = program.command('pool').description('warm pools: ready sandboxes a create claims instead of waiting (dsec run --pool NAME)');

  pool
    .command('ls')
    .description('list pools: ready/size, refills in flight, claims, misses, refill and claim times')
    .option('--json', 'machine-readable output')
    .action(async (f: { json?: boolean }) => {
      const list = (await Pool.list()).map((p) => p.info);
      const rows = list.map((p) => ({ ...p, image: p.spec.image, ready: `${p.ready}/${p.size}`, summary: poolSummary(p) }));
      printTable(
        f.json ? list : rows,
        ['name', 'image', 'ready', 'creating', 'claims', 'misses', 'refillMsP50', 'claimMsP50', 'refillFailures'],
        f.json ?? false,
      );
    });

  pool
    .command('create')
    .description('create a pool of SIZE ready sandboxes of IMAGE, refilled in the background')
    .argument('<name>', 'pool name (a-z, 0-9, -)')
    .argument('<image>', 'image name or id')
    .requiredOption('-s, --size <n>', 'ready sandboxes to keep', intArg(0))
    .option('--backend <kind>', 'container (default) | microvm | vm', choiceArg(['container', 'microvm', 'vm'] as const))
    .option('-m, --memory <MiB>', 'memory limit in MiB (default 512)', intArg(1))
    .option('-c, --cpu <cores>', 'CPU cores (default 1)', positiveArg)
    .option('--pids <n>', 'process limit (default 512)', intArg(1))
    .option('-e, --env <KEY=VALUE>', 'environment variable (repeatable)', collectKv)
    .option('--layer <image>', 'stack this image or layer over the base (repeatable, in order)', collectList)
    .option('--json', 'machine-readable output')
    .action(
      async (
        name: string,
        image: string,
        f: {
          size: number;
          backend?: 'container' | 'microvm' | 'vm';
          memory?: number;
          cpu?: number;
          pids?: number;
          env?: Record<string, string>;
          layer?: string[];
          json?: boolean;
        },
      ) => {
        const resources: Record<string, number> = {};
        if (f.memory !== undefined) resources['memoryMiB'] = f.memory;
        if (f.cpu !== undefined) resources['cpu'] = f.cpu;
        if (f.pids !== undefined) resources['pids'] = f.pids;
        const { info: p } = await Pool.create({ name, size: f.size, image, backend: f.backend, resources, env: f.env, layers: f.layer });
        process.stdout.write(f.json ? JSON.stringify(p, null, 2) + '\n' : `pool ${p.name}: ${poolSummary(p)}\n`);
      },
    );

  pool
    .command('rm')
    .description('delete pools and kill their unclaimed sandboxes (claimed ones stay)')
    .argument('<names...>', 'pool names')
    .action(async (names: string[]) => {
      for (const n of names) {
        await Pool.delete(n);
        process.stdout.write(`${n}\n`);
      }
    });
}
