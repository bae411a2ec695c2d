// Runs the suite's test files side by side: each file is one job (its own `node --test` process,
// or the Python SDK's runner), a few jobs at a time, each job's output printed whole when it ends
// so that TAP blocks never interleave. Used by run-tests.mjs.
//
// Why files can share the machine: every test server has its own data dir (/var/tmp/dsec-test-*),
// edge id (t<hex>: its own cgroups, nftables table, crun root and link block), port and, in the
// cluster harness, its own bridge and /24 (claimed by a file, cluster-harness.ts). What cannot
// share is said per file below: microVM files (QEMU is CPU-heavy; two at once on two cores only
// slow each other) run one at a time, and files that change or measure the whole host run alone
// after the pool has drained.
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync, renameSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';

/**
 * Files that change or measure host-wide state, so another file running beside them could fail
 * them or be failed by them. Each runs alone once the pool has drained.
 */
export const ALONE = [
  // Puts `dsec up` in a small memory cgroup and drives it to OOM; the node's free memory matters.
  'reliability/memory-pressure.test.js',
  // Loop devices and mounts of doctor's ext4 image; counts which mount namespaces hold a device.
  'reliability/data-dir-disk.test.js',
  // doctor on the host's own cgroup mounts and data dirs.
  'reliability/doctor-fixes.test.js',
  // prlimit and sysctls of the host, as doctor reports them.
  'reliability/host-limits.test.js',
  // Fills the node: its density numbers are the node's, not shared.
  'bench/dist/test/full-node.test.js',
  // Restores and watches the host's /dev/null owner around creates.
  'security/host-null.test.js',
  // Several edges' guard tables and link blocks on the host at once.
  'security/edges-on-one-host.test.js',
  // Port scans and nftables guard checks from the host's side.
  'security/network.test.js',
  // Counts the host disk a sandbox can fill, and the server's memory.
  'security/resources.test.js',
  // Sets fs.inotify.max_user_instances to 128 for a while: other files' watchers would fail.
  'security/userns.test.js',
  // Sweeps harness namespaces of a fake owner whose tag is fixed: another harness could be counted.
  'cluster/harness-sweep.test.js',
];

/** Files that boot microVMs (test/helpers/vm.ts): at most one runs at a time. */
export const VM = [
  'engine/bad-input.test.js',
  'engine/debian.test.js',
  'engine/files.test.js',
  'engine/limits.test.js',
  'engine/processes.test.js',
  'engine/pty.test.js',
  'engine/sessions.test.js',
  'engine/streaming.test.js',
  'engine/trajectory.test.js',
  'security/vm-agent-forgery.test.js',
  'dsec/dist/test/vm.test.js',
  'dsec/dist/test/vm-migrate.test.js',
];

/** A file is killed (its whole process group) when it runs this long: a hang is a failure, not a stall of CI. */
const FILE_TIMEOUT_MS = Number(process.env.DSEC_TEST_FILE_TIMEOUT_S ?? 1800) * 1000;

/** Seconds each file took last time (per pass), so the longest start first; kept beside the test data dirs. */
const DURATIONS = '/var/tmp/dsec-test-durations.json';
/** The same, from a full run on this machine kind, committed: what a fresh clone (CI) orders by. */
const DURATIONS_SEED = join(import.meta.dirname, 'test-durations.json');

function readDurations() {
  for (const f of [DURATIONS, DURATIONS_SEED]) {
    try {
      return JSON.parse(readFileSync(f, 'utf8'));
    } catch {
      // absent or unreadable: the next, then none
    }
  }
  return {};
}

export function classOf(file) {
  if (ALONE.some((x) => file.endsWith(x))) return 'alone';
  if (VM.some((x) => file.endsWith(x))) return 'vm';
  return 'shared';
}

/** How many files run at once: DSEC_TEST_JOBS, else one per CPU. */
export function slotCount() {
  const n = Number(process.env.DSEC_TEST_JOBS);
  return Number.isInteger(n) && n > 0 ? n : availableParallelism();
}

