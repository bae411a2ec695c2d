// Reads and extracts one tar archive with two builds of dsec's tar code (e.g. main before a change
// and this checkout after it), each measurement in its own process, in alternating order, and
// prints the medians and their ratios as markdown. Usage:
//   node scripts/bench-tar-read.mjs --before DIST [--after DIST] [--archive FILE] [--rounds 7]
//     [--extract-rounds 3] [--scratch DIR]
// where DIST is a packages/dsec/dist directory. Wall time and the process's CPU time (user + sys)
// are both kept: on a shared, loaded machine wall time swings several-fold from run to run, CPU
// time much less, so the CPU ratio is the figure to read. Without --archive it makes a ~500 MiB
// one: 8 files of 48 MiB, 20,000 files of 4 KiB in 200 directories, 2,000 symlinks (GNU tar, pax).
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createReadStream, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({
  options: {
    archive: { type: 'string' },
    before: { type: 'string' },
    after: { type: 'string', default: 'packages/dsec/dist' },
    rounds: { type: 'string', default: '7' },
    'extract-rounds': { type: 'string', default: '3' },
    scratch: { type: 'string', default: '/var/tmp' },
    // internal: one measurement in this process (each build runs in its own process, so the two
    // never share a JIT, a heap or a koffi type registry)
    measure: { type: 'string' },
    dist: { type: 'string' },
  },
});

if (o.measure) {
  const base = resolve(o.dist, 'src/image/oci');
  const m = { reader: await import(join(base, 'tar-reader.js')), extract: await import(join(base, 'safe-extract.js')) };
  const c = process.cpuUsage();
  const t = process.hrtime.bigint();
  if (o.measure === 'parse') {
    for await (const { body } of m.reader.readTar(createReadStream(o.archive, { highWaterMark: 1 << 20 }))) for await (const _ of body);
  } else {
    const root = mkdtempSync(join(o.scratch, 'dsec-tarbench-x-'));
    try {
      await m.extract.extractTarSafely(createReadStream(o.archive, { highWaterMark: 1 << 20 }), root, {
        layer: true,
        label: 'bench',
        warn: () => {},
      });
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  }
  const wall = Number(process.hrtime.bigint() - t) / 1e6;
  const d = process.cpuUsage(c);
  console.log(JSON.stringify({ wall, cpu: (d.user + d.system) / 1000 }));
  process.exit(0);
}
if (!o.before) throw new Error('--before DIST is required (a packages/dsec/dist built from the code to compare with)');
const scratch = mkdtempSync(join(o.scratch, 'dsec-tarbench-'));

function makeArchive() {
  const tree = join(scratch, 'tree');
  for (let i = 0; i < 8; i++) {
    mkdirSync(join(tree, 'big'), { recursive: true });
    writeFileSync(join(tree, 'big', `blob${i}`), randomBytes(48 << 20));
  }
  const small = randomBytes(4096);
  for (let d = 0; d < 200; d++) {
    const dir = join(tree, 'small', `d${d}`);
    mkdirSync(dir, { recursive: true });
    for (let f = 0; f < 100; f++) writeFileSync(join(dir, `f${f}`), small);
    for (let s = 0; s < 10; s++) symlinkSync(`f${s}`, join(dir, `l${s}`));
  }
  const file = join(scratch, 'layer.tar');
  execFileSync('tar', ['--format=pax', '-cf', file, '-C', tree, '.']);
  rmSync(tree, { recursive: true, force: true });
  return file;
}

const archive = o.archive ?? makeArchive();
const size = statSync(archive).size;
const self = fileURLToPath(import.meta.url);
const dists = { before: resolve(o.before), after: resolve(o.after) };

const times = {};
for (const label of ['before', 'after']) times[label] = { parse: { wall: [], cpu: [] }, extract: { wall: [], cpu: [] } };
function timed(label, what) {
  const out = execFileSync(
    process.execPath,
    [self, '--measure', what, '--dist', dists[label], '--archive', archive, '--scratch', scratch],
    { encoding: 'utf8' },
  );
  const r = JSON.parse(out.trim().split('\n').pop());
  times[label][what].wall.push(r.wall);
  times[label][what].cpu.push(r.cpu);
}
const rounds = { parse: Number(o.rounds), extract: Number(o['extract-rounds']) };
for (const what of ['parse', 'extract'])
  for (let r = 0; r < rounds[what]; r++) for (const label of r % 2 ? ['after', 'before'] : ['before', 'after']) timed(label, what);
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const mib = size / (1 << 20);
const ms = (a) => a.map((t) => t.toFixed(0)).join(', ');
console.log(
  `archive: ${o.archive ?? 'synthetic (see the script)'}, ${mib.toFixed(0)} MiB; parse ${rounds.parse} rounds, extract ${rounds.extract}, alternating order; node ${process.version}\n`,
);
console.log(
  '| step | code | median CPU ms | median wall ms | MiB/s (CPU) | CPU ms, all rounds | wall ms, all rounds |\n|---|---|---|---|---|---|---|',
);
for (const what of ['parse', 'extract'])
  for (const label of ['before', 'after']) {
    const t = times[label][what];
    console.log(
      `| ${what} | ${label} | ${median(t.cpu).toFixed(0)} | ${median(t.wall).toFixed(0)} | ${(mib / (median(t.cpu) / 1000)).toFixed(0)} | ${ms(t.cpu)} | ${ms(t.wall)} |`,
    );
  }
console.log('');
for (const what of ['parse', 'extract'])
  console.log(
    `- ${what}: after/before = ${(median(times.after[what].cpu) / median(times.before[what].cpu)).toFixed(2)}× the CPU time, ${(median(times.after[what].wall) / median(times.before[what].wall)).toFixed(2)}× the wall time`,
  );
rmSync(scratch, { recursive: true, force: true });
