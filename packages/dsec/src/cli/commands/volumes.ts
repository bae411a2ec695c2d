import type { Command } from 'commander';
import { Volume } from '@dsec/sdk';
import { collectKv, humanBytes, printTable } from '../output.js';

/** `dsec volume create|ls|inspect|rm`: named volumes, mounted with `dsec run -v NAME:PATH[:ro]`. */
export function registerVolumeCommands(program: Command): void {
  const volume = program
    .command('volume')
    .description('named volumes: persistent directories on one node, mounted into sandboxes with dsec run -v NAME:PATH[:ro]');
  volume
    .command('create')
    .description('create a volume (kept on one node; the sandboxes that mount it run there)')
    .argument('<name>', 'lowercase letters, digits, . _ - (up to 63)')
    .option('--edge <id>', 'the node to keep it on (default: the ready one with the most free slots)')
    .option('-l, --label <KEY=VALUE>', 'label (repeatable)', collectKv)
    .option('--json', 'print it as JSON')
    .action(async (name: string, f: { edge?: string; label?: Record<string, string>; json?: boolean }) => {
      const v = await Volume.create(name, { ...(f.edge ? { edge: f.edge } : {}), ...(f.label ? { labels: f.label } : {}) });
      process.stdout.write(f.json ? `${JSON.stringify(v.info, null, 2)}\n` : `${v.name}\n`);
    });
  volume
    .command('ls')
    .description('list volumes, with the sandboxes that mount each')
    .option('--json', 'print as JSON')
    .action(async (f: { json?: boolean }) => {
      const rows = (await Volume.list()).map((v) => ({ ...v.info, mounted: v.info.mountedBy.length ? v.info.mountedBy.join(',') : '-' }));
      printTable(rows, ['name', 'edge', 'createdAt', 'mounted'], f.json ?? false);
    });
  volume
    .command('inspect')
    .description('a volume: its node, who mounts it, the size of its files')
    .argument('<name>')
    .action(async (name: string) => {
      const v = await Volume.get(name);
      process.stdout.write(
        `${JSON.stringify({ ...v.info, ...(v.info.bytes !== undefined ? { size: humanBytes(v.info.bytes) } : {}) }, null, 2)}\n`,
      );
    });
  volume
    .command('rm')
    .description('delete volumes and their files (refused while a sandbox mounts one)')
    .argument('<names...>')
    .action(async (names: string[]) => {
      for (const name of names) {
        await (await Volume.get(name)).delete();
        process.stdout.write(`${name}\n`);
      }
    });
}
