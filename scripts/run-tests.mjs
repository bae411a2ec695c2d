// Runs every compiled test file with node's test runner, several files at a time where they share
// no host state (test-pool.mjs says which cannot), then checks the suite left no dsec mount,
// loop device, cgroup, namespace or bridge behind.
import { readdirSync, readFileSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runPool, slotCount } from './test-pool.mjs';

function findTests(dir, out = []) {
  if (!existsSync(dir)) return out;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) findTests(p, out);
    else if (e.name.endsWith('.test.js')) out.push(p);
  }
  return out;
}

/**
 * What the suite's own servers could leave behind: mounts under their data dirs
 * (/var/tmp/dsec-test-*), loop devices holding a file there (doctor's ext4 image of a data dir on
 * an overlay root, host/data-dir-image.ts: still attached, even to a deleted file, while its
 * mount lives on somewhere) and cgroups of sandboxes on their edges (test edge ids are t<hex>,
 * see test/helpers/server.ts), and the cluster harness's network namespaces and bridges, so a
 * benchmark or another dsec running beside does not count.
 */
function hostDsecState() {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((mp) => mp.startsWith('/var/tmp/dsec-test-'));
  const loops = readdirSync('/sys/class/block')
    .filter((d) => /^loop\d+$/.test(d) && existsSync(`/sys/class/block/${d}/loop/backing_file`))
    .map((d) => `${d} ${readFileSync(`/sys/class/block/${d}/loop/backing_file`, 'utf8').trim()}`)
    .filter((l) => l.split(' ')[1]?.startsWith('/var/tmp/dsec-test-'));
  const cgroups = [];
  for (const h of existsSync('/sys/fs/cgroup') ? readdirSync('/sys/fs/cgroup') : []) {
    const d = join('/sys/fs/cgroup', h, 'dsec');
    if (!existsSync(d)) continue;
    for (const c of readdirSync(d, { withFileTypes: true }))
      if (c.isDirectory() && /^sb-t[0-9a-f]+-/.test(c.name)) cgroups.push(`${h}/dsec/${c.name}`);
  }
  // The cluster harness's network namespaces (dsec-<tag>-*) and bridges (dsbr<tag>), test/cluster/support/cluster-harness.ts.
  const netns = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => /^dsec-[0-9a-f]{6}-/.test(n)) : [];
  const bridges = readdirSync('/sys/class/net').filter((n) => /^dsbr[0-9a-f]{6}$/.test(n));
  return [
    ...mounts.map((m) => `mount ${m}`),
    ...loops.map((l) => `loop device ${l}`),
    ...cgroups.map((c) => `cgroup ${c}`),
    ...netns.map((n) => `netns ${n}`),
    ...bridges.map((b) => `bridge ${b}`),
  ];
}

const reportsDir = mkdtempSync(join(tmpdir(), 'dsec-test-reports-'));

/** A job of node's test runner on one file: TAP on stdout, failed tests to a file for the summary (failures-reporter.mjs). */
function nodeJob(pass, file, env) {
  const reportFile = join(reportsDir, `${pass}-${file.replaceAll('/', '_')}.txt`);
  const args = [
    '--test',
    '--test-reporter=tap',
    '--test-reporter-destination=stdout',
    `--test-reporter=${join(import.meta.dirname, 'failures-reporter.mjs')}`,
    `--test-reporter-destination=${reportFile}`,
    file,
  ];
  return { key: pass === 'node tests' ? file : `${pass}: ${file}`, pass, file, cmd: process.execPath, args, env, reportFile };
}

/**
 * The Python SDK's tests (python/tests/run.py: unittest, against a dsec it starts itself), with
 * Debian's python3 (what scripts/setup installs) ahead of any other on PATH. They run with the
 * whole suite, or when a filter names them (`node scripts/run-tests.mjs python`).
 */
function pythonJob() {
  const python = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
  return {
    key: 'python/tests/run.py',
    pass: 'python tests',
    file: 'python/tests/run.py',
    cmd: python,
    args: ['python/tests/run.py'],
    env: {},
  };
}

/** Each pass's exit status and the tests that failed in it, printed last so the tail of a long log says what failed. */
function printSummary(results, leaked, wallSeconds) {
  console.log('\n# summary of the suite');
  const passes = [...new Set(results.map((r) => r.pass))];
  for (const pass of passes) {
    const mine = results.filter((r) => r.pass === pass);
    const failedFiles = mine.filter((r) => r.status !== 0);
    const failed = [];
    for (const r of failedFiles) {
      const lines = r.reportFile && existsSync(r.reportFile) ? readFileSync(r.reportFile, 'utf8').split('\n').filter(Boolean) : [];
      failed.push(
        ...(lines.length
          ? lines
          : [
              `${r.file}: exited ${r.status}${r.timedOut ? ' (killed: it ran too long)' : ''}, no failed test reported (its output is above)`,
            ]),
      );
    }
    console.log(
      `# ${pass} (${mine.length} files): ${failedFiles.length ? `FAILED in ${failedFiles.length} files, ${failed.length} failed:` : 'passed'}`,
    );
    for (const f of failed) console.log(`#   ✖ ${f}`);
  }
  console.log(
    `# leak check (mounts and loop devices under /var/tmp/dsec-test-*, test edges' cgroups, cluster harness namespaces and bridges): ${leaked.length ? 'FAILED' : 'passed'}`,
  );
  for (const l of leaked) console.log(`#   ✖ ${l}`);
  const slowest = [...results].sort((a, b) => b.seconds - a.seconds).slice(0, 8);
  console.log(`# slowest files: ${slowest.map((r) => `${r.key} ${r.seconds} s`).join(', ')}`);
  console.log(
    `# wall time ${wallSeconds} s for ${results.length} files (${Math.round(results.reduce((s, r) => s + r.seconds, 0))} s of file time, ${slotCount()} at a time)`,
  );
}

