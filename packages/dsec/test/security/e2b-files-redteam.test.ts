/**
 * Red-team checks of E2B's file surface on dsec: what a process inside a sandbox can plant (links,
 * /etc/group) and what a holder of one signed URL can send, against the shared control plane.
 * The unit parts need no server; the rest runs the real E2B SDK on a test server with `base`.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from 'e2b';
import type { FileStat } from '@dsec/sdk/schema';
import { ApiError } from '../../src/api-error.js';
import { cachedStat, realPath } from '../../src/control/e2b/entry-info.js';
import { SandboxUsers } from '../../src/control/e2b/sandbox-users.js';
import type { ControlPlane } from '../../src/control/control-plane.js';
import { which } from '../../src/host/doctor.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { ensureBaseImage } from '../e2b/base-image.js';

/** A chain of `n` links in /d, each `L<i> -> L<i+1>/./././…` (a target near PATH_MAX), the last to `.`. */
function linkChain(n: number): Map<string, Partial<FileStat>> {
  const pad = '/.'.repeat(2000);
  const fs = new Map<string, Partial<FileStat>>([['/d', { type: 'dir' }]]);
  for (let i = 1; i < n; i++) fs.set(`/d/L${i}`, { type: 'symlink', linkTarget: `L${i + 1}${pad}` });
  fs.set(`/d/L${n}`, { type: 'symlink', linkTarget: '.' });
  return fs;
}

describe('E2B red team: units', () => {
  test('realPath of a chain of 255 links padded with `.` components is linear, not quadratic', async () => {
    const fs = linkChain(255);
    const stat = cachedStat(async (p) => {
      const s = fs.get(p);
      if (!s) throw new ApiError('FILE_NOT_FOUND', p);
      return s as FileStat;
    });
    const t0 = Date.now();
    assert.equal(await realPath(stat, '/d/L1'), '/d');
    // Before: shift() on a half-million-element array per component, 46 s of a blocked event loop.
    assert.ok(Date.now() - t0 < 3000, `realPath took ${Date.now() - t0} ms`);
  });

  test("one E2B call's link resolution is bounded: many padded chains end in resource_exhausted, quickly", async () => {
    const fs = linkChain(255);
    // Links to the chain: 256 links, so each is given up at MAX_LINKS before its padding is popped
    // (pushing it was the cost: 50 of them took 2.3 s of the server's loop, 10,000 would take minutes).
    for (let i = 0; i < 1000; i++) fs.set(`/m/e${i}`, { type: 'symlink', linkTarget: '/d/L1' });
    fs.set('/m', { type: 'dir' });
    const stat = cachedStat(async (p) => {
      const s = fs.get(p);
      if (!s) throw new ApiError('FILE_NOT_FOUND', p);
      return s as FileStat;
    });
    const t0 = Date.now();
    await assert.rejects(
      (async () => {
        for (let i = 0; i < 1000; i++) await realPath(stat, `/m/e${i}`);
      })(),
      /resource_exhausted|too many/,
    );
    assert.ok(Date.now() - t0 < 5000, `took ${Date.now() - t0} ms`);
  });

  test('an /etc/group of 95k memberships is parsed in linear time', async () => {
    const group = Array.from({ length: 95_000 }, (_, i) => `g${i}:x:${100_000 + i}:user`).join('\n');
    const files: Record<string, string> = {
      '/etc/passwd': 'root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n',
      '/etc/group': group,
    };
    const control = {
      files: {
        stat: async (_c: unknown, _id: string, p: string) => ({ mtime: 'm', size: files[p]!.length }),
        readFile: async (_c: unknown, _id: string, p: string) => Buffer.from(files[p]!),
      },
    } as unknown as ControlPlane;
    const users = new SandboxUsers(control);
    const t0 = Date.now();
    const u = await users.resolve({ sandboxId: 'sb-x', caller: {} as never }, 'user');
    // Before: Array.includes per membership, 5·10⁹ comparisons (about 7 s of a blocked event loop).
    assert.ok(Date.now() - t0 < 2000, `parsing took ${Date.now() - t0} ms`);
    assert.equal(u.groups.length, 95_001);
  });
});

