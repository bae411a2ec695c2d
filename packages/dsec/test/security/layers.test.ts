/**
 * Red team, shared layers: every sandbox of an image stacks the same read-only EROFS mounts. An
 * agent that overwrites /bin/sh or /bin/busybox must change only its own overlay upper (copy-up);
 * other sandboxes of the image, running or new, keep the original; the layer mount on the host is
 * read-only (EROFS) even to root on the host; and from inside, the root cannot be remounted and
 * the host path of the layer is not reachable.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, openSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { LayerDigest } from '../../src/image/layer-store.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { assertBystanderUnaffected, attack, md5, must, parseStatus, probeInSandbox, show } from './support/harness.js';
import { NR, cstr } from './support/raw-syscall.js';

/** The attacker's /bin/sh (interpreted by its private copy of busybox) and its new /bin/busybox. */
const EVIL_SH = '#!/tmp/busybox sh\necho PWNED-BY-SANDBOX\n';
const EVIL = 'this is not busybox any more\n';

function errnoOf(fn: () => void): string {
  try {
    fn();
  } catch (err) {
    return (err as NodeJS.ErrnoException).code ?? String(err);
  }
  return 'OK';
}

describe('red team: shared read-only layers', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let bystander: Sandbox;
  let layerMount: string;
  let originalBusybox: string;

  before(async () => {
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    assert.equal(bystander.info.layers.length, 1, `busybox is expected to be one layer: ${JSON.stringify(bystander.info.layers)}`);
    layerMount = server.dsec.edge.layerMounts.mountPoint(bystander.info.layers[0]! as LayerDigest);
    originalBusybox = md5(readFileSync(join(layerMount, 'bin/busybox')));
  });
  after(async () => {
    await server?.close();
  });

  test('overwrite /bin/sh and /bin/busybox in one sandbox: only its own upper changes; other sandboxes and the layer keep the original', async () => {
    const attacker = await Sandbox.create({ ...server.conn, labels: { role: 'attacker' } });
    try {
      const mine = await must(server, attacker, 'md5sum /bin/busybox');
      assert.equal(mine.stdout.split(' ')[0], originalBusybox, 'the sandbox does not start from the image');
      // Replace the /bin/sh symlink with a script, then overwrite busybox itself (from a private
      // copy, so the running binary is not the one being written).
      await must(server, attacker, ['/bin/busybox', 'cp', '/bin/busybox', '/tmp/busybox']);
      await must(server, attacker, [
        '/tmp/busybox',
        'sh',
        '-c',
        `rm -f /bin/sh && printf '%s' '${EVIL_SH}' > /bin/sh && chmod 755 /bin/sh`,
      ]);
      const over = await attack(server, attacker, [
        '/tmp/busybox',
        'sh',
        '-c',
        `printf '%s' '${EVIL}' > /bin/busybox && /tmp/busybox md5sum /bin/busybox`,
      ]);
      assert.equal(over.exitCode, 0, `inside its own sandbox the write must succeed (copy-up): ${show(over)}`);
      const evilMd5 = md5(EVIL);
      assert.equal(over.stdout.split(' ')[0], evilMd5);
      const pwned = await attack(server, attacker, ['/tmp/busybox', 'sh', '-c', '/bin/sh -c true']);
      assert.match(pwned.stdout, /PWNED-BY-SANDBOX/, `the attacker's own /bin/sh was not replaced: ${show(pwned)}`);

      // Where the write went: the attacker's upper dir (copy-up), nowhere else.
      const upper = server.dsec.edge.records.paths(attacker.id).upper;
      assert.equal(md5(readFileSync(join(upper, 'bin/busybox'))), evilMd5, 'the overwritten busybox is not in the attacker upper');
      assert.ok(lstatSync(join(upper, 'bin/sh')).isFile(), 'the replaced /bin/sh is not in the attacker upper');

      // The layer on the host: unchanged.
      assert.equal(md5(readFileSync(join(layerMount, 'bin/busybox'))), originalBusybox, 'THE SHARED LAYER CHANGED');
      assert.ok(lstatSync(join(layerMount, 'bin/sh')).isSymbolicLink(), 'the shared layer /bin/sh is no longer a symlink');

      // A running sandbox of the same image (the bystander) and a new one: the original.
      for (const sb of [bystander, await Sandbox.create({ ...server.conn, labels: { role: 'fresh' } })]) {
        const r = await must(server, sb, 'md5sum /bin/busybox; readlink /bin/sh; /bin/sh -c "echo clean"');
        assert.equal(r.stdout.split(' ')[0], originalBusybox, `${sb.info.labels['role']}: busybox changed: ${show(r)}`);
        assert.match(r.stdout, /\/bin\/busybox\nclean\n$/, `${sb.info.labels['role']}: /bin/sh changed: ${show(r)}`);
        if (sb !== bystander) await sb.kill();
      }
    } finally {
      await attacker.kill();
    }
  });

  test('the same overwrite through the files API lands in the sandbox upper only', async () => {
    const attacker = await Sandbox.create({ ...server.conn, labels: { role: 'attacker-files' } });
    try {
      await attacker.files.write('/bin/busybox', EVIL, { mode: 0o755 });
      assert.equal(md5(readFileSync(join(server.dsec.edge.records.paths(attacker.id).upper, 'bin/busybox'))), md5(EVIL));
      assert.equal(md5(readFileSync(join(layerMount, 'bin/busybox'))), originalBusybox, 'THE SHARED LAYER CHANGED');
      const r = await must(server, bystander, 'md5sum /bin/busybox');
      assert.equal(r.stdout.split(' ')[0], originalBusybox);
    } finally {
      await attacker.kill();
    }
  });

  test('write to the shared layer mount from the host (as root): EROFS, content unchanged', () => {
    const line = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .find((l) => l.split(' ')[4] === layerMount);
    assert.ok(line, `${layerMount} is not a mount`);
    const [pre, post] = line.split(' - ');
    assert.equal(post?.split(' ')[0], 'erofs', line);
    assert.match(`,${pre?.split(' ')[5]},`, /,ro,/, `the layer mount is not mounted read-only: ${line}`);
    assert.equal(
      errnoOf(() => writeFileSync(join(layerMount, 'bin/x'), 'x')),
      'EROFS',
      'creating a file in the layer',
    );
    assert.equal(
      errnoOf(() => openSync(join(layerMount, 'bin/busybox'), 'r+')),
      'EROFS',
      'opening the layer busybox for writing',
    );
    assert.equal(
      errnoOf(() => writeFileSync(join(layerMount, 'bin/busybox'), EVIL)),
      'EROFS',
      'truncating the layer busybox',
    );
    assert.equal(existsSync(join(layerMount, 'bin/x')), false);
    assert.equal(md5(readFileSync(join(layerMount, 'bin/busybox'))), originalBusybox);
  });

  test('from inside: remount / read-write or reach the layer host path: EPERM / absent', async () => {
    const attacker = await Sandbox.create({ ...server.conn, labels: { role: 'attacker-remount' } });
    try {
      const r = await attack(server, attacker, 'mount -o remount,rw /');
      assert.notEqual(r.exitCode, 0, `remount succeeded: ${show(r)}`);
      assert.match(r.stderr, /permission denied|Operation not permitted/i, show(r));
      const MS_REMOUNT = 32;
      const out = await probeInSandbox(server, attacker, [{ nr: NR.mount, args: [0, cstr('/'), 0, MS_REMOUNT, 0] }]);
      assert.equal(out.error, 'EPERM', `mount(MS_REMOUNT): ${JSON.stringify(out)}`);
      const bind = await probeInSandbox(server, attacker, [{ nr: NR.mount, args: [cstr('/'), cstr('/tmp'), 0, 4096 /* MS_BIND */, 0] }]);
      assert.equal(bind.error, 'EPERM', `mount(MS_BIND): ${JSON.stringify(bind)}`);
      // The layer's host path is visible in mountinfo (overlay options) but is not a path inside.
      const ls = await attack(server, attacker, `ls ${layerMount}/bin/busybox; ls ${server.dataDir}`);
      assert.notEqual(ls.exitCode, 0, show(ls));
      assert.match(ls.stderr, /No such file or directory/, show(ls));
    } finally {
      await attacker.kill();
    }
  });

  test('snapshot of an upper with planted host-pointing symlinks, a host-disk device node and a FIFO: the layer holds the links and nodes, never host data', async () => {
    const attacker = await Sandbox.create({ ...server.conn, labels: { role: 'attacker-snapshot' } });
    let restored: Sandbox | undefined;
    try {
      const dev = statSync('/').dev;
      const [major, minor] = [(dev >> 8) & 0xfff, (dev & 0xff) | ((dev >> 12) & 0xfff00)];
      const client = `${server.dataDir}/client.json`;
      await must(server, attacker, [
        'sh',
        '-c',
        `ln -s ${client} /leak-client && ln -s /etc/shadow /leak-shadow && mkfifo /leak-fifo && ` +
          `mkdir -p /d && ln -s / /d/hostroot && chmod u+s /bin/busybox`,
      ]);
      // A command can no longer make a block node at all (its Landlock domain refuses it); the
      // node a sandbox from before that defence could have left is planted in its upper from the
      // host, so the snapshot copy still meets one.
      const mk = await attack(server, attacker, `mknod /leak-disk b ${major} ${minor}`);
      assert.match(mk.stderr, /Permission denied/, show(mk));
      execFileSync('mknod', [
        join(server.dataDir, 'node', 'sandboxes', attacker.id, 'upper', 'leak-disk'),
        'b',
        String(major),
        String(minor),
      ]);
      // The host-side copy of the upper (pack_diff) runs as root outside the sandbox's cgroups and
      // namespaces: it must copy these entries as they are, not follow or open them.
      const snap = await attacker.snapshot({ timeoutMs: 300_000 });
      assert.ok(snap.layerAdded, JSON.stringify(snap));
      restored = await Sandbox.create({ ...server.conn, image: snap.imageId, labels: { role: 'restored' } });
      const r = await attack(
        server,
        restored,
        'readlink /leak-client; cat /leak-client; cat /leak-shadow; head -c 512 /leak-disk | od -An -tx1 | head -1; test -p /leak-fifo && echo fifo; ls /d/hostroot/var/tmp',
      );
      assert.ok(!r.stdout.includes(server.apiKey), 'the snapshot captured the host client.json');
      assert.match(r.stdout, new RegExp(`^${client}\n`), show(r));
      assert.match(r.stderr, /leak-client'?: No such file or directory/, show(r));
      assert.match(
        r.stderr,
        // Under DSEC_USERNS the node is nobody's inside (host root made it): EACCES comes first.
        /leak-disk: (Operation not permitted|Permission denied)/,
        `the device node must stay a node, refused by the devices cgroup: ${show(r)}`,
      );
      assert.match(r.stdout, /fifo\n/, show(r));
      // On the host: the layer holds a symlink and a device node (on a nodev mount), and its blob
      // contains neither the API key nor data read from the host disk through the node.
      const digest = snap.layers[snap.layers.length - 1]! as LayerDigest;
      const mp = server.dsec.edge.layerMounts.mountPoint(digest);
      assert.ok(lstatSync(join(mp, 'leak-client')).isSymbolicLink());
      assert.ok(lstatSync(join(mp, 'leak-disk')).isBlockDevice());
      assert.ok(lstatSync(join(mp, 'leak-fifo')).isFIFO());
      const line = readFileSync('/proc/self/mountinfo', 'utf8')
        .split('\n')
        .find((l) => l.split(' ')[4] === mp);
      assert.ok(line && /(^|,)nodev(,|$)/.test(line.split(' ')[5] ?? ''), `the snapshot layer is not mounted nodev: ${line}`);
      assert.ok(/(^|,)nosuid(,|$)/.test(line.split(' ')[5] ?? ''), `the snapshot layer is not mounted nosuid: ${line}`);
      const blobPath = line.split(' - ')[1]?.split(' ')[1] ?? '';
      if (blobPath.startsWith('/') && existsSync(blobPath) && statSync(blobPath).isFile()) {
        const blob = readFileSync(blobPath);
        assert.equal(blob.includes(server.apiKey), false, 'the snapshot blob contains the API key');
        assert.ok(blob.length < 16 << 20, `the snapshot blob is ${blob.length} bytes: did it copy a device's content?`);
      }
      // A setuid busybox in a snapshot grants nothing: no_new_privs and the capability bounding set.
      const st = parseStatus((await must(server, restored, ['/bin/busybox', 'cat', '/proc/self/status'])).stdout);
      assert.equal(st.get('NoNewPrivs'), '1');
    } finally {
      await restored?.kill();
      await attacker.kill();
    }
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander, async () => {
      const r = await must(server, bystander, 'md5sum /bin/busybox');
      assert.equal(r.stdout.split(' ')[0], originalBusybox);
    });
  });
});
