/**
 * Everything that needs a Debian image, in one file (debootstrap takes about 80 s per data dir):
 * a Dockerfile build of a small Python project whose sandbox runs it, the rebuild fully cached,
 * and user.* xattrs surviving a snapshot (python3 can set them; busybox cannot).
 */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { buildDebianImage } from '../../src/image/builders/debian.js';
import { buildDockerfile } from '../../src/image/dockerfile/builder.js';
import { controlPlaneSandboxes } from '../../src/control/build-sandboxes.js';
import { which } from '../../src/host/doctor.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const DOCKERFILE = `FROM py
WORKDIR /app
COPY app.py .
ENV GREETING=hi
RUN python3 -c "print('built')" > /app/built.txt
CMD ["python3","app.py"]
`;

const APP = `import os, sys
print(f"{os.environ['GREETING']} from {os.getcwd()} as uid {os.getuid()}; python {sys.version_info.major}")
print(open('/app/built.txt').read().strip())
`;

function skipReason(): string | undefined {
  return integrationSkipReason() ?? (which('debootstrap') ? undefined : 'debootstrap is not installed');
}

describe('Debian-based images', { skip: skipReason(), timeout: 900_000 }, () => {
  let server: TestServer;
  let ctx: string;
  /** Why the Debian image could not be built (no mirror reachable…): the tests skip with it. */
  let noDebian: string | undefined;

  before(async () => {
    server = await startTestServer();
    ctx = mkdtempSync('/var/tmp/dsec-py-ctx-');
    writeFileSync(join(ctx, 'app.py'), APP);
    writeFileSync(join(ctx, 'Dockerfile'), DOCKERFILE);
    try {
      await buildDebianImage(server.dsec.images, { packages: ['python3'], name: 'py' });
    } catch (err) {
      noDebian = `debootstrap could not build the python3 image (is the Debian mirror reachable?): ${(err as Error).message.split('\n')[0]}`;
      process.stderr.write(`# skipping Debian tests: ${noDebian}\n`);
    }
  });
  after(async () => {
    if (ctx) rmSync(ctx, { recursive: true, force: true });
    await server?.close();
  });

  test('a Dockerfile build of a Python project gives an image whose sandbox runs it; a rebuild is all CACHED', async (t) => {
    if (noDebian) return t.skip(noDebian);
    const lines: string[] = [];
    const opts = {
      images: server.dsec.images,
      sandboxes: controlPlaneSandboxes(server.dsec.control),
      dockerfile: DOCKERFILE,
      contextDir: ctx,
      name: 'pyapp',
      progress: (l: string) => lines.push(l),
    };
    const r = await buildDockerfile(opts);
    assert.equal(r.executed, 2, lines.join('\n'));
    assert.equal(r.config.cwd, '/app');
    assert.deepEqual(r.config.cmd, ['python3', 'app.py']);
    assert.ok(r.config.env.includes('GREETING=hi'));
    const sb = await Sandbox.create({ ...server.conn, image: 'pyapp' });
    try {
      const run = await sb.commands.run(r.config.cmd);
      assert.equal(run.exitCode, 0, run.stderr);
      assert.equal(run.stdout, 'hi from /app as uid 0; python 3\nbuilt\n');
    } finally {
      await sb.kill();
    }
    lines.length = 0;
    const again = await buildDockerfile(opts);
    assert.equal(again.id, r.id);
    assert.equal(again.cached, 2);
    assert.equal(again.executed, 0);
    assert.equal(lines.filter((l) => l.startsWith(' ---> CACHED')).length, 2, lines.join('\n'));
  });

  test('user.* xattrs survive a snapshot and restore', async (t) => {
    if (noDebian) return t.skip(noDebian);
    const sb = await Sandbox.create({ ...server.conn, image: 'py' });
    let restored: Sandbox | undefined;
    try {
      const set = await sb.commands.run([
        'python3',
        '-c',
        "import os; open('/root/x','w').write('x'); os.mkdir('/root/d'); os.setxattr('/root/x','user.k',b'v1'); os.setxattr('/root/d','user.dir',b'\\x00\\xffbin')",
      ]);
      assert.equal(set.exitCode, 0, set.stderr);
      const snap = await sb.snapshot();
      restored = await Sandbox.create({ ...server.conn, image: snap.imageId });
      const get = await restored.commands.run([
        'python3',
        '-c',
        "import os; print(os.getxattr('/root/x','user.k'), os.getxattr('/root/d','user.dir'), sorted(os.listxattr('/root/x')))",
      ]);
      assert.equal(get.exitCode, 0, get.stderr);
      assert.equal(get.stdout, "b'v1' b'\\x00\\xffbin' ['user.k']\n");
    } finally {
      await sb.kill();
      await restored?.kill();
    }
  });
});