describe('E2B red team: against a server', { skip: integrationSkipReason(), timeout: 600_000 }, () => {
  let server: TestServer;
  let sb: Sandbox;
  let other: Sandbox;
  let noBase: string | undefined;
  const saved: Record<string, string | undefined> = {};

  before(async () => {
    server = await startTestServer();
    if (!which('debootstrap')) {
      noBase = 'debootstrap is not installed';
      return;
    }
    try {
      await ensureBaseImage(server.dsec.images);
    } catch (err) {
      noBase = `no base template: ${(err as Error).message.split('\n')[0]}`;
      return;
    }
    const res = await fetch(`${server.url}/v1/e2b/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'redteam' }),
    });
    const { key } = (await res.json()) as { key: string };
    for (const [k, v] of Object.entries({ E2B_API_URL: server.url, E2B_SANDBOX_URL: server.url, E2B_API_KEY: key })) {
      saved[k] = process.env[k];
      process.env[k] = v;
    }
    sb = await Sandbox.create({ timeoutMs: 600_000 });
    other = await Sandbox.create({ timeoutMs: 600_000 });
  });

  after(async () => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    await server?.close();
  });

  test('a signed upload URL writes its own path only: extra multipart files named elsewhere are refused', async (t) => {
    if (noBase) return t.skip(noBase);
    const up = await sb.uploadUrl('/home/user/allowed.txt');
    const form = new FormData();
    form.append('file', new Blob(['ok']), 'allowed.txt');
    form.append('file', new Blob(['echo pwned\n']), '/home/user/.bashrc-evil');
    const posted = await fetch(up, { method: 'POST', body: form });
    assert.notEqual(posted.status, 200, await posted.clone().text());
    assert.equal(await sb.files.exists('/home/user/.bashrc-evil'), false);
    // One part, under any file name, goes to the signed path (what browsers send).
    const one = new FormData();
    one.append('file', new Blob(['fine']), '/etc/elsewhere');
    assert.equal((await fetch(up, { method: 'POST', body: one })).status, 200);
    assert.equal(await sb.files.read('/home/user/allowed.txt'), 'fine');
    assert.equal(await sb.files.exists('/etc/elsewhere'), false);
    // The token's holder still sends several files at once.
    await sb.files.write([
      { path: '/home/user/m1', data: '1' },
      { path: '/home/user/m2', data: '2' },
    ]);
    assert.equal(await sb.files.read('/home/user/m2'), '2');
  });

  test('a stat of a planted chain of padded links answers promptly and leaves the control plane responsive', async (t) => {
    if (noBase) return t.skip(noBase);
    await sb.commands.run(
      'mkdir -p /tmp/d && cd /tmp/d && pad=$(printf "/.%.0s" $(seq 2000)) && ' +
        'for i in $(seq 1 254); do ln -s "L$((i+1))$pad" L$i; done && ln -s . L255 && ' +
        'mkdir /tmp/many && for i in $(seq 1 50); do ln -s /tmp/d/L1 /tmp/many/e$i; done',
      { timeoutMs: 120_000 },
    );
    const t0 = Date.now();
    const info = await sb.files.getInfo('/tmp/d/L1');
    assert.equal(info.symlinkTarget, '/tmp/d');
    assert.ok(Date.now() - t0 < 10_000, `stat took ${Date.now() - t0} ms`);
    const t1 = Date.now();
    await assert.rejects(sb.files.list('/tmp/many'), /resource|too many|exhaust/i);
    assert.ok(Date.now() - t1 < 10_000, `list took ${Date.now() - t1} ms`);
    // The other sandbox's calls still work.
    await other.files.write('/tmp/after', 'x');
    assert.equal(await other.files.read('/tmp/after'), 'x');
  });

  test("a user's remove of a tree of 200k files yields the event loop while it runs", async (t) => {
    if (noBase) return t.skip(noBase);
    await sb.commands.run('mkdir -p big && cd big && for d in $(seq 1 20); do mkdir $d; (cd $d && seq 1 10000 | xargs touch); done', {
      timeoutMs: 300_000,
    });
    await sb.files.write('/tmp/root-owned/keep', 'k', { user: 'root' });
    let maxGap = 0;
    let last = Date.now();
    const probe = setInterval(() => {
      const now = Date.now();
      maxGap = Math.max(maxGap, now - last);
      last = now;
    }, 5);
    try {
      await sb.files.remove('big');
    } finally {
      clearInterval(probe);
    }
    // Before: one synchronous walk, 3.7 s without a turn of the loop (the control plane's, in-process edges).
    assert.ok(maxGap < 1500, `the event loop was held ${maxGap} ms`);
    assert.equal(await sb.files.exists('big'), false);
    await assert.rejects(sb.files.remove('/tmp/root-owned'), /permission denied/);
    assert.equal(await sb.files.read('/tmp/root-owned/keep', { user: 'root' }), 'k');
  });

  test("after a refused user call in one sandbox, another sandbox's root and user calls act as themselves", async (t) => {
    if (noBase) return t.skip(noBase);
    await assert.rejects(sb.files.write('/etc/nope', 'x'), /permission denied/);
    await other.files.write('/etc/root-may', 'x', { user: 'root' });
    assert.equal((await other.commands.run('stat -c %U /etc/root-may')).stdout, 'root\n');
    await assert.rejects(other.files.write('/etc/user-may-not', 'x'), /permission denied/);
    await other.files.write('/home/user/mine', 'x');
    assert.equal((await other.commands.run('stat -c %U:%G /home/user/mine')).stdout, 'user:user\n');
  });
});
