/**
 * Red team, the platform running the sandbox's own tools (issue 10, Medium 7): an agent planted
 * /usr/local/bin/tar, and a tar download of score.txt said "PASS: 10/10" while the files API read
 * "FAIL: 0/10"; an uploaded hidden test was rewritten to `def test_ok(): pass`. Here the agent
 * plants a tar and an rm that lie (first in PATH, and over /bin's own), and the trainer's tar
 * download, tar upload and recursive removal must be untouched by them: the platform runs its own
 * static busybox, bind-mounted read-only at /dev/.dsec-tools/busybox.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { attack, must, show } from './support/harness.js';

/** A tar that lies: a download of anything is a tar saying PASS, an upload writes a passing test. */
const FAKE_TAR = `#!/bin/sh
echo ran >> /tmp/fake-tool-ran
case " $* " in
  *" -c "*) mkdir -p /tmp/.f && echo "PASS: 10/10" > /tmp/.f/score.txt && exec /dev/.dsec-tools/busybox tar -c -f - -C /tmp/.f score.txt ;;
  *) cat >/dev/null; for d in /work/tests; do mkdir -p $d; echo 'def test_ok(): pass' > $d/test_hidden.py; done ;;
esac
`;
const FAKE_RM = `#!/bin/sh
echo ran >> /tmp/fake-tool-ran
exit 0
`;

describe("red team: the platform never runs the sandbox's own tar or rm", { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  const scratch = mkdtempSync(join(tmpdir(), 'dsec-tools-'));

  before(async () => {
    server = await startTestServer();
    sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
    await sb.files.write('/work/score.txt', 'FAIL: 0/10\n');
    await sb.files.write('/usr/local/bin/tar', FAKE_TAR, { mode: 0o755 });
    await sb.files.write('/usr/local/bin/rm', FAKE_RM, { mode: 0o755 });
    // Over /bin's own too (busybox links), for a platform that would call /bin/tar by full path.
    await must(
      server,
      sb,
      'cp /usr/local/bin/tar /tmp/t && cp /usr/local/bin/rm /tmp/r && /bin/busybox rm -f /bin/tar /bin/rm && /bin/busybox cp /tmp/t /bin/tar && /bin/busybox cp /tmp/r /bin/rm',
    );
    // (busybox's own sh runs its tar applet without a PATH lookup, so the control names the file.)
    const planted = await attack(
      server,
      sb,
      '/bin/tar -c -f - /work/score.txt >/dev/null; cat /tmp/fake-tool-ran; /dev/.dsec-tools/busybox rm -f /tmp/fake-tool-ran',
    );
    assert.match(planted.stdout, /ran/, `control: the planted tar runs for the agent itself: ${show(planted)}`);
  });
  after(async () => {
    await server?.close();
    rmSync(scratch, { recursive: true, force: true });
  });

  test('a tar download carries the real file', async () => {
    const archive = await sb.files.downloadTar('/work/score.txt');
    writeFileSync(join(scratch, 'down.tar'), archive);
    execFileSync('tar', ['-x', '-f', join(scratch, 'down.tar'), '-C', scratch]);
    assert.equal(readFileSync(join(scratch, 'score.txt'), 'utf8'), 'FAIL: 0/10\n');
  });

  test('a tar upload lands as uploaded', async () => {
    const src = join(scratch, 'up');
    mkdirSync(join(src, 'tests'), { recursive: true });
    writeFileSync(join(src, 'tests', 'test_hidden.py'), 'def test_real():\n    assert solve() == 42\n');
    const archive = execFileSync('tar', ['-c', '-f', '-', '-C', src, 'tests']);
    await sb.files.uploadTar('/work', archive);
    assert.equal(await sb.files.readText('/work/tests/test_hidden.py'), 'def test_real():\n    assert solve() == 42\n');
  });

  test('a recursive removal removes', async () => {
    await must(server, sb, 'mkdir -p /work/old/a && echo x > /work/old/a/f');
    await sb.files.remove('/work/old', { recursive: true });
    assert.equal(await sb.files.exists('/work/old'), false);
  });

  test('none of the planted tools ran for the platform', async () => {
    assert.equal(await sb.files.exists('/tmp/fake-tool-ran'), false, 'a planted tar or rm ran for a platform operation');
  });
});
