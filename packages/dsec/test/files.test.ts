/** The files API: round trips, parents, modes, and agreement with what commands see. */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, test } from 'node:test';
import { connect, type Socket } from 'node:net';
import { ConflictError, NotFoundError, Sandbox } from '@dsec/sdk';
import { integrationSkipReason, useServerAndSandbox, type TestServer } from './helpers/server.js';
import { call, expectSdkError, expectWireError } from './helpers/wire.js';

describe('files', { skip: integrationSkipReason(), timeout: 120_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;

  useServerAndSandbox({ resources: { memoryMiB: 128 } }, (s, b) => {
    server = s;
    sb = b;
  });

  test('uploads sent slowly hold the output budget from their headers on: one of nine of 64 MiB is refused before its body is read', async () => {
    const url = new URL(server.url);
    /** An upload of 64 MiB that sends its headers and 1 KiB of its body, then stalls; `answer`: its first bytes back. */
    const stalled = (name: string): Promise<{ socket: Socket; answer: Promise<string> }> =>
      new Promise((resolve, reject) => {
        const s = connect(Number(url.port), url.hostname, () => {
          s.write(
            `PUT /v1/sandboxes/${sb.id}/files?path=/tmp/${name} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${server.apiKey}\r\n` +
              `Content-Type: application/octet-stream\r\nContent-Length: ${64 << 20}\r\n\r\n` +
              'x'.repeat(1024),
          );
          resolve({ socket: s, answer: new Promise((r) => s.once('data', (d) => r(d.toString('latin1')))) });
        });
        s.once('error', reject);
      });
    // A project holds half of the 1024 MiB budget: eight uploads of 64 MiB (62 MiB each past the
    // free 2) fit, not nine. Whichever of nine stalled ones the server reads last is refused at
    // its headers, while the other eight wait for their bodies.
    const nine = await Promise.all(Array.from({ length: 9 }, (_, i) => stalled(`slow-${i}`)));
    try {
      // (a guard against a hang, not a timing: without the budget none of them is answered)
      const answer = await Promise.race([
        ...nine.map((n) => n.answer),
        new Promise<string>((r) => setTimeout(() => r('no upload was answered in 30 s'), 30_000).unref()),
      ]);
      assert.match(answer, /^HTTP\/1\.1 503/, answer.slice(0, 300));
      assert.match(answer, /OUTPUT_BUDGET_EXCEEDED/);
      assert.match(answer, /this request's body is 64 MiB/);
    } finally {
      for (const n of nine) n.socket.destroy();
    }
    for (let tries = 0; ; tries++) {
      const r = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/ninth`, {
        body: Buffer.alloc(64 << 20),
        contentType: 'application/octet-stream',
      });
      if (r.status === 200) break;
      assert.ok(tries < 200, `still refused after the slow senders went: ${JSON.stringify(r.json)}`);
      await new Promise((res) => setTimeout(res, 50));
    }
    await sb.commands.run('rm -f /tmp/ninth');
  });

  test('write then read returns the same bytes, every byte value included (NUL, 0xff)', async () => {
    const data = new Uint8Array(512);
    for (let i = 0; i < data.length; i++) data[i] = i % 256;
    const w = await sb.files.write('/tmp/bytes.bin', data);
    assert.deepEqual(w, { path: '/tmp/bytes.bin', bytes: 512 });
    const back = await sb.files.read('/tmp/bytes.bin');
    assert.deepEqual(Buffer.from(back), Buffer.from(data));
  });

  test('a file read answers with application/octet-stream and the raw bytes', async () => {
    await sb.files.write('/tmp/raw', new Uint8Array([0, 255, 10, 13]));
    const res = await fetch(`${server.url}/v1/sandboxes/${sb.id}/files?path=/tmp/raw`, {
      headers: { authorization: `Bearer ${server.apiKey}` },
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /^application\/octet-stream/);
    assert.deepEqual([...new Uint8Array(await res.arrayBuffer())], [0, 255, 10, 13]);
  });

  test('a multi-megabyte random file round trips unchanged', async () => {
    const data = randomBytes(6 * 1024 * 1024);
    await sb.files.write('/tmp/big.bin', data);
    const back = await sb.files.read('/tmp/big.bin');
    assert.equal(back.length, data.length);
    assert.ok(Buffer.from(back).equals(data));
    const sum = await sb.commands.run('wc -c < /tmp/big.bin');
    assert.equal(sum.stdout.trim(), String(data.length));
  });

  test('an empty file can be written and read', async () => {
    const w = await sb.files.write('/tmp/empty', '');
    assert.equal(w.bytes, 0);
    assert.equal((await sb.files.read('/tmp/empty')).length, 0);
  });

  test('text written with write() reads back unchanged with readText()', async () => {
    await sb.files.write('/tmp/utf8.txt', 'héllo wörld ✓\n');
    assert.equal(await sb.files.readText('/tmp/utf8.txt'), 'héllo wörld ✓\n');
  });

  test('missing parent directories are created', async () => {
    await sb.files.write('/work/a/b/c/deep.txt', 'deep');
    const r = await sb.commands.run('test -d /work/a/b/c && cat /work/a/b/c/deep.txt');
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout, 'deep');
  });

  test('the mode option is honoured (0750 → stat says 750)', async () => {
    await sb.files.write('/tmp/script.sh', '#!/bin/sh\necho ran\n', { mode: 0o750 });
    const st = await sb.commands.run(['stat', '-c', '%a', '/tmp/script.sh']);
    assert.equal(st.stdout.trim(), '750');
    const run = await sb.commands.run(['/tmp/script.sh']);
    assert.equal(run.stdout, 'ran\n');
  });

  test('without a mode a new file is 0644', async () => {
    await sb.files.write('/tmp/default-mode', 'x');
    const st = await sb.commands.run(['stat', '-c', '%a', '/tmp/default-mode']);
    assert.equal(st.stdout.trim(), '644');
  });

  test('rewriting an existing file applies the new mode', async () => {
    await sb.files.write('/tmp/remode', 'x', { mode: 0o600 });
    await sb.files.write('/tmp/remode', 'y', { mode: 0o640 });
    const st = await sb.commands.run(['stat', '-c', '%a', '/tmp/remode']);
    assert.equal(st.stdout.trim(), '640');
  });

  test('writing over a longer file truncates it', async () => {
    await sb.files.write('/tmp/trunc', 'a long first version');
    await sb.files.write('/tmp/trunc', 'short');
    assert.equal(await sb.files.readText('/tmp/trunc'), 'short');
  });

  test('a file written by a command is readable through the API', async () => {
    const r = await sb.commands.run("printf 'from exec\\000\\377' > /tmp/from-exec");
    assert.equal(r.exitCode, 0, r.stderr);
    const back = Buffer.from(await sb.files.read('/tmp/from-exec'));
    assert.deepEqual(back, Buffer.concat([Buffer.from('from exec'), Buffer.from([0, 255])]));
  });

  test('a file written through the API is visible to commands', async () => {
    await sb.files.write('/tmp/from-api', 'from api\n');
    const r = await sb.commands.run(['cat', '/tmp/from-api']);
    assert.equal(r.stdout, 'from api\n');
  });

  test('writing over a file of the image layer changes it for the sandbox (copy-up)', async () => {
    await sb.files.write('/etc/hosts', '127.0.0.1 changed\n');
    const r = await sb.commands.run(['cat', '/etc/hosts']);
    assert.equal(r.stdout, '127.0.0.1 changed\n');
    const other = await Sandbox.create({ ...server.conn });
    try {
      const o = await other.commands.run(['cat', '/etc/hosts']);
      assert.ok(!o.stdout.includes('changed'), 'another sandbox of the same image still sees the original');
    } finally {
      await other.kill();
    }
  });

  test('a file of the image layer is readable', async () => {
    const passwd = await sb.files.readText('/etc/passwd');
    assert.match(passwd, /^root:x:0:0:/);
  });

  test('a relative path resolves from the image cwd (/)', async () => {
    await sb.files.write('tmp/relative.txt', 'rel');
    assert.equal(await sb.files.readText('/tmp/relative.txt'), 'rel');
    assert.equal(await sb.files.readText('tmp/relative.txt'), 'rel');
  });

  test('reading a file that does not exist: 404 FILE_NOT_FOUND (NotFoundError)', async () => {
    await expectSdkError(sb.files.read('/tmp/does-not-exist'), NotFoundError, 'FILE_NOT_FOUND');
    expectWireError(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=/tmp/does-not-exist`), 404, 'FILE_NOT_FOUND');
  });

  test('reading a directory: 409 PATH_CONFLICT', async () => {
    await expectSdkError(sb.files.read('/etc'), ConflictError, 'PATH_CONFLICT');
  });

  test('writing to a path that is a directory: 409 PATH_CONFLICT', async () => {
    await expectSdkError(sb.files.write('/tmp', 'x'), ConflictError, 'PATH_CONFLICT');
  });

  test('writing under a regular file (a/b where a is a file): 409 PATH_CONFLICT', async () => {
    await sb.files.write('/tmp/plainfile', 'x');
    await expectSdkError(sb.files.write('/tmp/plainfile/child', 'y'), ConflictError, 'PATH_CONFLICT');
  });

  test('writing the root directory itself: 409 PATH_CONFLICT', async () => {
    await expectSdkError(sb.files.write('/', 'x'), ConflictError, 'PATH_CONFLICT');
  });

  test('reading a path through a regular file (/etc/passwd/x): 409 PATH_CONFLICT', async () => {
    await expectSdkError(sb.files.read('/etc/passwd/x'), ConflictError, 'PATH_CONFLICT');
  });

  test('reading a file over the 64 MiB files API limit: 413 PAYLOAD_TOO_LARGE', async () => {
    const r = await sb.commands.run('head -c 67108865 /dev/zero > /tmp/too-big');
    assert.equal(r.exitCode, 0, r.stderr);
    try {
      const e = expectWireError(await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=/tmp/too-big`), 413, 'PAYLOAD_TOO_LARGE');
      assert.equal(e.details['size'], 67108865);
    } finally {
      await sb.commands.run('rm -f /tmp/too-big');
    }
  });

  test('a file name with spaces and unicode round trips', async () => {
    await sb.files.write('/tmp/dir with space/ünï cödé.txt', 'ok');
    const r = await sb.commands.run(['cat', '/tmp/dir with space/ünï cödé.txt']);
    assert.equal(r.stdout, 'ok');
  });

  test('PUT without Content-Type application/octet-stream: 415 UNSUPPORTED_MEDIA_TYPE', async () => {
    const res = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=/tmp/x`, { body: 'text', contentType: 'text/plain' });
    expectWireError(res, 415, 'UNSUPPORTED_MEDIA_TYPE');
  });
});
