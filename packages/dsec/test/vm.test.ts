/**
 * microVM and VM sandboxes for real: QEMU (TCG here) boots Debian's kernel with the dsec guest
 * agent, the image's EROFS layers as virtio-blk disks. One boot per describe, to keep CI short.
 */
import assert from 'node:assert/strict';
import { existsSync, readFileSync, statSync } from 'node:fs';
import { release } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { which } from '../src/host/doctor.js';
import { findLeaks } from '../src/host/leak-check.js';
import { guestAssets } from '../src/edge/backends/vm/guest-assets.js';
import type { RunningDsec } from '../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';
import { TermCapture } from './engine/support/term.js';

function vmSkipReason(): string | undefined {
  const base = integrationSkipReason();
  if (base) return base;
  if (!which('qemu-system-x86_64')) return 'VM tests need qemu-system-x86_64 (scripts/setup installs it)';
  const g = guestAssets();
  if ('missing' in g) return g.missing;
  return undefined;
}
const skip = vmSkipReason();

/** Whether a process exists and is not a zombie. */
function alive(pid: number): boolean {
  try {
    return !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

describe('microvm sandbox: exec, files, processes, pause, isolation, kill', { skip, timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let vmDir: string;
  let qemuPid: number;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, backend: 'microvm', resources: { memoryMiB: 256, cpu: 1, diskMiB: 64 } });
    vmDir = join(server.dataDir, 'node', 'vms', sb.id);
    qemuPid = (await server.dsec.vms!.listSandboxes()).find((s) => s.id === sb.id)!.pid;
  });
  after(async () => {
    await server?.close();
  });

  test('the sandbox is a microvm with its own kernel, and the record says so', async () => {
    assert.equal(sb.info.backend, 'microvm');
    assert.equal((await sb.refresh()).backend, 'microvm');
    const r = await sb.commands.run('uname -r; cat /proc/1/comm');
    assert.equal(r.exitCode, 0, r.stderr);
    const [kernel, init] = r.stdout.trim().split('\n');
    assert.notEqual(kernel, release(), 'the guest runs its own kernel, not the host one');
    assert.equal(kernel, kernelVersion());
    assert.equal(init, 'init', 'PID 1 is the dsec agent (the initramfs /init)');
    const cmd = readFileSync(`/proc/${qemuPid}/cmdline`, 'utf8').split('\0');
    assert.ok(cmd.includes('-M') && cmd[cmd.indexOf('-M') + 1]!.startsWith('microvm'), cmd.join(' '));
  });

  test('exec: exit code, both streams, env, cwd, stdin, a missing binary', async () => {
    const r = await sb.commands.run('echo out; echo err >&2; echo "$FOO"; pwd; exit 7', { env: { FOO: 'bar' }, cwd: '/tmp' });
    assert.equal(r.exitCode, 7);
    assert.equal(r.stdout, 'out\nbar\n/tmp\n');
    assert.equal(r.stderr, 'err\n');
    const cat = await sb.commands.run(['cat'], { stdin: 'piped in' });
    assert.equal(cat.stdout, 'piped in');
    const missing = await sb.commands.run(['/no/such/binary']);
    assert.equal(missing.exitCode, 127);
    assert.match(missing.stderr, /No such file|not found/);
  });

  test('exec: output streams as it is produced; timeouts kill the command group', async () => {
    const seen: string[] = [];
    for await (const ev of sb.commands.stream('for i in 1 2 3; do echo line$i; sleep 0.2; done; echo bye >&2')) {
      if (ev.type === 'exit') {
        assert.equal(ev.exitCode, 0);
        seen.push('exit');
      } else seen.push(`${ev.type}:${Buffer.from(ev.data).toString()}`);
    }
    assert.deepEqual(seen.filter((s) => s.startsWith('stdout')).join(''), 'stdout:line1\nstdout:line2\nstdout:line3\n');
    assert.ok(seen.indexOf('stdout:line1\n') < seen.indexOf('stdout:line3\n'));
    assert.equal(seen.at(-1), 'exit');
    const t = await sb.commands.run('sleep 100 & sleep 100', { timeoutMs: 500 });
    assert.equal(t.timedOut, true);
    assert.equal(t.exitCode, 137);
    const left = await sb.commands.run('ps -o comm | grep -c "^sleep" || true');
    assert.equal(left.stdout.trim(), '0', 'the timeout killed the command and what it started');
  });

  test('files: write, read, stat, list, mkdir, rename, remove, and errors as for containers', async () => {
    await sb.files.mkdir('/work/a/b', { parents: true });
    await sb.files.write('/work/a/b/f.txt', 'hello vm', { mode: 0o600 });
    assert.equal(await sb.files.readText('/work/a/b/f.txt'), 'hello vm');
    const st = await sb.files.stat('/work/a/b/f.txt');
    assert.equal(st.type, 'file');
    assert.equal(st.size, 8);
    assert.equal(st.mode, '0600');
    await sb.files.rename('/work/a/b/f.txt', '/work/a/g.txt');
    const names = (await sb.files.list('/work/a')).entries.map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ['b:dir', 'g.txt:file']);
    const seenByCommand = await sb.commands.run('cat /work/a/g.txt');
    assert.equal(seenByCommand.stdout, 'hello vm', 'files and exec see one filesystem');
    const big = Buffer.alloc(3 << 20, 7);
    await sb.files.write('/work/big.bin', big);
    assert.ok(Buffer.from(await sb.files.read('/work/big.bin')).equals(big));
    await sb.files.remove('/work/a', { recursive: true });
    assert.equal(await sb.files.exists('/work/a'), false);
    expectWireError(await call(server.conn, 'GET', `/v1/sandboxes/${sb.id}/files?path=/work/nope`), 404, 'FILE_NOT_FOUND');
    expectWireError(await call(server.conn, 'GET', `/v1/sandboxes/${sb.id}/files?path=/work`), 409, 'PATH_CONFLICT');
  });

  test('diskMiB limits the writable disk: writing past it fails inside the guest', async () => {
    const r = await sb.commands.run('dd if=/dev/zero of=/work/fill bs=1M count=200 2>&1; echo rc=$?; rm -f /work/fill');
    assert.match(r.stdout, /No space left on device/);
  });

  test('background processes: stdin, output, signals, wait', async () => {
    const p = await sb.commands.start(['sh', '-c', 'while read l; do echo got:$l; done; echo eof'], { stdin: true });
    await p.writeStdin('one\n');
    await p.writeStdin('two\n', { eof: true });
    const info = await p.wait({ waitMs: 30_000 });
    assert.equal(info.status, 'exited');
    assert.equal(info.exitCode, 0);
    assert.equal((await p.output()).stdout, 'got:one\ngot:two\neof\n');
    const s = await sb.commands.start('sleep 1000');
    const killed = await s.signal('SIGTERM');
    const done = killed.status === 'exited' ? killed : await s.wait({ waitMs: 30_000 });
    assert.equal(done.exitCode, 128 + 15);
  });

  test('pause stops the vCPUs (calls refused while paused), resume continues', async () => {
    await sb.commands.run('date +%s > /work/before');
    await sb.pause();
    assert.equal((await sb.refresh()).status, 'paused');
    const status = (await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: 'true' } })).status;
    assert.ok(status === 409, `exec on a paused VM: ${status}`);
    await sb.resume();
    const r = await sb.commands.run('cat /work/before');
    assert.equal(r.exitCode, 0);
  });

  test('a terminal: a real pty in the guest, its size, resize, keystrokes, exit code', async () => {
    const cap = new TermCapture();
    const t = await sb.terminal({ cmd: ['/bin/sh'], cols: 100, rows: 30, onData: cap.onData });
    t.write('tty; stty size\r');
    assert.ok(await cap.waitFor(/\/dev\/pts\/\d+[\s\S]*\b30 100\b/), JSON.stringify(cap.text));
    const mark = cap.text.length;
    t.resize(120, 40);
    t.write('stty size\r');
    assert.ok(await cap.waitFor(/\b40 120\b/, mark), JSON.stringify(cap.since(mark)));
    t.write('exit 7\r');
    assert.equal(await t.exited, 7);
  });

  test('calls a VM does not serve answer BACKEND_UNSUPPORTED, and nothing half-happens', async () => {
    expectWireError(await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/sessions`, { json: {} }), 400, 'BACKEND_UNSUPPORTED');
    expectWireError(await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/snapshot`, { json: {} }), 400, 'BACKEND_UNSUPPORTED');
    expectWireError(await call(server.conn, 'PUT', `/v1/sandboxes/${sb.id}/network`, { json: { mode: 'allow', allow: ['169.254.7.7'] } }), 400, 'BACKEND_UNSUPPORTED');
    const e = expectWireError(
      await call(server.conn, 'POST', '/v1/sandboxes', { json: { image: 'busybox', backend: 'microvm', network: { mode: 'allow', allow: ['169.254.7.7'] } } }),
      400,
      'BACKEND_UNSUPPORTED',
    );
    assert.match(e.message, /network/i);
    expectWireError(await call(server.conn, 'POST', '/v1/sandboxes', { json: { image: 'busybox', backend: 'firecracker' } }), 400, 'INVALID_REQUEST');
    assert.equal((await server.dsec.vms!.listSandboxes()).length, 1, 'a refused create leaves no VM');
  });

  test('red team: the guest has no network device, so no edge or control-plane port is reachable', async () => {
    const port = new URL(server.url).port;
    const r = await sb.commands.run(`ls /sys/class/net; echo | nc 127.0.0.1 ${port}; echo rc=$?; ip route 2>&1 | wc -l`);
    const lines = r.stdout.trim().split('\n');
    assert.equal(lines[0], 'lo', `only loopback: ${r.stdout}`);
    assert.ok(lines.includes('rc=1'), `the control plane's port on the guest's loopback is the guest's own, where nothing listens: ${r.stdout} ${r.stderr}`);
    assert.match(r.stderr, /refused/);
    assert.equal(lines.at(-1), '0', 'no routes at all');
    const cmd = readFileSync(`/proc/${qemuPid}/cmdline`, 'utf8').split('\0');
    assert.ok(!cmd.some((a) => /netdev|-nic|virtio-net|user,/.test(a)), `QEMU has no network backend: ${cmd.join(' ')}`);
  });

  test("red team: the agent's channel accepts only the edge", async () => {
    // In the guest: the port's node is gone, and a recreated one cannot be opened (the agent holds it).
    const r = await sb.commands.run(
      'ls /dev/vport* 2>/dev/null; d=$(cat /sys/class/virtio-ports/*/dev); mknod /tmp/port c ${d%:*} ${d#*:} && echo x > /tmp/port; echo rc=$?',
    );
    assert.doesNotMatch(r.stdout, /\/dev\/vport/, 'the agent unlinks the port node');
    assert.match(r.stderr, /busy/i, r.stderr);
    assert.match(r.stdout, /rc=[1-9]/);
    // On the host: the sockets live in a directory only root can enter.
    assert.equal(statSync(vmDir).mode & 0o777, 0o700);
    assert.equal(statSync(vmDir).uid, 0);
    assert.ok(statSync(join(vmDir, 'agent.sock')).isSocket());
  });

  test('kill: no QEMU, disk, socket or directory is left', async () => {
    assert.ok(alive(qemuPid));
    const before = await findLeaks(server.dataDir, { onlyIds: [sb.id] });
    assert.ok(before.some((l) => l.startsWith('QEMU process')) && before.some((l) => l.startsWith('VM directory')), `the leak check sees a live VM: ${before}`);
    await sb.kill();
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [sb.id] }), []);
    assert.equal(alive(qemuPid), false, 'QEMU exited');
    assert.equal(existsSync(vmDir), false, 'the VM directory (disk, sockets, logs) is gone');
    assert.equal((await server.dsec.vms!.listSandboxes()).length, 0);
  });
});