/**
 * The tests run a second time with the state store on PostgreSQL (DSEC_TEST_STORE=postgres, see
 * packages/dsec/test/helpers/postgres.ts): the store's own unit tests and the API files that
 * exercise it most, not the whole suite again (CI time). They run with the whole suite, or alone
 * with the filter `postgres`.
 */
const POSTGRES_PASS = [
  'dist/src/control/',
  'dist/test/lifecycle.test.js',
  'dist/test/restart.test.js',
  'dist/test/state/lifecycle.test.js',
  'dist/test/engine/trajectory.test.js',
  'dist/test/cluster/batches.test.js',
  'dist/test/bad-input.test.js',
  'dist/test/system-routes.test.js',
];

/**
 * Sandboxes run in user namespaces by default; the opt-out (`--no-userns`, DSEC_USERNS=false:
 * sandboxes as host root) is kept working by running these files a second time with
 * DSEC_TEST_USERNS=0 (test/helpers/server.ts). With the whole suite, or alone with the filter
 * `no-userns`.
 */
const NO_USERNS_PASS = [
  'dist/test/lifecycle.test.js',
  'dist/test/exec.test.js',
  'dist/test/engine/enter.test.js',
  'dist/test/files.test.js',
  'dist/test/volumes.test.js',
  'dist/test/restart.test.js',
  'dist/test/snapshot-images.test.js',
  'dist/test/path-escape.test.js',
  'dist/test/security/host-files.test.js',
  'dist/test/security/layers.test.js',
];

const filter = process.argv.slice(2);
let files = [...findTests('packages/sdk/dist'), ...findTests('packages/dsec/dist'), ...findTests('packages/bench/dist')].sort();
const postgresFiles = files.filter((f) => f.startsWith('packages/dsec/') && POSTGRES_PASS.some((x) => f.includes(x)));
const withPostgres = !filter.length || filter.includes('postgres');
const noUsernsFiles = files.filter((f) => f.startsWith('packages/dsec/') && NO_USERNS_PASS.some((x) => f.includes(x)));
const withNoUserns = !filter.length || filter.includes('no-userns');
if (filter.length) files = files.filter((f) => filter.some((x) => f.includes(x)));
const withPython = !filter.length || filter.some((x) => 'python/tests/run.py'.includes(x));
const before = new Set(hostDsecState());
// What an earlier run (or a process killed mid-test) left is not this run's leak, but it is shown:
// the leak check below compares against it, so it would otherwise pass unseen.
if (before.size) console.log(`# already on this host before the suite (not counted as its leaks):\n#   ${[...before].join('\n#   ')}`);
// A filter that names nothing is a typo: say so rather than pass with no test run.
if (filter.length && !files.length && !withPython && !withPostgres && !withNoUserns) {
  console.error(`run-tests: no compiled test file matches ${filter.join(' ')} (paths under packages/*/dist; build first)`);
  process.exit(2);
}
// Without Debian's server binaries (scripts/setup leaves postgresql out where it cannot be
// configured) the second pass is skipped, saying why, as each PostgreSQL-only test skips.
const postgresMissing = withPostgres && !postgresInstalled();
if (postgresMissing)
  console.log(
    '# skipped: the PostgreSQL pass (no initdb under /usr/lib/postgresql/*/bin: scripts/setup --tests did not install postgresql here)',
  );
const jobs = [
  ...files.map((f) => nodeJob('node tests', f, {})),
  ...(withPostgres && !postgresMissing ? postgresFiles.map((f) => nodeJob('the PostgreSQL pass', f, { DSEC_TEST_STORE: 'postgres' })) : []),
  ...(withNoUserns ? noUsernsFiles.map((f) => nodeJob('the no-userns pass', f, { DSEC_TEST_USERNS: '0' })) : []),
  ...(withPython ? [pythonJob()] : []),
];
const suiteStart = Date.now();
const results = await runPool(jobs, slotCount());
const leaked = hostDsecState().filter((x) => !before.has(x));
printSummary(results, leaked, Math.round((Date.now() - suiteStart) / 1000));
rmSync(reportsDir, { recursive: true, force: true });
if (leaked.length) {
  console.error(`the test suite leaked:\n  ${leaked.join('\n  ')}`);
  process.exit(1);
}
process.exit(results.find((r) => r.status !== 0)?.status ?? 0);

function postgresInstalled() {
  try {
    return readdirSync('/usr/lib/postgresql').some((v) => existsSync(`/usr/lib/postgresql/${v}/bin/initdb`));
  } catch {
    return false;
  }
}
