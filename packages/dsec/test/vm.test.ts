/**
 * microVM and VM sandboxes for real: QEMU (TCG here) boots Debian's kernel with the dsec guest
 * agent, the image's EROFS layers as virtio-blk disks. One boot per describe, to keep CI short.
 * Why one long file (over 500 lines): every test of a describe runs in its one booted guest (a TCG
 * boot costs tens of seconds here); split by concern, each file would boot its own.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { release } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { DsecError, Sandbox } from '@dsec/sdk';
import { findLeaks } from '../src/host/leak-check.js';
import { VM_MEMORY_OVERHEAD_MIB } from '../src/edge/backends/vm/vm-cgroup.js';
import type { RunningDsec } from '../src/runtime/all-in-one.js';
import { assertCleanAndRemove, makeDataDir, newEdgeId, startDsec, startTestServer, type TestServer } from './helpers/server.js';
import { call, expectWireError } from './helpers/wire.js';
import { vmSkipReason } from './helpers/vm.js';
import { guestAssets } from '../src/edge/backends/vm/guest-assets.js';
import { TermCapture } from './engine/support/term.js';
import { Mirror } from './security/support/net-lab.js';
import { hostVeth } from '../src/net/sandbox-network.js';
import type { Duplex } from 'node:stream';
import { PORT_WINDOW_BYTES } from '../src/edge/backends/vm/vm-port.js';
import { QmpClient } from '../src/edge/backends/vm/qmp-client.js';
import { VmPaths } from '../src/edge/backends/vm/qemu-launch.js';

const skip = vmSkipReason();

/** Whether a process exists and is not a zombie. */
function alive(pid: number): boolean {
  try {
    return !/\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

describe('microvm sandbox: exec, files, processes, pause, network, isolation, kill', { skip, timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let vmDir: string;
  let qemuPid: number;
  /** A peer on a link-local /30 of its own (net-lab.ts): port 8080 gets allowed, 8081 not. */
  let mirror: Mirror;

  before(async () => {
    mirror = await Mirror.start([8080, 8081], 9999);
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, backend: 'microvm', resources: { memoryMiB: 256, cpu: 1, diskMiB: 64 } });
    vmDir = join(server.dataDir, 'node', 'vms', sb.id);
    qemuPid = (await server.dsec.vms!.listSandboxes()).find((s) => s.id === sb.id)!.pid;
  });
  after(async () => {
    await server?.close();
    await mirror?.close();
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

  test("QEMU runs in the sandbox's cgroups: guest RAM plus overhead, CPU quota, QEMU's threads; usage reads them", async () => {
    const cg = readFileSync(`/proc/${qemuPid}/cgroup`, 'utf8');
    for (const c of ['memory', 'pids', 'cpu']) assert.match(cg, new RegExp(`:${c}(,[a-z]+)*:/dsec/${sb.id}$`, 'm'), cg);
    const dir = (c: string): string => `/sys/fs/cgroup/${c}/dsec/${sb.id}`;
    assert.equal(Number(readFileSync(`${dir('memory')}/memory.limit_in_bytes`, 'utf8')), (256 + VM_MEMORY_OVERHEAD_MIB) * 1024 * 1024);
    assert.equal(readFileSync(`${dir('cpu')}/cpu.cfs_quota_us`, 'utf8').trim(), '100000', 'cpu: 1 is one core of CPU time');
    const threads = readFileSync(`${dir('pids')}/pids.current`, 'utf8').trim();
    const usage = (await sb.refresh()).usage;
    assert.ok(usage && usage.memoryBytes > 16 << 20, `usage reads the VM's memory cgroup: ${JSON.stringify(usage)}`);
    assert.ok(Number(threads) >= 2, `QEMU's threads are in the pids cgroup: ${threads}`);
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

  test("tar: a directory down and up again through the guest's tar; a missing path is a 404, a broken archive a 400", async () => {
    const made = await sb.commands.run(
      'mkdir -p /work/tdir/sub && echo alpha > /work/tdir/a && head -c 200000 /dev/urandom > /work/tdir/sub/b && md5sum /work/tdir/sub/b',
    );
    assert.equal(made.exitCode, 0, made.stderr);
    const archive = await sb.files.downloadTar('/work/tdir');
    assert.ok(archive.length > 200_000, `the archive holds both files: ${archive.length} bytes`);
    const up = await sb.files.uploadTar('/work/tcopy', archive);
    assert.equal(up.bytes, archive.length);
    const r = await sb.commands.run('cat /work/tcopy/tdir/a; md5sum /work/tcopy/tdir/sub/b');
    assert.equal(r.stdout.split('\n')[0], 'alpha');
    assert.equal(r.stdout.split('\n')[1]!.split(' ')[0], made.stdout.split(' ')[0], 'the binary file came back byte for byte');
    expectWireError(await call(server.conn, 'GET', `/v1/sandboxes/${sb.id}/files/tar?path=/work/nope`), 404, 'FILE_NOT_FOUND');
    const bad = await call(server.conn, 'PUT', `/v1/sandboxes/${sb.id}/files/tar?path=/work/bad`, {
      body: Buffer.alloc(1024, 7),
      contentType: 'application/x-tar',
    });
    expectWireError(bad, 400, 'INVALID_REQUEST');
    await sb.commands.run('rm -rf /work/tdir /work/tcopy /work/bad');
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

  test('sessions: cd, exports and variables carry over; each command has its own output and exit status; a syntax error does not end it', async () => {
    const s = await sb.sessions.create({ env: { FROM_OPEN: 'o1' } });
    assert.equal(s.info.shell, '/bin/sh', 'busybox has no bash: auto picks sh');
    const r1 = await s.run('mkdir -p /tmp/sess && cd /tmp/sess; export EXPORTED=e1; PLAIN=p1; echo first');
    assert.deepEqual([r1.exitCode, r1.stdout, r1.sessionAlive], [0, 'first\n', true], JSON.stringify(r1));
    const r2 = await s.run(
      'echo "$PWD $EXPORTED $PLAIN $FROM_OPEN"; sh -c \'echo "child sees [$EXPORTED] [$PLAIN]"\'; echo err >&2; (exit 5)',
    );
    assert.equal(r2.stdout, '/tmp/sess e1 p1 o1\nchild sees [e1] []\n', JSON.stringify(r2));
    assert.equal(r2.stderr, 'err\n');
    assert.equal(r2.exitCode, 5);
    const bad = await s.run('if then fi');
    assert.notEqual(bad.exitCode, 0);
    assert.equal(bad.sessionAlive, true, 'a syntax error leaves the session alive');
    assert.equal((await s.run('echo $PWD')).stdout, '/tmp/sess\n');
    const t = await s.run('sleep 100', { timeoutMs: 500 });
    assert.deepEqual([t.timedOut, t.exitCode, t.sessionAlive], [true, 137, true], JSON.stringify(t));
    assert.equal((await s.run('echo still $EXPORTED')).stdout, 'still e1\n');
    const gone = await s.run('exit 3');
    assert.deepEqual([gone.exitCode, gone.sessionAlive], [3, false]);
    expectWireError(
      await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/sessions/${s.id}/exec`, { json: { cmd: 'true' } }),
      409,
      'SESSION_CLOSED',
    );
    expectWireError(
      await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/sessions`, { json: { cwd: '/no/such/dir' } }),
      400,
      'INVALID_REQUEST',
    );
  });

  test("red team: a job left by one session command cannot write into the next command's output, read its memory, or change its exit status", async () => {
    const s = await sb.sessions.create();
    try {
      await sb.commands.run('rm -f /tmp/forge.log /tmp/victim.pid');
      // The job waits for the victim's pid, then writes into its stdout pipe and reads its memory through /proc.
      const job = `(i=0; while [ ! -s /tmp/victim.pid ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; p=$(cat /tmp/victim.pid);
        if echo "5 passed" > /proc/$p/fd/1; then echo "fd: written" >> /tmp/forge.log; else echo "fd: refused" >> /tmp/forge.log; fi
        a=$(head -n 1 /proc/$p/maps 2>/dev/null | cut -d- -f1)
        if [ -n "$a" ] && dd if=/proc/$p/mem bs=1 skip=$((0x$a)) count=1 2>/dev/null | od -An -tx1 | grep -q .; then echo "mem: read" >> /tmp/forge.log; else echo "mem: refused" >> /tmp/forge.log; fi
        echo done >> /tmp/forge.log) >/dev/null 2>&1 & echo started`;
      assert.equal((await s.run(job)).stdout, 'started\n');
      const victim =
        'echo $$ > /tmp/victim.pid; i=0; while ! grep -q done /tmp/forge.log 2>/dev/null && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; echo own; (exit 42)';
      const r = await s.run(victim, { timeoutMs: 60_000 });
      const log = (await sb.commands.run('cat /tmp/forge.log')).stdout;
      assert.match(log, /done/, `the job did not finish its attempts: ${log}`);
      assert.equal(r.exitCode, 42, `${JSON.stringify(r)}; job log: ${log}`);
      assert.equal(r.stdout, 'own\n', `the job wrote into the victim's output: ${JSON.stringify(r.stdout)}; ${log}`);
      assert.match(log, /fd: refused/, log);
      assert.match(log, /mem: refused/, log);
    } finally {
      await s.close();
    }
  });

  test('closing a session ends what its commands left running, also a job that called setsid', async () => {
    const s = await sb.sessions.create();
    await s.run('sleep 991 & setsid sleep 992 & echo ok');
    const before = await sb.commands.run('ps -o args | grep -c "^sleep 99[12]"');
    assert.equal(before.stdout.trim(), '2', 'both jobs run while the session is open');
    await s.close();
    const after = await sb.commands.run('ps -o args | grep -c "^sleep 99[12]" || true');
    assert.equal(after.stdout.trim(), '0', 'the session took its jobs with it');
    assert.equal(
      (await sb.sessions.list()).some((x) => x.id === s.id),
      false,
      'a closed session is not listed',
    );
  });

  test("writablePaths: the guest kernel's Landlock confines a command, its descendants and a session; a missing path is a 400", async () => {
    const r = await sb.commands.run(
      'echo ok > /tmp/ll-ok && cat /tmp/ll-ok; sh -c "echo no > /etc/ll-no"; echo rc=$?; rm /bin/busybox; echo rm=$?',
      { writablePaths: ['/tmp'] },
    );
    assert.match(r.stdout, /^ok\nrc=[1-9]\d*\nrm=[1-9]/, JSON.stringify(r));
    assert.match(r.stderr, /denied/i, r.stderr);
    assert.equal(await sb.files.exists('/etc/ll-no'), false, 'nothing was written outside the writable paths');
    const plain = await sb.commands.run('echo yes > /etc/ll-plain && cat /etc/ll-plain');
    assert.equal(plain.stdout, 'yes\n', 'a command without writablePaths is not confined');
    const s = await sb.sessions.create({ writablePaths: ['/tmp'] });
    const inSession = await s.run('touch /tmp/ll-s && echo made; touch /etc/ll-s; echo rc=$?');
    assert.match(inSession.stdout, /^made\nrc=[1-9]/, JSON.stringify(inSession));
    assert.equal(await sb.files.exists('/etc/ll-s'), false);
    await s.close();
    const missing = expectWireError(
      await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/exec`, { json: { cmd: 'true', writablePaths: ['/no/such'] } }),
      400,
      'INVALID_REQUEST',
    );
    assert.match(missing.message, /\/no\/such does not exist/);
  });

  test("ports: the port route reaches a server on the guest's loopback through the agent (HTTP and a raw stream); a closed port is PORT_NOT_LISTENING", async () => {
    await sb.files.mkdir('/www', { parents: true });
    await sb.files.write('/www/index.html', '<h1>hello from a vm</h1>\n');
    await sb.commands.start(['httpd', '-f', '-p', '127.0.0.1:8080', '-h', '/www']);
    await sb.commands.start(['nc', '-ll', '-p', '7000', '-e', 'cat']);
    // Both: the start answers once the exec frame is sent, and a port nobody listens on yet is PORT_NOT_LISTENING at once.
    await Promise.all([sb.ports.wait(8080), sb.ports.wait(7000)]);
    const page = await sb.ports.fetch(8080, '/index.html');
    assert.equal(page.status, 200);
    assert.equal(await page.text(), '<h1>hello from a vm</h1>\n');
    const conn = await sb.ports.connect(7000);
    const payload = Buffer.concat([Buffer.from('raw tcp\n'), Buffer.alloc(200_000, 7), Buffer.from([0, 255])]);
    const parts: Buffer[] = [];
    const got = (async () => {
      for await (const c of conn) parts.push(Buffer.from(c));
      return Buffer.concat(parts);
    })();
    conn.end(payload);
    assert.deepEqual(await got, payload, 'binary-safe both ways, with half-close');
    await assert.rejects(sb.ports.fetch(8081, '/'), (e: unknown) => e instanceof DsecError && e.code === 'PORT_NOT_LISTENING');
  });

  test('ports: data from the guest is flow-controlled: a fast writer to a reader that does not read leaves at most the window on the edge, and every byte arrives once read', async () => {
    await sb.commands.start(['nc', '-ll', '-p', '7002', '-e', 'yes', 'flow-controlled']);
    let port: Duplex | undefined;
    for (let i = 0; i < 200 && !port; i++) {
      if (i) await new Promise((r) => setTimeout(r, 50));
      port = await server.dsec.vms!.openPort(sb.id, 7002).catch(() => undefined);
    }
    assert.ok(port, 'the guest server listens');
    // Nobody reads: the edge's buffer grows until the window is used up, then stays.
    let last = -1;
    for (let still = 0, i = 0; still < 5 && i < 300; i++) {
      await new Promise((r) => setTimeout(r, 200));
      still = port.readableLength === last && last > 0 ? still + 1 : 0;
      last = port.readableLength;
    }
    const bound = PORT_WINDOW_BYTES + port.readableHighWaterMark;
    assert.ok(last > 0 && last <= bound, `the edge holds ${last} bytes of a guest writing without end; the bound is ${bound}`);
    // Then read 4 MiB: the writer was held, not cut (no byte lost or repeated).
    const line = Buffer.from('flow-controlled\n');
    const want = 4 << 20;
    const got: Buffer[] = [];
    let n = 0;
    for await (const chunk of port) {
      got.push(chunk as Buffer);
      n += (chunk as Buffer).length;
      if (n >= want) break;
    }
    const all = Buffer.concat(got);
    assert.ok(all.length >= want);
    for (let off = 0; off + line.length <= all.length; off += line.length) {
      if (!all.subarray(off, off + line.length).equals(line)) assert.fail(`byte ${off}: the stream is not the guest's output, in order`);
    }
    port.destroy();
  });

  test("ports: bytes to a guest server that reads late are queued in the guest's agent and all delivered (the client is held by the send window, the agent never stalls)", async () => {
    // The server reads nothing for 6 s (the old agent gave up on a full socket after 5 s and dropped the rest).
    await sb.commands.start(['nc', '-l', '-p', '7003', '-e', 'sh', '-c', 'sleep 6; wc -c']);
    let conn: Duplex | undefined;
    for (let i = 0; i < 200 && !conn; i++) {
      if (i) await new Promise((r) => setTimeout(r, 50));
      conn = await server.dsec.vms!.openPort(sb.id, 7003).catch(() => undefined);
    }
    assert.ok(conn, 'the guest server listens');
    const answer: Buffer[] = [];
    const got = (async () => {
      for await (const c of conn) answer.push(c as Buffer);
      return Buffer.concat(answer).toString().trim();
    })();
    conn.end(Buffer.alloc(4 << 20, 1));
    // Meanwhile the agent serves other calls at once.
    assert.equal((await sb.commands.run('echo busy-agent-answers')).stdout, 'busy-agent-answers\n');
    assert.equal(await got, String(4 << 20), 'every byte reached the guest server, then its eof');
  });

  test('stdin to a background process that reads late is queued in the guest and all delivered, eof after it (the agent never stalls)', async () => {
    const p = await sb.commands.start(['sh', '-c', 'sleep 6; wc -c'], { stdin: true });
    const data = Buffer.alloc(1 << 20, 2); // the pipe takes 64 KiB; the old agent gave up after 5 s and dropped the rest
    await p.writeStdin(data, { eof: true });
    assert.equal((await sb.commands.run('echo agent-free')).stdout, 'agent-free\n');
    const done = await p.wait();
    assert.equal(done.exitCode, 0);
    assert.equal((await p.output()).stdout.trim(), String(1 << 20));
  });

  test('a streamed command whose reader stops is held in the guest (flow control): the edge takes at most its window, the rest comes once read', async () => {
    const it = server.dsec.vms!.execStream(sb.id, {
      // The count is replaced by rename, so a reader never sees it half-written.
      cmd: [
        'sh',
        '-c',
        'i=0; while :; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > /tmp/chunks.new; mv /tmp/chunks.new /tmp/chunks; done',
      ],
      uncapped: true,
      timeoutMs: 300_000,
    });
    assert.equal((await it.next()).value?.type, 'stdout');
    // Nobody reads on: the guest's writer must stop once the window and the edge's queue are full.
    const chunks = async (): Promise<number> => Number((await sb.commands.run('cat /tmp/chunks 2>/dev/null || echo 0')).stdout.trim()) || 0;
    let last = -1;
    for (let still = 0, i = 0; still < 4 && i < 200; i++) {
      await new Promise((r) => setTimeout(r, 300));
      const n = await chunks();
      still = n === last ? still + 1 : 0;
      last = n;
    }
    // The window (1 MiB) + the edge's queue of 17 chunks + a pipe: ~35 chunks of 64 KiB.
    assert.ok(last > 0 && last <= 48, `the guest wrote ${last} chunks of 64 KiB to a reader that stopped`);
    let got = 0;
    for (let r = await it.next(); !r.done && got < 4 << 20; r = await it.next()) if (r.value.type === 'stdout') got += r.value.data.length;
    assert.ok(got >= 4 << 20, `the stream gave ${got} bytes`);
    const after = await chunks();
    assert.ok(after > last, `reading again lets the guest write on (${last} chunks, then ${after})`);
    await it.return(undefined); // leaving the stream kills the command
  });

  test("snapshot as an image: the guest's changes (new, changed, deleted files, a replaced directory, links, long names) become a layer that a container and a microVM start from; a cancel or a kill stops it", async () => {
    const long = 'l'.repeat(150);
    const change = await sb.commands.run(
      [
        'set -e',
        'mkdir -p /snap/sub /root/.cache',
        'echo new > /snap/sub/file',
        'ln /snap/sub/file /snap/hard',
        'ln -s sub/file /snap/link',
        'chmod 0750 /snap/sub',
        `echo deep > /snap/${long}`,
        'echo "snap:x:1000:1000::/home/snap:/bin/sh" >> /etc/passwd',
        'rm /etc/hosts',
        'rm -rf /usr/sbin && mkdir /usr/sbin && echo only > /usr/sbin/only',
        'echo scrubbed > /root/.cache/x',
      ].join('\n'),
    );
    assert.equal(change.exitCode, 0, change.stderr);
    await sb.files.write('/snap/api.bin', Buffer.from([0, 1, 2, 255]));
    const probe = [
      'cat /snap/sub/file /snap/hard',
      'readlink /snap/link',
      'stat -c %a /snap/sub',
      '[ /snap/hard -ef /snap/sub/file ] && echo one-inode',
      `cat /snap/${long}`,
      'grep -c "^snap:" /etc/passwd',
      '[ -e /etc/hosts ] && echo hosts-present || echo hosts-gone',
      'ls /usr/sbin | tr "\\n" " "; echo',
      '[ -e /root/.cache/x ] && echo cache-kept || echo cache-scrubbed',
      'od -An -tu1 /snap/api.bin | tr -s " "',
    ].join('; ');
    const expected = 'new\nnew\nsub/file\n750\none-inode\ndeep\n1\nhosts-gone\nonly \ncache-scrubbed\n 0 1 2 255\n';
    assert.equal((await sb.commands.run(probe)).stdout.replace('cache-kept', 'cache-scrubbed'), expected, 'the VM itself shows the change');

    const snap = await sb.snapshot();
    assert.equal(snap.layerAdded, true);
    assert.equal(snap.layers.length, sb.info.layers.length + 1);
    assert.ok(snap.whiteouts >= 1 && snap.opaqueDirs >= 1, JSON.stringify(snap));
    // The VM runs on, its disk thawed: files and commands write again.
    await sb.files.write('/snap/after', 'x');
    assert.equal((await sb.commands.run('echo y >> /snap/after && cat /snap/after')).stdout, 'xy\n');

    const container = await Sandbox.create({ ...server.conn, image: snap.imageId });
    const vm = await Sandbox.create({
      ...server.conn,
      image: snap.imageId,
      backend: 'microvm',
      resources: { memoryMiB: 256, cpu: 1, diskMiB: 64 },
    });
    try {
      for (const child of [container, vm]) {
        const r = await child.commands.run(probe, { timeoutMs: 60_000 });
        assert.equal(r.stdout, expected, `${child.info.backend ?? 'container'} ${child.id}: ${r.stderr}`);
        assert.equal(await child.files.exists('/snap/after'), false, 'a change after the snapshot is not in it');
      }
      // A guest that only deleted a file has a layer: a whiteout is a change.
      await vm.commands.run('rm /snap/hard');
      const deleted = await vm.snapshot();
      assert.equal(deleted.layerAdded, true);
      assert.equal(deleted.whiteouts, 1);
      // Cancelled by its caller (before the guest even answered): the guest's reader is killed,
      // its disk thaws, nothing is kept.
      const vms = server.dsec.vms!;
      const caller = new AbortController();
      const cancelled = vms.snapshotSandbox(vm.id, { signal: caller.signal });
      caller.abort(new Error('the caller went away'));
      await assert.rejects(cancelled, /the caller went away/);
      await vm.files.write('/after-cancel', 'writable');
      assert.equal((await vm.commands.run('echo w > /w && cat /after-cancel /w')).stdout, 'writablew\n');
      // Stopped by a kill of the VM.
      const killed = assert.rejects(vms.snapshotSandbox(vm.id), (err: Error) => /killed during its snapshot/.test(err.message));
      await vms.killSandbox(vm.id);
      await killed;
      assert.deepEqual(
        readdirSync(join(server.dataDir, 'node', 'tmp')).filter((n) => n.startsWith('vm-snap-')),
        [],
        'no staging tree is left',
      );
    } finally {
      await container.kill();
      await vm.kill();
    }
    // A paused VM's agent cannot read its disk: 409, and the VM is as it was.
    await sb.pause();
    expectWireError(await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/snapshot`, { json: {} }), 409, 'SANDBOX_NOT_RUNNING');
    await sb.resume();
    assert.equal((await sb.commands.run('cat /snap/sub/file')).stdout, 'new\n');
  });

  test('calls a VM does not serve answer BACKEND_UNSUPPORTED, and nothing half-happens', async () => {
    const e = expectWireError(
      await call(server.conn, 'POST', '/v1/sandboxes', {
        json: { image: 'busybox', backend: 'microvm', network: { mode: 'allow', allow: ['no such host!'] } },
      }),
      400,
      'INVALID_REQUEST',
    );
    assert.match(e.message, /allow/i);
    expectWireError(
      await call(server.conn, 'POST', '/v1/sandboxes', { json: { image: 'busybox', backend: 'firecracker' } }),
      400,
      'INVALID_REQUEST',
    );
    assert.equal((await server.dsec.vms!.listSandboxes()).length, 1, 'a refused create leaves no VM');
  });

  /** nc from the guest to the mirror: the body when it connected, else nc's complaint. */
  async function fetchMirror(port: number): Promise<{ ok: boolean; text: string }> {
    const r = await sb.commands.run(`printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 ${mirror.address} ${port}; echo rc=$?`, {
      timeoutMs: 60_000,
    });
    return { ok: r.stdout.includes(mirror.body), text: `${r.stdout} ${r.stderr}`.trim() };
  }

  test('network none (the default): the guest has its NIC but reaches nothing; QEMU runs in a netns of its own', async () => {
    assert.equal((await sb.network()).mode, 'none');
    const r = await sb.commands.run('ls /sys/class/net | tr "\\n" " "; echo; ip -4 -o addr show dev eth0');
    assert.equal(r.stdout.split('\n')[0]!.trim(), 'eth0 lo', r.stdout);
    assert.match(r.stdout, /inet 169\.254\.0\.2\/30/, 'the guest addressed eth0 from its command line');
    const none = await fetchMirror(8080);
    assert.equal(none.ok, false, `policy none reached the mirror: ${none.text}`);
    assert.match(none.text, /rc=1/);
    assert.notEqual(readlinkSync(`/proc/${qemuPid}/ns/net`), readlinkSync('/proc/self/ns/net'), "QEMU is in the host's netns");
    assert.equal(existsSync(`/sys/class/net/${hostVeth(sb.id)}`), false, 'no link to the host under none');
  });

  test('allow list: the allowed peer port is reachable, a denied port refused; switched at runtime, back to none', async () => {
    const set = await sb.setNetwork({ mode: 'allow', allow: [`${mirror.address}:8080`] });
    assert.equal(set.mode, 'allow');
    assert.ok(set.gateway, 'the first policy other than none gives the VM a link');
    assert.ok(existsSync(`/sys/class/net/${hostVeth(sb.id)}`), "the link's host end exists");
    const allowed = await fetchMirror(8080);
    assert.ok(allowed.ok, `the allowed peer was not reachable: ${allowed.text}`);
    const denied = await fetchMirror(8081);
    assert.equal(denied.ok, false, `a port the policy does not allow was reachable: ${denied.text}`);
    assert.match(denied.text, /refused/i, 'refused at once (tcp reset), as for a container');
    const gateway = await sb.commands.run(`nc -w 3 ${set.gateway} ${new URL(server.url).port} </dev/null; echo rc=$?`, {
      timeoutMs: 60_000,
    });
    assert.match(gateway.stdout, /rc=1/, `the link's host end is never reachable: ${gateway.stdout}`);
    assert.deepEqual((await sb.network()).allow, set.allow);
    await sb.setNetwork({ mode: 'none' });
    const after = await fetchMirror(8080);
    assert.equal(after.ok, false, `back under none the peer was reachable: ${after.text}`);
  });

  test('red team: the guest reaches neither the edge nor its own netns; its kernel cannot loosen the rules', async () => {
    const port = new URL(server.url).port;
    // Root in the guest changes its own routes and address: the rules live outside the VM.
    const r = await sb.commands.run(
      `echo | nc 127.0.0.1 ${port}; echo rc=$?; ip addr add 169.254.0.3/30 dev eth0; nc -w 2 -s 169.254.0.3 ${mirror.address} 8080 </dev/null; echo rc=$?; nc -w 2 169.254.0.1 22 </dev/null; echo rc=$?`,
      { timeoutMs: 60_000 },
    );
    const rcs = r.stdout.match(/rc=\d+/g) ?? [];
    assert.deepEqual(rcs, ['rc=1', 'rc=1', 'rc=1'], `${r.stdout} ${r.stderr}`);
    assert.match(r.stderr, /refused/, "the control plane's port on the guest's loopback is the guest's own, where nothing listens");
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

  test('fork: the VM state is saved (migration to a file) and restored twice; files, tmpfs and a running process go on in each fork', async () => {
    await sb.files.write('/work/on-disk', 'disk state');
    const bg = await sb.commands.start([
      'sh',
      '-c',
      'echo ram-only > /dev/shm/in-memory; echo $$ > /dev/shm/bg.pid; n=0; while :; do n=$((n+1)); echo $n > /dev/shm/count; sleep 0.2; done',
    ]);
    assert.equal(
      (await sb.commands.run('for i in $(seq 100); do [ -s /dev/shm/count ] && break; sleep 0.1; done; cat /dev/shm/count')).exitCode,
      0,
    );
    const { sandboxes, result } = await sb.fork(2);
    assert.deepEqual(result.failures, []);
    assert.equal(sandboxes.length, 2);
    assert.equal(result.snapshot.imageId, sb.info.imageId, "a VM fork's snapshot names the parent's image (the state is no image)");
    const probe =
      'cat /work/on-disk; echo; cat /dev/shm/in-memory; kill -0 $(cat /dev/shm/bg.pid) && echo alive; a=$(cat /dev/shm/count); sleep 1; b=$(cat /dev/shm/count); [ "$b" -gt "$a" ] && echo counting';
    for (const child of sandboxes) {
      assert.equal(child.info.backend, 'microvm');
      assert.equal(child.info.labels['dsec.fork-of'], sb.id);
      const r = await child.commands.run(probe, { timeoutMs: 60_000 });
      assert.equal(r.stdout, 'disk state\nram-only\nalive\ncounting\n', `fork ${child.id}: ${r.stdout} ${r.stderr}`);
    }
    // Each fork has its own disk and memory: a change in one is seen by no other.
    await sandboxes[0]!.files.write('/work/child-only', 'x');
    await sandboxes[0]!.commands.run('echo changed > /dev/shm/in-memory');
    assert.equal(await sandboxes[1]!.files.exists('/work/child-only'), false);
    assert.equal((await sandboxes[1]!.commands.run('cat /dev/shm/in-memory')).stdout, 'ram-only\n');
    assert.equal(await sb.files.exists('/work/child-only'), false);
    // The parent ran on after the snapshot, its own process included.
    const parent = await sb.commands.run(probe, { timeoutMs: 60_000 });
    assert.equal(parent.stdout, 'disk state\nram-only\nalive\ncounting\n', parent.stderr);
    await bg.signal('SIGKILL');
    for (const child of sandboxes) await child.kill();
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: sandboxes.map((c) => c.id) }), []);
  });

  test('a restore from a VM with no snapshot, or into a container, is a 400 and makes nothing', async () => {
    const edge = server.dsec.node; // the node's EdgeApi, as the control plane calls it
    const base = {
      layers: sb.info.layers,
      config: { env: [], cwd: '/', user: '', labels: {}, entrypoint: [], cmd: [] },
      env: {},
      limits: { cpu: 1, memoryMiB: 256, pids: 64 },
    };
    await assert.rejects(
      edge.createSandbox({ ...base, id: `${sb.id}x1`, backend: 'microvm', restoreFrom: 'nosuchvm' }),
      /no VM snapshot of sandbox nosuchvm/,
    );
    await assert.rejects(
      edge.createSandbox({ ...base, id: `${sb.id}x2`, backend: 'container', restoreFrom: sb.id }),
      /restoreFrom restores a VM snapshot/,
    );
    assert.equal((await server.dsec.vms!.listSandboxes()).length, 1);
  });

  test('kill: no QEMU, disk, socket or directory is left', async () => {
    assert.ok(alive(qemuPid));
    const before = await findLeaks(server.dataDir, { onlyIds: [sb.id] });
    assert.ok(
      before.some((l) => l.startsWith('QEMU process')) && before.some((l) => l.startsWith('VM directory')),
      `the leak check sees a live VM: ${before}`,
    );
    await sb.kill();
    assert.deepEqual(await findLeaks(server.dataDir, { onlyIds: [sb.id] }), []);
    assert.equal(alive(qemuPid), false, 'QEMU exited');
    assert.equal(existsSync(vmDir), false, 'the VM directory (disk, sockets, logs) is gone');
    assert.equal(existsSync(`/sys/class/net/${hostVeth(sb.id)}`), false, "the VM's link went with its netns");
    assert.equal(existsSync(`/sys/fs/cgroup/memory/dsec/${sb.id}`), false, "the VM's cgroups are removed");
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
    assert.ok(cmd[cmd.indexOf('-M') + 1]!.startsWith('q35'), cmd.join(' '));
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
    const res = await call(server.conn, 'POST', '/v1/sandboxes', {
      json: { image: 'busybox', backend: 'microvm', resources: { memoryMiB: 16 } },
      timeoutMs: 240_000,
    });
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
    // With a link (no traffic is sent): the restarted edge must claim it again and keep its host guard.
    const sb = await Sandbox.create({
      url: first.url,
      apiKey: first.apiKey,
      backend: 'microvm',
      resources: { memoryMiB: 128 },
      network: { mode: 'allow', allow: ['169.254.252.1:9'] },
    });
    await sb.files.write('/kept', 'before restart');
    const session = await sb.sessions.create();
    assert.equal((await session.run('sleep 4242 & echo started')).stdout, 'started\n');
    const pid = (await first.vms!.listSandboxes())[0]!.pid;
    await first.close(); // the VM keeps running
    assert.ok(alive(pid));
    // As an edge that died inside a fork's state save leaves it (vm-snapshot.ts): its vCPUs stopped
    // over QMP, its record untouched. Not a pause of its user's, so it must run on. (After the
    // close: QEMU serves one QMP client at a time, and the edge held the VM's until then.)
    const qmp = await QmpClient.open(new VmPaths(join(dataDir, 'node', 'vms', sb.id)).qmpSocket);
    await qmp.execute('stop');
    qmp.close();

    second = await startDsec(dataDir, { edgeId });
    const again = await Sandbox.connect(sb.id, { url: second.url, apiKey: second.apiKey });
    assert.equal((await again.refresh()).status, 'running', 'adopted running: its vCPUs were stopped by the edge, not by a pause');
    assert.equal((await again.commands.run('cat /kept')).stdout, 'before restart', 'adopted: same guest, same disk');
    // The session's state lived in the edge that ended: reported ended, its job killed in the guest.
    const ended = (await again.sessions.list()).find((x) => x.id === session.id);
    assert.ok(ended && ended.info.alive === false && /edge restarted/.test(ended.info.endReason ?? ''), JSON.stringify(ended?.info));
    expectWireError(
      await call({ url: second.url, apiKey: second.apiKey }, 'POST', `/v1/sandboxes/${sb.id}/sessions/${session.id}/exec`, {
        json: { cmd: 'true' },
      }),
      409,
      'SESSION_CLOSED',
    );
    assert.equal(
      (await again.commands.run('ps -o args | grep -c "^sleep 4242" || true')).stdout.trim(),
      '0',
      "the session's job went with it",
    );
    const net = await again.network();
    assert.equal(net.mode, 'allow');
    assert.ok(net.gateway, 'the adopted VM keeps its link');
    assert.ok(existsSync(`/sys/class/net/${hostVeth(sb.id)}`));
    assert.match(
      execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' }),
      new RegExp(`dsec_host_${edgeId}\\b`),
      'the host guard stays while an adopted VM has a link',
    );
    await again.setNetwork({ mode: 'none' }); // a switch after adoption goes to the VM's netns
    await second.close();

    process.kill(pid, 'SIGKILL'); // QEMU crashes while the edge is down
    for (let i = 0; i < 200 && alive(pid); i++) await new Promise((r) => setTimeout(r, 10));
    third = await startDsec(dataDir, { edgeId });
    const info = await (await Sandbox.connect(sb.id, { url: third.url, apiKey: third.apiKey })).refresh();
    assert.equal(info.status, 'failed');
    assert.match(info.reason ?? '', /lost/);
    assert.equal(existsSync(join(dataDir, 'node', 'vms', sb.id)), false, 'no disk, socket or directory left');
    assert.equal(existsSync(`/sys/class/net/${hostVeth(sb.id)}`), false, 'the link went with the netns');
  });
});

function kernelVersion(): string {
  const g = guestAssets();
  assert.ok(!('missing' in g));
  return g.kernelVersion;
}
