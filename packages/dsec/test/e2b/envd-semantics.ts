/**
 * E2B's SDK against dsec where envd's own behaviour is the contract (envd 0.6.x as its source
 * and the SDK define it): the order and shape of listings, what a symlink reports, removing what
 * is not there, `~` paths, watches with entries that follow new folders, env vars scoped to one
 * command, and signed file URLs fetched by someone with no header and no token. A suite of
 * e2b-sdk.test.ts, on its server and its sandbox.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { InvalidArgumentError, type Sandbox } from 'e2b';

/** Resolves when `check` holds, polling; fails with `what` after a generous bound (not a timing assertion). */
async function eventually(what: string, check: () => boolean | Promise<boolean>, boundMs = 20_000): Promise<void> {
  const until = Date.now() + boundMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`never happened: ${what}`);
    await new Promise((r) => setTimeout(r, 25));
  }
}

export function envdSemanticsTests(get: () => { sb: Sandbox; noBase: string | undefined }): void {
  describe("envd's semantics through E2B's SDK", () => {
    test('list with depth walks depth first in name order, as envd does', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.commands.run('mkdir -p order/b/y order/a/c && touch order/b/y/z order/a/c/d order/a/e order/top order/B');
      const paths = (await sb.files.list('order', { depth: 3 })).map((e) => e.path.replace('/home/user/order/', ''));
      assert.deepEqual(paths, ['B', 'a', 'a/c', 'a/c/d', 'a/e', 'b', 'b/y', 'b/y/z', 'top']);
      const two = (await sb.files.list('order', { depth: 2 })).map((e) => e.name);
      assert.deepEqual(two, ['B', 'a', 'c', 'e', 'b', 'y', 'top']);
    });

    test("a symlink reports its target's type and mode and its full target path; a dangling one has no type", async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.commands.run(
        [
          'mkdir -p links/real/inner && echo data > links/real/inner/f.txt && chmod 600 links/real/inner/f.txt',
          'cd links && ln -s real/inner/f.txt rel && ln -s rel chain && ln -s /home/user/links/real dirlink && ln -s nowhere dangling',
        ].join(' && '),
      );
      const rel = await sb.files.getInfo('links/rel');
      assert.equal(rel.type, 'file');
      assert.equal(rel.symlinkTarget, '/home/user/links/real/inner/f.txt');
      assert.equal(rel.mode, 0o600);
      assert.equal(rel.permissions, 'Lrwxrwxrwx');
      assert.equal(rel.path, '/home/user/links/rel');
      const chain = await sb.files.getInfo('links/chain');
      assert.equal(chain.symlinkTarget, '/home/user/links/real/inner/f.txt');
      const dir = await sb.files.getInfo('links/dirlink');
      assert.equal(dir.type, 'dir');
      assert.equal(dir.symlinkTarget, '/home/user/links/real');
      const dangling = await sb.files.getInfo('links/dangling');
      assert.equal(dangling.type, undefined);
      assert.equal(dangling.symlinkTarget, '/home/user/links/dangling');
      // the SDK leaves typeless entries out of a listing
      assert.deepEqual((await sb.files.list('links')).map((e) => e.name).sort(), ['chain', 'dirlink', 'real', 'rel']);
      // a link to a directory lists the directory, its entries named under the link
      assert.deepEqual(
        (await sb.files.list('links/dirlink')).map((e) => e.path),
        ['/home/user/links/dirlink/inner'],
      );
      // a link in a parent is resolved too: merged-usr Debian's /bin is a link to usr/bin
      const sh = await sb.files.getInfo('/bin/sh');
      assert.equal(sh.symlinkTarget, '/usr/bin/dash');
    });

    test("permissions are Go's FileMode strings: sticky, setuid and plain", async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      assert.equal((await sb.files.getInfo('/tmp')).permissions, 'dtrwxrwxrwx');
      await sb.commands.run('touch suid && chmod 4755 suid', { user: 'root', cwd: '/tmp' });
      assert.equal((await sb.files.getInfo('/tmp/suid')).permissions, 'urwxr-xr-x');
      assert.equal((await sb.files.getInfo('/tmp/suid')).mode, 0o755);
      assert.equal((await sb.files.getInfo('/home/user')).permissions, 'drwxr-xr-x');
    });

    test('remove of a missing path is done; makeDir on a file is an invalid argument; ~ is the home', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.files.remove('/tmp/never-was-here');
      await sb.files.write('~/tilde.txt', 'home');
      assert.equal(await sb.files.read('/home/user/tilde.txt'), 'home');
      assert.equal((await sb.files.getInfo('~')).path, '/home/user');
      await assert.rejects(sb.files.makeDir('tilde.txt'), InvalidArgumentError);
      await assert.rejects(sb.files.read('~root/x'), InvalidArgumentError);
    });

    test("rename makes the destination's missing parents, the user's", async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.files.write('mv-src.txt', 'moving');
      const moved = await sb.files.rename('mv-src.txt', 'deep/er/moved.txt');
      assert.equal(moved.path, '/home/user/deep/er/moved.txt');
      assert.equal((await sb.commands.run('stat -c %U deep deep/er deep/er/moved.txt')).stdout, 'user\nuser\nuser\n');
    });

    test('a recursive watch reports entries and follows folders made after it started', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.files.makeDir('watch-deep');
      const events: { name: string; type: string; entryPath?: string | undefined; entryType?: string | undefined; size?: number }[] = [];
      const handle = await sb.files.watchDir(
        'watch-deep',
        (e) =>
          void events.push({
            name: e.name,
            type: e.type,
            entryPath: e.entry?.path,
            entryType: e.entry?.type,
            ...(e.entry ? { size: e.entry.size } : {}),
          }),
        { recursive: true, includeEntry: true },
      );
      try {
        await sb.files.makeDir('watch-deep/later');
        await eventually('the new folder', () => events.some((e) => e.name === 'later' && e.type === 'create'));
        await sb.files.write('watch-deep/later/inside.txt', 'twelve bytes');
        await eventually('a file in the new folder', () => events.some((e) => e.name === 'later/inside.txt' && e.type === 'create'));
        const created = events.find((e) => e.name === 'later/inside.txt' && e.type === 'create')!;
        assert.equal(created.entryPath, '/home/user/watch-deep/later/inside.txt');
        assert.equal(created.entryType, 'file');
        assert.equal(created.size, 12);
        assert.equal(events.find((e) => e.name === 'later')!.entryType, 'dir');
        await sb.files.remove('watch-deep/later');
        await eventually('the removal', () => events.some((e) => e.name === 'later' && e.type === 'remove'));
        assert.equal(events.find((e) => e.name === 'later' && e.type === 'remove')!.entryPath, undefined);
      } finally {
        await handle.stop();
      }
    });

    test("a command's envs are its own: the next command sees the sandbox's", async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      const first = await sb.commands.run('echo "$ONLY_HERE:$HOME"', { envs: { ONLY_HERE: 'scoped', HOME: '/tmp' } });
      assert.equal(first.stdout, 'scoped:/tmp\n');
      const next = await sb.commands.run('echo "[$ONLY_HERE]:$HOME"');
      assert.equal(next.stdout, '[]:/home/user\n');
    });

    test('file calls act as the user they name: the kernel refuses what the user may not do', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await assert.rejects(sb.files.write('/etc/planted', 'x'), /permission denied/);
      await assert.rejects(sb.files.remove('/etc/hostname'), /permission denied/);
      await assert.rejects(sb.files.rename('/etc/hostname', '/home/user/stolen'), /permission denied/);
      await assert.rejects(sb.files.makeDir('/opt/mine'), /permission denied/);
      await assert.rejects(sb.files.read('/etc/shadow'), /permission denied/);
      const check = await sb.commands
        .run('ls /etc/planted /opt/mine 2>&1; cat /etc/hostname >/dev/null && echo kept', { user: 'root' })
        .catch((e: unknown) => e);
      assert.match(String((check as { stdout?: string }).stdout ?? ''), /kept/);
      assert.doesNotMatch(String((check as { stdout?: string }).stdout ?? ''), /^\/etc\/planted$/m);
      // root may, and what root writes is root's; what the user writes in its home is the user's
      await sb.files.write('/etc/planted-by-root', 'r', { user: 'root' });
      assert.equal((await sb.commands.run('stat -c %U /etc/planted-by-root')).stdout, 'root\n');
      await sb.files.write('mine/deep/file.txt', 'u');
      assert.equal((await sb.commands.run('stat -c %U:%G mine mine/deep mine/deep/file.txt')).stdout, 'user:user\nuser:user\nuser:user\n');
      // a group the user is in opens a directory of that group
      await sb.commands.run(
        'groupadd -f crew && usermod -aG crew user && mkdir -p /srv/crew && chgrp crew /srv/crew && chmod 2775 /srv/crew',
        {
          user: 'root',
        },
      );
      await sb.files.write('/srv/crew/shared.txt', 'team');
      assert.equal((await sb.commands.run('stat -c %U:%G /srv/crew/shared.txt')).stdout, 'user:crew\n');
    });

    test('file metadata: set on write, shown by info and list, kept by rename, cleared by an overwrite without it', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      const w = await sb.files.write('meta.txt', 'tagged', { metadata: { 'run-id': 'r-17', step: '3' } });
      assert.deepEqual(w.metadata, { 'run-id': 'r-17', step: '3' });
      assert.deepEqual((await sb.files.getInfo('meta.txt')).metadata, { 'run-id': 'r-17', step: '3' });
      assert.deepEqual((await sb.files.list('.')).find((e) => e.name === 'meta.txt')?.metadata, { 'run-id': 'r-17', step: '3' });
      // the sandbox sees them as user xattrs under envd's prefix
      assert.match(
        (
          await sb.commands.run(
            "getfattr -d meta.txt 2>/dev/null || python3 -c \"import os;print(os.getxattr('meta.txt','user.e2b.step'))\"",
          )
        ).stdout,
        /3/,
      );
      await sb.files.rename('meta.txt', 'meta-moved.txt');
      assert.deepEqual((await sb.files.getInfo('meta-moved.txt')).metadata, { 'run-id': 'r-17', step: '3' });
      await sb.files.write('meta-moved.txt', 'again');
      assert.equal((await sb.files.getInfo('meta-moved.txt')).metadata, undefined);
      await sb.files.write('/tmp/root-file', 'r', { user: 'root' });
      await assert.rejects(sb.files.write('/tmp/root-file', 'x', { metadata: { a: 'b' } }), /permission denied/);
    });

    test('signed file URLs: fetched with no header, as user and as root; an expired or altered one is refused', async (t) => {
      const { sb, noBase } = get();
      if (noBase) return t.skip(noBase);
      await sb.files.write('signed.txt', 'signed content');
      const url = await sb.downloadUrl('signed.txt');
      assert.match(url, /signature=v1_/);
      const got = await fetch(url);
      assert.equal(got.status, 200);
      assert.equal(await got.text(), 'signed content');
      await sb.files.write('/root/only-root.txt', 'root only', { user: 'root' });
      const rootUrl = await sb.downloadUrl('/root/only-root.txt', { user: 'root', useSignatureExpiration: 60 });
      assert.match(rootUrl, /signature_expiration=/);
      assert.equal(await (await fetch(rootUrl)).text(), 'root only');
      // the same signature for another path, or with its expiration moved, opens nothing
      const other = new URL(url);
      other.searchParams.set('path', '/etc/shadow');
      assert.equal((await fetch(other)).status, 401);
      const moved = new URL(rootUrl);
      moved.searchParams.set('signature_expiration', String(Number(moved.searchParams.get('signature_expiration')) + 3600));
      assert.equal((await fetch(moved)).status, 401);
      const expired = await sb.downloadUrl('signed.txt', { useSignatureExpiration: -5 });
      const refused = await fetch(expired);
      assert.equal(refused.status, 401);
      assert.match(await refused.text(), /expired/);

      const up = await sb.uploadUrl('uploaded/via-url.txt');
      const form = new FormData();
      form.append('file', new Blob(['sent by a browser']), 'via-url.txt');
      const posted = await fetch(up, { method: 'POST', body: form });
      assert.equal(posted.status, 200, await posted.clone().text());
      assert.equal(await sb.files.read('uploaded/via-url.txt'), 'sent by a browser');
      assert.equal((await sb.commands.run('stat -c %U uploaded/via-url.txt')).stdout, 'user\n');
      // a write signature does not read, and a read signature does not write
      const asRead = new URL(up);
      assert.equal((await fetch(asRead)).status, 401);
      const asWrite = await fetch(url, { method: 'POST', body: form });
      assert.equal(asWrite.status, 401);
    });
  });
}