describe('vm (q35) sandbox boots and serves exec and files', { skip, timeout: 600_000 }, () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('create, exec, files, kill', async () => {
    const sb = await Sandbox.create({ ...server.conn, backend: 'vm', resources: { memoryMiB: 256, cpu: 2 } });
    const pid = (await server.dsec.vms!.listSandboxes())[0]!.pid;
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    assert.equal(cmd[cmd.indexOf('-M') + 1], 'q35');
    const r = await sb.commands.run('grep -c ^processor /proc/cpuinfo; ls /sys/bus/pci/devices | wc -l');
    const [cpus, pci] = r.stdout.trim().split('\n').map(Number);
    assert.equal(cpus, 2, 'cpu: 2 gives two vCPUs');
    assert.ok(pci! > 0, 'a q35 guest has PCI devices');
    await sb.files.write('/root-file', 'q35');
    assert.equal((await sb.commands.run('cat /root-file')).stdout, 'q35');
    await sb.kill();
    assert.equal(alive(pid), false);
  });
});

describe('a VM that cannot boot fails with a readable reason and leaves nothing', { skip, timeout: 300_000 }, () => {
  let server: TestServer;
  before(async () => {
    server = await startTestServer();
  });
  after(async () => {
    await server?.close();
  });

  test('16 MiB of guest RAM: the guest kernel cannot start; the create fails naming why, the record says failed', async () => {
    const res = await call(server.conn, 'POST', '/v1/sandboxes', { json: { image: 'busybox', backend: 'microvm', resources: { memoryMiB: 16 } }, timeoutMs: 240_000 });
    const e = expectWireError(res, 500, 'SANDBOX_CREATE_FAILED');
    assert.match(e.message, /QEMU exited during boot.*(memory|panic|Out of)/i, e.message);
    const id = String(e.details['sandboxId']);
    const info = (await call(server.conn, 'GET', `/v1/sandboxes/${id}`)).json as { status: string; reason?: string };
    assert.equal(info.status, 'failed');
    assert.ok((info.reason ?? '').length > 0);
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [id] }), []);
  });
});

