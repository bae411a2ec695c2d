// Reads and extracts one tar archive with two builds of dsec's tar code side by side (e.g. main
// before a change and this checkout after it), alternating rounds, and prints the medians and
// their ratio as markdown. Usage:
//   node scripts/bench-tar-read.mjs --archive FILE --before DIST --after DIST [--rounds 5] [--scratch DIR]
// where DIST is a packages/dsec/dist directory. Without --archive it makes a ~500 MiB one: 8 files
// of 48 MiB, 20,000 files of 4 KiB in 200 directories, 2,000 symlinks (GNU tar, pax format).
import { execFileSync } from 'node:child_process';
import { createReadStream, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({
  options: {
    archive: { type: 'string' },
    before: { type: 'string' },
    after: { type: 'string', default: 'packages/dsec/dist' },
    rounds: { type: 'string', default: '5' },
    scratch: { type: 'string', default: '/var/tmp' },
  },
});
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
const impls = {};
for (const [label, dist] of [
  ['before', o.before],
  ['after', o.after],
]) {
  const base = resolve(dist, 'src/image/oci');
  impls[label] = { reader: await import(join(base, 'tar-reader.js')), extract: await import(join(base, 'safe-extract.js')) };
}

async function parseOnly(m) {
  let bytes = 0;
  for await (const { body } of m.reader.readTar(createReadStream(archive, { highWaterMark: 1 << 20 })))
    for await (const c of body) bytes += c.length;
  return bytes;
}

async function extract(m) {
  const root = mkdtempSync(join(scratch, 'x-'));
  try {
    await m.extract.extractTarSafely(createReadStream(archive, { highWaterMark: 1 << 20 }), root, {
      layer: true,
      label: 'bench',
      warn: () => {},
    });
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

const times = { before: { parse: [], extract: [] }, after: { parse: [], extract: [] } };
const rounds = Number(o.rounds);
for (let r = 0; r < rounds; r++) {
  for (const label of r % 2 ? ['after', 'before'] : ['before', 'after']) {
    let t = process.hrtime.bigint();
    await parseOnly(impls[label]);
    times[label].parse.push(Number(process.hrtime.bigint() - t) / 1e6);
    t = process.hrtime.bigint();
    await extract(impls[label]);
    times[label].extract.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
}
const median = (a) => [...a].sort((x, y) => x - y)[Math.floor(a.length / 2)];
const mib = size / (1 << 20);
const row = (what, label) => {
  const ms = median(times[label][what]);
  return `| ${what} | ${label} | ${ms.toFixed(0)} | ${(mib / (ms / 1000)).toFixed(0)} | ${times[label][what].map((t) => t.toFixed(0)).join(', ')} |`;
};
console.log(
  `archive: ${o.archive ?? 'synthetic (see the script)'}, ${mib.toFixed(0)} MiB; ${rounds} rounds, alternating order; node ${process.version}\n`,
);
console.log('| step | code | median ms | MiB/s | all rounds (ms) |\n|---|---|---|---|---|');
for (const what of ['parse', 'extract']) for (const label of ['before', 'after']) console.log(row(what, label));
console.log('');
for (const what of ['parse', 'extract'])
  console.log(`- ${what}: after/before = ${(median(times.after[what]) / median(times.before[what])).toFixed(2)}× the time`);
rmSync(scratch, { recursive: true, force: true });
