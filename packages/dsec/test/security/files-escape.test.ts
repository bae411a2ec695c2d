/**
 * Red team, files API escapes: the files API runs in the server, as root, on the host. An agent
 * (or a caller it influences) tries `..` chains, absolute host paths, symlinks it planted inside
 * that point at a host directory (read, write, mkdir, rename, remove through them), and tar
 * uploads whose entries are a symlink to a host directory followed by a file "inside" it, `..`
 * names, absolute names and hard links to host files. Defence: every path resolves inside the
 * sandbox root (openat2 RESOLVE_IN_ROOT on the host; tar runs inside the sandbox). The host marker
 * directory and its secret must stay exactly as they were; what was written lands in the sandbox.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { tarArchive } from '../../src/image/oci/tar-writer.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call } from '../helpers/wire.js';
import { assertBystanderUnaffected, attack, must, show, token } from './support/harness.js';

describe('red team: files API escapes', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let bystander: Sandbox;
  let sb: Sandbox;
  const secret = token('host-secret');
  /** A host directory the attacks aim at, with one secret file. */
  const markerDir = `/var/tmp/dsec-redteam-marker-${token('d').slice(2)}`;
  const markerFile = join(markerDir, 'secret');
  let scratch: string;

  /** The host marker is exactly as created: one file, same content. */
  function assertMarkerUntouched(context: string): void {
    assert.deepEqual(readdirSync(markerDir), ['secret'], `${context}: something was created in the host marker dir ${markerDir}`);
    assert.equal(readFileSync(markerFile, 'utf8'), secret, `${context}: the host secret file was changed`);
  }

  /** A read through the files API that must not return the host secret: 404 (resolved inside) or 400. */
  async function readRefused(path: string, expect: number[] = [404]): Promise<void> {
    for (const route of ['files', 'files/tar']) {
      const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/${route}?path=${encodeURIComponent(path)}`, { timeoutMs: 30_000 });
      assert.ok(!res.text.includes(secret), `GET ${route}?path=${path} returned the HOST secret`);
      // tar packs a symlink as a symlink entry (its target string, not the host file): 200 is fine there.
      const ok = expect.includes(res.status) || (route === 'files/tar' && res.status === 200);
      assert.ok(ok, `GET ${route}?path=${path}: expected ${expect.join('/')}, got ${res.status} ${res.text.slice(0, 300)}`);
    }
  }

  before(async () => {
    mkdirSync(markerDir, { mode: 0o700 });
    writeFileSync(markerFile, secret, { mode: 0o600 });
    scratch = mkdtempSync(join(tmpdir(), 'dsec-redteam-tar-'));
    server = await startTestServer();
    bystander = await Sandbox.create({ ...server.conn, labels: { role: 'bystander' } });
    sb = await Sandbox.create({ ...server.conn, labels: { role: 'attacker' } });
    await must(server, sb, 'mkdir -p /w');
  });
  after(async () => {
    await server?.close();
    rmSync(markerDir, { recursive: true, force: true });
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  test('.. chains (../../../../etc/shadow, ../../..<host marker>): resolved inside the sandbox root', async () => {
    await readRefused(`../../../../../../..${markerFile}`);
    await readRefused(`/w/../../../../../..${markerFile}`);
    const hostShadow = existsSync('/etc/shadow') ? readFileSync('/etc/shadow', 'utf8') : undefined;
    for (const p of ['../../../../etc/shadow', '/w/../../../../../etc/shadow']) {
      const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(p)}`);
      if (hostShadow !== undefined) assert.notEqual(res.text, hostShadow, `${p} returned the HOST /etc/shadow`);
      assert.ok(res.status === 404 || res.status === 200, `${p}: ${res.status} ${res.text.slice(0, 200)}`);
    }
    const w = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(`../../../../..${markerDir}/dotdot`)}`, {
      body: 'x',
    });
    assert.ok(w.status < 500, `write with ..: ${w.status} ${w.text}`);
    assertMarkerUntouched('write with ..');
  });

  test('absolute host paths (the marker file, the data dir): 404, they resolve inside the sandbox', async () => {
    await readRefused(markerFile);
    await readRefused(`${server.dataDir}/client.json`);
    // (The .. test above may have created the same path inside the sandbox: a listing is of that one.)
    const st = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files/list?path=${encodeURIComponent(markerDir)}`);
    assert.ok(
      st.status === 404 || (st.status === 200 && !st.text.includes('"name":"secret"')),
      `listing the host marker dir: ${st.status} ${st.text.slice(0, 300)}`,
    );
    const w = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent(`${markerDir}/abs-write`)}`, {
      body: 'inside',
    });
    assert.equal(w.status, 200, `an absolute-path write is a sandbox write: ${w.status} ${w.text}`);
    assertMarkerUntouched('absolute-path write');
    const inside = await must(server, sb, ['cat', `${markerDir}/abs-write`]);
    assert.equal(inside.stdout, 'inside', 'the absolute-path write did not land inside the sandbox');
  });

  test('symlinks planted inside pointing at the host marker dir: read, list, stat, write, mkdir, rename, remove all stay inside', async () => {
    await must(server, sb, [
      'sh',
      '-c',
      `ln -sfn ${markerDir} /w/abs && ln -sfn ../../../../../../../..${markerDir} /w/rel && ln -sfn ${markerFile} /w/file`,
    ]);
    for (const l of ['/w/abs/secret', '/w/rel/secret', '/w/file']) await readRefused(l);
    for (const l of ['/w/abs', '/w/rel']) {
      const res = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files/list?path=${encodeURIComponent(l)}`);
      assert.ok(
        res.status === 404 || (res.status === 200 && !res.text.includes('"secret"')),
        `listing ${l} showed the host dir: ${res.status} ${res.text.slice(0, 300)}`,
      );
    }
    const rm = await call(server, 'DELETE', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent('/w/abs/secret')}`);
    assert.equal(rm.status, 404, `remove through the symlink: ${rm.status} ${rm.text.slice(0, 200)}`);
    const mv = await call(server, 'POST', `/v1/sandboxes/${sb.id}/files/rename`, { json: { from: '/w/abs/secret', to: '/w/stolen' } });
    assert.equal(mv.status, 404, `rename through the symlink: ${mv.status} ${mv.text.slice(0, 200)}`);
    assertMarkerUntouched('read/remove/rename through symlinks');

    // Writes and mkdir through the symlink: the target dir exists inside, so they land there.
    await must(server, sb, ['mkdir', '-p', markerDir]);
    await sb.files.write('/w/abs/pwned', 'through-symlink');
    await sb.files.write('/w/rel/pwned-rel', 'through-relative-symlink');
    await sb.files.mkdir('/w/abs/newdir/deeper');
    assertMarkerUntouched('write/mkdir through symlinks');
    const inside = await must(server, sb, [
      'sh',
      '-c',
      `cat ${markerDir}/pwned ${markerDir}/pwned-rel; test -d ${markerDir}/newdir/deeper && echo dir`,
    ]);
    assert.equal(inside.stdout, 'through-symlinkthrough-relative-symlinkdir\n', 'the writes did not land inside the sandbox');
    // Overwrite the link target file itself through a symlink to a host file path.
    await must(server, sb, ['sh', '-c', `echo sandbox-copy > ${markerFile}`]);
    await sb.files.write('/w/file', 'overwritten-through-symlink');
    assertMarkerUntouched('overwrite through a file symlink');
    assert.equal((await must(server, sb, ['cat', markerFile])).stdout, 'overwritten-through-symlink');
  });

  test('tar upload: a symlink to the host marker dir followed by a file through it (built with the host tar), .. and absolute names, hard links', async () => {
    const target = `${markerDir}-tar`; // a fresh name: nothing inside the sandbox there yet
    // Archive 1 (host tar): `evil -> <host dir>`, then `evil/pwned`.
    const a = join(scratch, 'a');
    const b = join(scratch, 'b');
    mkdirSync(a);
    mkdirSync(join(b, 'evil'), { recursive: true });
    symlinkSync(markerDir, join(a, 'evil'));
    writeFileSync(join(b, 'evil', 'pwned'), 'pwned-by-tar');
    const tar1 = join(scratch, 'evil.tar');
    execFileSync('tar', ['-cf', tar1, '-C', a, 'evil']);
    execFileSync('tar', ['-rf', tar1, '-C', b, 'evil/pwned']);
    const listing = execFileSync('tar', ['-tvf', tar1], { encoding: 'utf8' });
    assert.match(listing, /evil -> /, listing);
    assert.match(listing, /evil\/pwned/, listing);

    // Archive 2 (crafted): `..` names, an absolute name, a hard link to the host secret, a symlink
    // to the host secret followed by a file written over it.
    const now = 1_700_000_000;
    const tar2 = tarArchive([
      {
        name: `../../../../../../..${markerDir}/dotdot`,
        type: 'file',
        mode: 0o644,
        uid: 0,
        gid: 0,
        mtime: now,
        data: Buffer.from('dotdot'),
      },
      { name: `${markerDir}/absolute`, type: 'file', mode: 0o644, uid: 0, gid: 0, mtime: now, data: Buffer.from('absolute') },
      { name: 'hard', type: 'link', mode: 0o644, uid: 0, gid: 0, mtime: now, linkname: markerFile },
      { name: 'slink', type: 'symlink', mode: 0o777, uid: 0, gid: 0, mtime: now, linkname: markerFile },
      { name: 'slink', type: 'file', mode: 0o644, uid: 0, gid: 0, mtime: now, data: Buffer.from('over-symlink') },
    ]);

    for (const [name, archive] of [
      ['symlink then file (host tar)', readFileSync(tar1)],
      ['.., absolute, hard link, symlink overwrite', tar2],
    ] as const) {
      const res = await call(server, 'PUT', `/v1/sandboxes/${sb.id}/files/tar?path=${encodeURIComponent('/w/up')}`, {
        body: archive,
        contentType: 'application/x-tar',
        timeoutMs: 60_000,
      });
      assert.ok(!res.text.includes(secret), `${name}: the upload response contains the host secret`);
      // Either it unpacked (inside the sandbox) or it failed cleanly (4xx with a message), never 5xx.
      assert.ok(res.status === 200 || (res.status >= 400 && res.status < 500), `${name}: ${res.status} ${res.text.slice(0, 300)}`);
      assertMarkerUntouched(`tar upload: ${name}`);
      assert.equal(existsSync(target), false);
    }
    // Where things went: inside the sandbox.
    const inside = await attack(server, sb, `cat ${markerDir}/pwned 2>&1; cat /w/up/hard 2>&1; ls -la /w/up ${markerDir} 2>&1`);
    assert.doesNotMatch(inside.stdout, new RegExp(secret), `the sandbox can read the host secret after the tar upload: ${show(inside)}`);
    // The hard link can only have linked a file inside the sandbox (here: the sandbox's own copy, if any).
    const hard = await call(server, 'GET', `/v1/sandboxes/${sb.id}/files?path=${encodeURIComponent('/w/up/hard')}`);
    assert.ok(!hard.text.includes(secret), 'the hard link entry reaches the host secret');
  });

  test('a planted /bin/bash symlink to a host path: the server must not resolve it on the host to pick the shell of a session or terminal', async () => {
    // Shell sessions ("auto") and terminals (no cmd) use bash when the image has /bin/bash. If the
    // server checks that on the host path of the root, an absolute symlink the sandbox planted is
    // followed on the HOST: the choice of shell then depends on (and reveals) whether a host path
    // exists, and a host-existing target breaks the session.
    const hostOnly = `${server.dataDir}/client.json`; // exists on the host, absent in the sandbox
    const nowhere = `${server.dataDir}/no-such-file.json`;
    assert.ok(existsSync(hostOnly));
    const outcome: Record<string, string> = {};
    for (const target of [hostOnly, nowhere]) {
      await must(server, sb, ['ln', '-sfn', target, '/bin/bash']);
      const session = await sb.sessions.create();
      const r = await session.run('echo alive');
      outcome[target] =
        `session shell ${session.info.shell}, ${r.sessionAlive ? 'alive' : 'dead'}: ${JSON.stringify(r.stdout || r.stderr)}`;
      await session.close().catch(() => undefined);
      let out = '';
      const term = await sb.terminal({ onData: (d) => (out += Buffer.from(d).toString('utf8')) });
      term.write('echo TERM-ALIVE; exit\n');
      const code = await term.exited;
      outcome[target] +=
        `; terminal exit ${code}${/TERM-ALIVE\r?\n/.test(out.replace(/echo TERM-ALIVE/g, '')) ? ' alive' : ` failed: ${JSON.stringify(out.slice(0, 200))}`}`;
    }
    await must(server, sb, ['rm', '-f', '/bin/bash']);
    assert.equal(
      outcome[hostOnly],
      outcome[nowhere],
      'HOST PATH ORACLE: with /bin/bash -> <path>, sessions and terminals behave differently depending on whether <path> exists ON THE HOST ' +
        '(exec/shell-session.ts and edge/edge.ts openPty use existsSync(join(rootfs, "bin/bash")), which follows the symlink on the host):\n' +
        `  ${hostOnly}: ${outcome[hostOnly]}\n  ${nowhere}: ${outcome[nowhere]}`,
    );
  });

  test('the bystander sandbox is unaffected', async () => {
    await assertBystanderUnaffected(server, bystander, async () => {
      const r = await attack(server, bystander, ['ls', markerDir]);
      assert.notEqual(r.exitCode, 0, `the attacker's files appeared in the bystander: ${show(r)}`);
    });
  });
});
