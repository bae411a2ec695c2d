import { createReadStream, createWriteStream, existsSync, renameSync, rmSync, statSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { pipeline } from 'node:stream/promises';
import type { QmpClient } from './qmp-client.js';
import type { PhaseClock } from './phase-clock.js';

/**
 * A VM's memory and device state through QEMU's migration stream, kept in a file. QEMU 7.2 has no
 * `file:` migration URI, and `exec:` would need QEMU to spawn a shell, which its seccomp filter
 * (`-sandbox spawn=deny`) forbids; so the stream goes over a unix socket the edge serves (save)
 * or QEMU listens on (`-incoming unix:…`, restore), and the edge copies it to or from the file.
 */

const IGNORE_SHARED = { capability: 'x-ignore-shared', state: true };

/** How long a migration may take (TCG, a loaded host, a guest of a few GiB). */
const MIGRATION_TIMEOUT_MS = 10 * 60_000;

/**
 * Writes the state of a stopped VM to `file` (atomically: a partial file never has the name).
 * The VM stays stopped afterwards (QEMU's postmigrate); QMP `cont` runs it again.
 */
export async function saveVmState(
  qmp: QmpClient,
  socketPath: string,
  file: string,
  opts: { ignoreShared?: boolean } = {},
): Promise<{ bytes: number }> {
  rmSync(socketPath, { force: true });
  const tmp = `${file}.partial`;
  let accept!: (s: Socket) => void;
  const connected = new Promise<Socket>((r) => (accept = r));
  const server = createServer((s) => accept(s));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(socketPath, () => resolve());
  });
  try {
    // RAM in a shared file (an image's snapshot, vm-image-snapshot.ts) is left out of the stream.
    if (opts.ignoreShared) await qmp.execute('migrate-set-capabilities', { capabilities: [IGNORE_SHARED] });
    await qmp.execute('migrate', { uri: `unix:${socketPath}` });
    const socket = await withTimeout(connected, 30_000, 'QEMU did not connect to the migration socket');
    const written = pipeline(socket, createWriteStream(tmp));
    await waitMigration(qmp);
    await withTimeout(written, 60_000, 'the migration stream did not end');
    renameSync(tmp, file);
    return { bytes: statSync(file).size };
  } catch (err) {
    rmSync(tmp, { force: true });
    await qmp.execute('migrate_cancel').catch(() => undefined);
    throw err;
  } finally {
    server.close();
    rmSync(socketPath, { force: true });
  }
}

/** Polls query-migrate until the outgoing migration completed; throws QEMU's reason when it failed. */
async function waitMigration(qmp: QmpClient): Promise<void> {
  const deadline = Date.now() + MIGRATION_TIMEOUT_MS;
  for (;;) {
    const m = (await qmp.execute('query-migrate')) as { status?: string; 'error-desc'?: string };
    if (m.status === 'completed') return;
    if (m.status === 'failed' || m.status === 'cancelled')
      throw new Error(`QEMU's migration ${m.status}: ${m['error-desc'] ?? 'no reason given'}`);
    if (Date.now() > deadline)
      throw new Error(`the migration did not complete within ${MIGRATION_TIMEOUT_MS} ms (status ${m.status ?? '?'})`);
    await sleep(20);
  }
}

/**
 * Feeds `file` to a QEMU started with `-incoming unix:<socketPath>` and runs the guest once the
 * state is loaded. `alive` says whether QEMU still runs. `ignoreShared`: QEMU was started with
 * `-incoming defer`; the state was saved with x-ignore-shared (its RAM is in a file QEMU maps),
 * which the incoming side must set too before the migration starts.
 */
export async function loadVmState(
  socketPath: string,
  file: string,
  qmpOpen: () => Promise<QmpClient>,
  alive: () => boolean,
  phases?: PhaseClock,
  opts: { ignoreShared?: boolean } = {},
): Promise<QmpClient> {
  const deadline = Date.now() + MIGRATION_TIMEOUT_MS;
  let early: QmpClient | undefined;
  if (opts.ignoreShared) {
    early = await qmpWhenUp(qmpOpen, alive, deadline);
    try {
      await early.execute('migrate-set-capabilities', { capabilities: [IGNORE_SHARED] });
      await early.execute('migrate-incoming', { uri: `unix:${socketPath}` });
    } catch (err) {
      early.close();
      throw err;
    }
  }
  let socket: Socket | undefined;
  while (!socket) {
    if (!alive()) throw new Error('QEMU exited before it took the saved state');
    if (Date.now() > deadline) throw new Error('QEMU made no incoming migration socket');
    if (existsSync(socketPath)) socket = await connectUnix(socketPath).catch(() => undefined);
    if (!socket) await sleep(20);
  }
  phases?.mark('qemuListening');
  // QEMU closes the socket as soon as it has read the stream's end marker, which can beat the
  // socket's own 'finish': whether the load worked is QEMU's to say (query-migrate), not the pipe's.
  const source = createReadStream(file);
  let readError: Error | undefined;
  source.on('error', (err) => {
    readError = err;
    socket.destroy();
  });
  socket.on('error', () => undefined);
  source.once('end', () => phases?.mark('streamRead'));
  source.pipe(socket);
  let qmp: QmpClient;
  try {
    qmp = early ?? (await qmpOpen());
  } catch (err) {
    source.destroy();
    socket.destroy();
    throw err;
  }
  for (;;) {
    const st = (await qmp.execute('query-status')) as { status?: string };
    if (st.status === 'running') {
      // The capability would stay set for this VM's own saves (a fork of it), whose RAM is its own.
      if (opts.ignoreShared) await qmp.execute('migrate-set-capabilities', { capabilities: [{ ...IGNORE_SHARED, state: false }] });
      phases?.mark('running');
      return qmp;
    }
    const m = (await qmp.execute('query-migrate')) as { status?: string; 'error-desc'?: string };
    // The stream carries the run state the source had: saved stopped (as snapshots are), the
    // guest arrives paused and is started here.
    if (m.status === 'completed' && st.status === 'paused') {
      await qmp.execute('cont');
      continue;
    }
    if (m.status === 'failed') {
      qmp.close();
      throw new Error(`QEMU could not load the saved state: ${m['error-desc'] ?? 'no reason given'}`);
    }
    if (readError) {
      qmp.close();
      throw new Error(`could not read the saved state: ${readError.message}`);
    }
    if (!alive()) throw new Error('QEMU exited while loading the saved state (see its log)');
    if (Date.now() > deadline) {
      qmp.close();
      throw new Error(`the restored VM was not running within ${MIGRATION_TIMEOUT_MS} ms (status ${st.status ?? '?'})`);
    }
    await sleep(20);
  }
}

/** QMP of a QEMU that has just been started (its socket appears once it is up). */
async function qmpWhenUp(qmpOpen: () => Promise<QmpClient>, alive: () => boolean, deadline: number): Promise<QmpClient> {
  for (;;) {
    const qmp = await qmpOpen().catch(() => undefined);
    if (qmp) return qmp;
    if (!alive()) throw new Error('QEMU exited before it took the saved state');
    if (Date.now() > deadline) throw new Error('QEMU made no QMP socket');
    await sleep(10);
  }
}

function connectUnix(path: string): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const s = connect(path);
    s.once('connect', () => {
      s.removeListener('error', reject);
      resolve(s);
    });
    s.once('error', reject);
  });
}

/** `p`, or a rejection saying `what` after `ms`. */
export function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([p, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(what)), ms)))]).finally(() =>
    clearTimeout(timer),
  );
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
