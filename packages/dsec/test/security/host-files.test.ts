/**
 * Red team, files planted for the host (issue 10, High 2): a sandbox is root in its own root, so
 * it can make a setuid-root copy of a program or a device node in its writable layer. The red
 * team then ran the setuid copy from the host, as an unprivileged user, through the sandbox's
 * directory (euid 0), and opened a planted 666 device node. From the host, as uid 65534, through
 * both paths that reach the files (the overlay rootfs and the upper dir): the setuid bit must not
 * take effect (nosuid), the device must not open (nodev), and the node's directories must not
 * even be traversable (0700).
 *
 * The unprivileged user reaches the files through a directory fd root opened for it
 * (/proc/self/fd/N/...), so the mount flags are tested on their own, past the 0700 directories.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { closeSync, constants as fsc, openSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { attack, must, show } from './support/harness.js';

const NOBODY = ['--reuid', '65534', '--regid', '65534', '--clear-groups'];

/** Runs argv as uid/gid 65534 with `dirFd` as its fd 3; returns status and output. */
function asNobody(dirFd: number | undefined, argv: string[]): { status: number | null; out: string } {
  const r = spawnSync('setpriv', [...NOBODY, ...argv], { stdio: ['ignore', 'pipe', 'pipe', dirFd ?? 'ignore'], encoding: 'utf8' });
  return { status: r.status, out: `${r.stdout}${r.stderr}${r.error?.message ?? ''}` };
}

describe('red team: setuid files and device nodes planted for the host', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let sbDir: string;
  /** In a user namespace (the default; DSEC_TEST_USERNS=0 tries the opt-out): the sandbox's root is its range's base, and mknod is refused outright. */
  let rootUid = 0;

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
    sbDir = join(server.dataDir, 'node', 'sandboxes', sb.id);
    rootUid = server.dsec.edge.records.load(sb.id)?.userns?.base ?? 0;
    // The host's own `id` (it prints euid= when it differs from uid) and a 666 null device.
    await sb.files.write('/tmp/sx/id', readFileSync('/usr/bin/id'), { mode: 0o755 });
    await must(server, sb, 'chmod 755 /tmp/sx && chown 0:0 /tmp/sx/id && chmod 4755 /tmp/sx/id && ls -ln /tmp/sx');
    const node = await attack(server, sb, 'mknod -m 666 /tmp/sx/null c 1 3');
    if (rootUid === 0) assert.equal(node.exitCode, 0, `set-up mknod failed: ${show(node)}`);
    else assert.notEqual(node.exitCode, 0, `a user-namespaced sandbox made a device node: ${show(node)}`);
  });
  after(async () => {
    await server?.close();
  });

  test('control: the planted file is setuid root and the node a character device, as the red team left them', () => {
    const st = statSync(join(sbDir, 'upper', 'tmp', 'sx', 'id'));
    assert.equal(st.uid, rootUid);
    assert.equal(st.mode & 0o4000, 0o4000, 'the setuid bit did not stick');
    if (rootUid === 0) assert.ok(statSync(join(sbDir, 'upper', 'tmp', 'sx', 'null')).isCharacterDevice());
    const probe = asNobody(undefined, ['id', '-u']);
    assert.equal(probe.out.trim(), '65534', `setpriv did not drop to 65534: ${probe.out}`);
  });

  for (const via of ['rootfs', 'upper'] as const) {
    test(`as uid 65534 on the host, the setuid copy runs without euid 0 and the device does not open (via ${via})`, () => {
      const fd = openSync(join(sbDir, via, 'tmp', 'sx'), fsc.O_RDONLY | fsc.O_DIRECTORY);
      try {
        const id = asNobody(fd, ['/proc/self/fd/3/id']);
        assert.equal(id.status, 0, id.out);
        assert.match(id.out, /uid=65534/, id.out);
        assert.doesNotMatch(id.out, /euid=0/, `the sandbox's setuid file gave a host user euid 0 (${via}): ${id.out}`);
        if (rootUid !== 0) return; // no device node could be made
        const dev = asNobody(fd, ['sh', '-c', 'echo x > /proc/self/fd/3/null && echo OPENED']);
        assert.doesNotMatch(dev.out, /OPENED/, `a device node planted by the sandbox opened on the host (${via}): ${dev.out}`);
        assert.match(dev.out, /Permission denied/, dev.out);
      } finally {
        closeSync(fd);
      }
    });
  }

  test("the node's directories are 0700: uid 65534 cannot even reach a sandbox's files", () => {
    for (const dir of [join(server.dataDir, 'node'), join(server.dataDir, 'node', 'sandboxes'), sbDir]) {
      // A user-namespaced sandbox's own dir is 0710 with its range's base as group (crun works
      // there as that root); other users still cannot pass.
      const want = dir === sbDir && rootUid !== 0 ? 0o710 : 0o700;
      assert.equal(statSync(dir).mode & 0o777, want, `${dir} is ${(statSync(dir).mode & 0o777).toString(8)}`);
    }
    const r = spawnSync('setpriv', [...NOBODY, 'ls', join(sbDir, 'rootfs', 'tmp', 'sx')], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, r.stdout);
    assert.match(r.stderr, /Permission denied/, r.stderr);
  });

  test('the sandboxes dir and each overlay are mounted nosuid,nodev', () => {
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
    const opts = (mp: string): string[] =>
      mounts
        .map((l) => l.split(' '))
        .find((f) => f[4] === mp)?.[5]
        ?.split(',') ?? [];
    for (const mp of [join(server.dataDir, 'node', 'sandboxes'), join(sbDir, 'rootfs')]) {
      assert.ok(opts(mp).includes('nosuid') && opts(mp).includes('nodev'), `${mp}: ${opts(mp).join(',') || 'not a mount'}`);
    }
  });
});