describe('VMs across an edge restart and a QEMU crash', { skip, timeout: 600_000 }, () => {
  let dataDir = '';
  const edgeId = newEdgeId();
  let first: RunningDsec | undefined;
  let second: RunningDsec | undefined;
  let third: RunningDsec | undefined;
  after(async () => {
    for (const d of [first, second, third]) await d?.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('a restarted edge adopts a running VM; a VM whose QEMU died is cleaned up and reported lost', async () => {
    dataDir = makeDataDir();
    first = await startDsec(dataDir, { edgeId });
    const sb = await Sandbox.create({ url: first.url, apiKey: first.apiKey, backend: 'microvm', resources: { memoryMiB: 128 } });
    await sb.files.write('/kept', 'before restart');
    const pid = (await first.vms!.listSandboxes())[0]!.pid;
    await first.close(); // the VM keeps running
    assert.ok(alive(pid));

    second = await startDsec(dataDir, { edgeId });
    const again = await Sandbox.connect(sb.id, { url: second.url, apiKey: second.apiKey });
    assert.equal((await again.commands.run('cat /kept')).stdout, 'before restart', 'adopted: same guest, same disk');
    await second.close();

    process.kill(pid, 'SIGKILL'); // QEMU crashes while the edge is down
    for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 10));
    third = await startDsec(dataDir, { edgeId });
    const info = await (await Sandbox.connect(sb.id, { url: third.url, apiKey: third.apiKey })).refresh();
    assert.equal(info.status, 'failed');
    assert.match(info.reason ?? '', /lost/);
    assert.equal(existsSync(join(dataDir, 'node', 'vms', sb.id)), false, 'no disk, socket or directory left');
  });
});

function kernelVersion(): string {
  const g = guestAssets();
  assert.ok(!('missing' in g));
  return g.kernelVersion;
}
