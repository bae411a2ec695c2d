/**
 * microVM creates from the image's snapshot (edge/backends/vm/vm-image-snapshot.ts), for real:
 * QEMU under TCG here. The first create of an image makes the snapshot (a boot); the next ones
 * restore it with the snapshot's RAM mapped copy-on-write. Each restored guest must be its own:
 * its own disk, channel key, RNG and clock; a stale snapshot must not be used.
 */
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { VmRecord } from '../src/edge/backends/vm/vm-record.js';
import { findLeaks } from '../src/host/leak-check.js';
import { startTestServer, type TestServer } from './helpers/server.js';
import { vmSkipReason } from './helpers/vm.js';

const skip = vmSkipReason();
const resources = { memoryMiB: 256, cpu: 1, diskMiB: 256 };

describe('microVM create from the image snapshot: own disk, own identity, stale snapshots unused', { skip, timeout: 600_000 }, () => {
  let server: TestServer;
  const record = (id: string): VmRecord =>
    JSON.parse(readFileSync(join(server.dataDir, 'node', 'vms', id, 'state.json'), 'utf8')) as VmRecord;
  const snapshotDir = (): string => join(server.dataDir, 'node', 'vm-snapshots');
  const qemuCmdline = (id: string): string[] => readFileSync(`/proc/${record(id).pid}/cmdline`, 'utf8').split('\0');
  const create = (): Promise<Sandbox> => Sandbox.create({ ...server.conn, backend: 'microvm', resources });

  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('the first create makes the snapshot; siblings restored from it run commands, each with its own disk changes', async () => {
    const first = await create();
    assert.equal(record(first.id).started, 'image-snapshot', 'the first create restores the snapshot it made');
    assert.ok(record(first.id).createPhases?.['makeSnapshot'], JSON.stringify(record(first.id).createPhases));
    const slots = readdirSync(snapshotDir());
    assert.equal(slots.length, 1, slots.join(' '));
    const ram = join(snapshotDir(), slots[0]!, 'ram');
    const [b, c] = [await create(), await create()];
    for (const sb of [b, c]) {
      const r = record(sb.id);
      assert.equal(r.started, 'image-snapshot');
      assert.equal(r.createPhases?.['makeSnapshot'], undefined, 'made once per image');
      // The guest's RAM is the snapshot's file, mapped privately (copy-on-write).
      const cmd = qemuCmdline(sb.id);
      assert.ok(
        cmd.some((a) => a.includes(`mem-path=${ram},share=off`)),
        cmd.join(' '),
      );
      assert.equal((await sb.commands.run('echo hello; cat /proc/1/comm')).stdout, 'hello\ninit\n');
    }
    await b.files.write('/work/only-b', 'b');
    await c.commands.run('mkdir -p /work && echo c > /work/only-c && sync');
    assert.equal(await c.files.exists('/work/only-b'), false, "a sibling does not see b's file");
    assert.equal(await b.files.exists('/work/only-c'), false, "b does not see c's file");
    assert.equal(await first.files.exists('/work/only-b'), false);
    assert.equal(Buffer.from(await b.files.read('/work/only-b')).toString(), 'b');
    // A write to guest RAM in one is not seen by another (private mapping, not the shared file).
    await b.commands.run('echo b-ram > /dev/shm/x');
    assert.equal((await c.commands.run('cat /dev/shm/x 2>&1 || echo none')).stdout.trim().endsWith('none'), true);
    for (const sb of [first, b, c]) await sb.kill();
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [first.id, b.id, c.id] }), []);
  });

  test("siblings share no secret or clock: own channel key, own RNG output and boot id, the host's wall clock", async () => {
    // Long enough after the snapshot that a guest whose clock was not set would be behind.
    await new Promise((r) => setTimeout(r, 6000));
    const [b, c] = [await create(), await create()];
    assert.notEqual(record(b.id).agentKey, record(c.id).agentKey, 'each VM has its own channel key');
    const probe = 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"; echo; cat /proc/sys/kernel/random/boot_id; date +%s';
    const [rb, rc] = [await b.commands.run(probe), await c.commands.run(probe)];
    const host = Math.round(Date.now() / 1000);
    const [randB, bootB, timeB] = rb.stdout.trim().split('\n');
    const [randC, bootC, timeC] = rc.stdout.trim().split('\n');
    assert.match(randB!, /^[0-9a-f]{32}$/);
    // The property, not the mechanism: a young guest kernel also reseeds on its own within seconds
    // (from interrupt timings, which differ per guest), so this held here without the edge's seed
    // too; the seed makes it hold from the first byte after the key.
    assert.notEqual(randB, randC, 'the guests draw different random bytes (RNG reseeded per guest)');
    assert.notEqual(bootB, bootC);
    for (const t of [timeB, timeC]) assert.ok(Math.abs(Number(t) - host) <= 3, `guest clock ${t} vs host ${host}: set at restore`);
    for (const sb of [b, c]) await sb.kill();
  });

  test('a stale snapshot (made by another kernel, agent or QEMU) is not used: the create boots and makes a fresh one', async () => {
    const slots = readdirSync(snapshotDir());
    assert.equal(slots.length, 1);
    const metaFile = join(snapshotDir(), slots[0]!, 'meta.json');
    const meta = JSON.parse(readFileSync(metaFile, 'utf8')) as { fingerprint: string; createdAt: string };
    // What a change of the guest kernel, initramfs (agent) or QEMU binary does to the fingerprint.
    writeFileSync(metaFile, JSON.stringify({ ...meta, fingerprint: '0'.repeat(64) }));
    const sb = await create();
    const r = record(sb.id);
    assert.ok(r.createPhases?.['makeSnapshot'], `a new snapshot was made: ${JSON.stringify(r.createPhases)}`);
    const fresh = JSON.parse(readFileSync(metaFile, 'utf8')) as { fingerprint: string; createdAt: string };
    assert.equal(fresh.fingerprint, meta.fingerprint, 'the new snapshot has the current fingerprint');
    assert.notEqual(fresh.createdAt, meta.createdAt);
    assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    await sb.kill();
  });

  test('a snapshot QEMU cannot restore is dropped and the create boots', async () => {
    const slot = readdirSync(snapshotDir())[0]!;
    writeFileSync(join(snapshotDir(), slot, 'state.bin'), 'not a migration stream');
    const sb = await create();
    assert.equal(record(sb.id).started, 'boot');
    assert.equal((await sb.commands.run('echo ok')).stdout, 'ok\n');
    assert.deepEqual(readdirSync(snapshotDir()), [], 'the broken snapshot is gone');
    await sb.kill();
  });
});