/**
 * Runs `jobs` ({ key, pass, file, cmd, args, env, reportFile }) and resolves to one result per job
 * ({ ...job, status, seconds, timedOut }). Each job's output is printed as one block when it ends.
 */
export async function runPool(jobs, slots) {
  const known = readDurations();
  const expected = (j) => known[j.key] ?? 10;
  const queue = jobs.filter((j) => classOf(j.file) !== 'alone').sort((a, b) => expected(b) - expected(a));
  const alone = jobs.filter((j) => classOf(j.file) === 'alone').sort((a, b) => expected(b) - expected(a));
  const running = new Set();
  const results = [];
  const started = Date.now();
  const stopAll = (signal) => {
    for (const r of running) killGroup(r.child, 'SIGTERM');
    process.exit(signal === 'SIGINT' ? 130 : 143);
  };
  process.once('SIGINT', stopAll);
  process.once('SIGTERM', stopAll);

  console.log(`# running ${jobs.length} test files, ${slots} at a time (DSEC_TEST_JOBS); ${alone.length} alone at the end`);
  await new Promise((resolve) => {
    const next = () => {
      while (running.size < slots && queue.length) {
        const vmBusy = [...running].some((r) => classOf(r.job.file) === 'vm');
        const i = queue.findIndex((j) => !(vmBusy && classOf(j.file) === 'vm'));
        if (i < 0) break;
        const [job] = queue.splice(i, 1);
        const r = start(job, started);
        running.add(r);
        r.done.then((result) => {
          running.delete(r);
          results.push(result);
          next();
        });
      }
      if (!running.size && !queue.length) resolve();
    };
    next();
  });
  for (const job of alone) results.push(await start(job, started).done);

  process.removeListener('SIGINT', stopAll);
  process.removeListener('SIGTERM', stopAll);
  saveDurations(known, results);
  return results;
}

function start(job, suiteStart) {
  const at = Math.round((Date.now() - suiteStart) / 1000);
  console.log(`# start ${job.key} (at ${at} s)`);
  const t0 = Date.now();
  // Its own process group, so a watchdog kill reaches the runner's children too.
  const child = spawn(job.cmd, job.args, { env: { ...process.env, ...job.env }, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const chunks = [];
  child.stdout.on('data', (c) => chunks.push(c));
  child.stderr.on('data', (c) => chunks.push(c));
  let timedOut = false;
  const watchdog = setTimeout(() => {
    timedOut = true;
    killGroup(child, 'SIGKILL');
  }, FILE_TIMEOUT_MS);
  const done = new Promise((resolve) => {
    child.on('close', (code, signal) => {
      clearTimeout(watchdog);
      const seconds = Math.round((Date.now() - t0) / 100) / 10;
      const status = timedOut ? 124 : (code ?? (signal ? 128 : 1));
      process.stdout.write(
        `\n# ---- ${job.key}: ${seconds} s, ${status === 0 ? 'passed' : `FAILED (exit ${status}${signal ? `, ${signal}` : ''})`}\n`,
      );
      process.stdout.write(Buffer.concat(chunks));
      if (timedOut) process.stdout.write(`# ${job.key} was killed after ${FILE_TIMEOUT_MS / 1000} s (DSEC_TEST_FILE_TIMEOUT_S)\n`);
      resolve({ ...job, status, seconds, timedOut });
    });
  });
  return { job, child, done };
}

function killGroup(child, signal) {
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}

function saveDurations(known, results) {
  const next = { ...known };
  for (const r of results) if (r.status === 0) next[r.key] = r.seconds;
  try {
    writeFileSync(`${DURATIONS}.${process.pid}`, `${JSON.stringify(next, null, 1)}\n`);
    renameSync(`${DURATIONS}.${process.pid}`, DURATIONS);
  } catch {
    // /var/tmp not writable: ordering falls back to the seed next time
  }
}
