import type { Command } from 'commander';
import { Connection } from '@dsec/sdk';
import { compileOptions } from '../../config/options.js';
import { buildBusyboxImage } from '../../image/builders/busybox.js';
import { buildDebianImage } from '../../image/builders/debian.js';
import { ImageStore } from '../../image/image-store.js';
import { LayerStore } from '../../image/layer-store.js';
import { collectList, humanBytes, printTable } from '../output.js';

/** Images live in the data dir's image store; the CLI works on it directly, with or without a server. */
function openStore(dataDir?: string): ImageStore {
  const opts = compileOptions({ dataDir });
  const layers = new LayerStore(opts.dataDir);
  return new ImageStore(opts.dataDir, layers);
}

export function registerImageCommands(program: Command): void {
  const image = program.command('image').description('build and list images');
  image
    .command('ls')
    .description('list images')
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .option('--json', 'machine-readable output')
    .action((f: { dataDir?: string; json?: boolean }) => {
      const list = openStore(f.dataDir).list();
      const rows = list.map((i) => ({ ...i, id: i.id.slice(0, 19), names: i.names.join(', '), layers: i.layers.length, size: humanBytes(i.sizeBytes) }));
      printTable(f.json ? list : rows, ['names', 'id', 'layers', 'size', 'createdAt'], f.json ?? false);
    });
  image
    .command('build')
    .description('build an image: busybox (a few MB, seconds) or debian (debootstrap minbase, about a minute)')
    .argument('<builder>', 'busybox | debian')
    .option('--name <name>', 'tag the image with this name')
    .option('-p, --package <pkg>', 'debian: extra package to install (repeatable)', collectList)
    .option('--data-dir <dir>', 'state directory (env DSEC_DATA_DIR)')
    .action(async (builder: string, f: { name?: string; package?: string[]; dataDir?: string }) => {
      const store = openStore(f.dataDir);
      const progress = (m: string): void => void process.stderr.write(`${m}\n`);
      let built;
      if (builder === 'busybox') built = await buildBusyboxImage(store, { name: f.name, progress });
      else if (builder === 'debian') built = await buildDebianImage(store, { name: f.name, packages: f.package, progress });
      else throw new Error(`unknown builder ${JSON.stringify(builder)}: use busybox or debian`);
      process.stdout.write(`${built.name} ${built.id}\n`);
    });
  image
    .command('rm')
    .description('untag an image name, or delete an image by id (needs a running dsec)')
    .argument('<refs...>', 'names or ids')
    .action(async (refs: string[]) => {
      const conn = new Connection();
      for (const ref of refs) {
        await conn.json<void>('DELETE', `/v1/images/${encodeURIComponent(ref)}`);
        process.stdout.write(`${ref}\n`);
      }
    });
  image
    .command('gc')
    .description('delete layer blobs no image or live sandbox uses (needs a running dsec)')
    .option('--json', 'machine-readable output')
    .action(async (f: { json?: boolean }) => {
      const r = await new Connection().json<{ removedLayers: string[]; freedBytes: number; keptLayers: number }>('POST', '/v1/images/gc');
      if (f.json) process.stdout.write(JSON.stringify(r, null, 2) + '\n');
      else process.stdout.write(`removed ${r.removedLayers.length} layers (${humanBytes(r.freedBytes)}), kept ${r.keptLayers}\n`);
    });
}
