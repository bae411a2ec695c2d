/**
 * The files API under races: a process inside the sandbox keeps swapping /w/d between a real
 * directory and symlinks (to `/`, to `/etc`, to `..`, to the host path of a canary) while the
 * files API reads, writes, lists, stats, removes, makes directories and uploads and downloads tar
 * beneath it, thousands of times. The files API runs as root on the host, so a lookup that
 * followed the swapped link out of the sandbox's root would read or write the host.
 *
 * Canaries on the host, named so that every escape would reach one: `/<name>` and `/etc/<name>`
 * (the targets of the links, seen from the host), and the sandbox's own directory on the host
 * (what `..` from its root is). After the run: no answer carried a canary's secret or the
 * sandbox's host config, no canary changed, nothing new appeared in those host directories, and
 * every answer was 2xx or 4xx.
 *
 * CI: 2,000 requests, 4 at a time; DSEC_SOAK=1: 20,000 (DSEC_FILES_RACE_REQUESTS overrides).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { tarArchive } from '../../src/image/oci/tar-writer.js';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';

const long = process.env['DSEC_SOAK'] === '1';
const REQUESTS = Number(process.env['DSEC_FILES_RACE_REQUESTS'] ?? (long ? 20_000 : 2000));
const CONCURRENCY = 4;

describe(
  `files API under races: ${REQUESTS} calls while /w/d is swapped for symlinks`,
  { skip: integrationSkipReason(), timeout: long ? 3 * 3600_000 : 900_000 },
  () => {
    let server: TestServer;
    let sb: Sandbox;
    const name = `dsec-canary-${randomBytes(6).toString('hex')}`;
    const secret = `canary-secret-${randomBytes(12).toString('hex')}`;
    const canaries = [join('/', name), join('/etc', name)];
    let sandboxHostDir = '';
    /** Host directories an escape would write into, with what they held before. */
    const watched = new Map<string, string[]>();
    const statuses = new Map<number, number>();

    const ls = (dir: string): string[] => readdirSync(dir).sort();

    before(async () => {
      for (const c of canaries) writeFileSync(c, secret, { mode: 0o644 });
      server = await startTestServer();
      sb = await Sandbox.create({ ...server.conn, labels: { role: 'files-race' } });
      sandboxHostDir = join(server.dataDir, 'node', 'sandboxes', sb.id);
      for (const d of ['/', '/etc', sandboxHostDir, join(sandboxHostDir, 'rootfs', '..')]) watched.set(d, ls(d));
      // The swapper: /w/d is a real directory (with a file and a subdirectory), then a symlink to
      // /, to /etc, to .., to the host path of the canary directory, and again, as fast as sh goes.
      await sb.commands.run('mkdir -p /w');
      await sb.commands.start(
        [
          'sh',
          '-c',
          'cd /w; while :; do rm -rf d; mkdir d; echo inside > d/f; mkdir d/sub; rm -rf d; ln -s / d; rm -f d; ln -s /etc d; rm -f d; ln -s .. d; rm -f d; ln -s d/sub/../.. d; rm -f d; ln -s "$0" d; done',
          sandboxHostDir,
        ],
        {},
      );
    });
    after(async () => {
      await server?.close();
      for (const c of canaries) rmSync(c, { force: true });
    });

    /** One random files call beneath /w/d; returns its status and body text. */
    async function call(i: number): Promise<{ what: string; status: number; text: string; cut: string | undefined }> {
      const names = ['f', 'sub', 'sub/f', name, `new-${i % 50}`, '../' + name, 'sub/../../' + name, '../../..', 'passwd', '.'];
      const pick = <T>(xs: T[]): T => xs[Math.floor(Math.random() * xs.length)]!;
      const path = `/w/d/${pick(names)}`;
      const q = (p: string): string => `?path=${encodeURIComponent(p)}`;
      const base = `${server.url}/v1/sandboxes/${sb.id}/files`;
      const auth = { authorization: `Bearer ${server.apiKey}` };
      const op = pick(['read', 'write', 'list', 'stat', 'remove', 'mkdir', 'upload', 'download'] as const);
      let res: Response;
      const signal = AbortSignal.timeout(60_000);
      switch (op) {
        case 'read':
          res = await fetch(base + q(path), { headers: auth, signal });
          break;
        case 'write':
          res = await fetch(base + q(path), {
            method: 'PUT',
            headers: { ...auth, 'content-type': 'application/octet-stream' },
            body: `written ${i}`,
            signal,
          });
          break;
        case 'list':
          res = await fetch(`${base}/list${q(pick(['/w/d', '/w/d/sub', path]))}`, { headers: auth, signal });
          break;
        case 'stat':
          res = await fetch(`${base}/stat${q(path)}`, { headers: auth, signal });
          break;
        case 'remove':
          res = await fetch(base + q(`/w/d/${pick([name, `new-${i % 50}`, 'sub', 'f'])}`) + '&recursive=true', {
            method: 'DELETE',
            headers: auth,
            signal,
          });
          break;
        case 'mkdir':
          res = await fetch(`${base}/mkdir`, {
            method: 'POST',
            headers: { ...auth, 'content-type': 'application/json' },
            body: JSON.stringify({ path: `/w/d/sub/new-${i % 50}`, parents: true }),
            signal,
          });
          break;
        case 'upload': {
          const meta = { mode: 0o644, uid: 0, gid: 0, mtime: 0 };
          const tar = tarArchive([
            { ...meta, name: `tar-${i % 50}`, type: 'file', data: Buffer.from(`from tar ${i}`) },
            { ...meta, name, type: 'file', data: Buffer.from(`tar overwrote the canary ${i}`) },
            { ...meta, mode: 0o755, name: 'sub/', type: 'dir' },
            { ...meta, name: 'sub/t', type: 'file', data: Buffer.from('t') },
          ]);
          res = await fetch(`${base}/tar${q(pick(['/w/d', '/w/d/sub', path]))}`, {
            method: 'PUT',
            headers: { ...auth, 'content-type': 'application/x-tar' },
            body: tar,
            signal,
          });
          break;
        }
        case 'download':
          res = await fetch(`${base}/tar${q(pick(['/w/d', path]))}`, { headers: auth, signal });
          break;
      }
      // Read what arrives even when the body is cut off: a tar download whose `tar` fails after its
      // output started can only end the stream early (exec/sandbox-tar.ts), and its partial bytes
      // must hold no host data either.
      const chunks: Buffer[] = [];
      let cut = false;
      try {
        for await (const c of res.body ?? []) chunks.push(Buffer.from(c as Uint8Array));
      } catch {
        cut = true;
      }
      return { what: `${op} ${path}`, status: res.status, text: Buffer.concat(chunks).toString('latin1'), cut: cut ? op : undefined };
    }

    test('no read or write lands outside the sandbox; only 2xx and 4xx', async () => {
      let next = 0;
      let cutDownloads = 0;
      const bad: string[] = [];
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          while (next < REQUESTS) {
            const i = next++;
            const r = await call(i);
            statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
            if (r.status >= 500 || r.status < 200) bad.push(`${r.what}: ${r.status} ${r.text.slice(0, 300)}`);
            if (r.cut === 'download') cutDownloads++;
            else if (r.cut) bad.push(`${r.what}: the answer (${r.status}) was cut off`);
            if (r.text.includes(secret)) bad.push(`${r.what}: answered with the HOST canary's secret`);
            if (r.text.includes('"ociVersion"')) bad.push(`${r.what}: answered with the sandbox's host config.json`);
          }
        }),
      );
      console.log(
        `files race: ${REQUESTS} calls; statuses ${JSON.stringify(Object.fromEntries([...statuses].sort()))}; tar downloads cut off mid-stream (tar failed after its output began): ${cutDownloads}`,
      );
      assert.deepEqual(bad.slice(0, 10), [], `${bad.length} bad answers`);
      for (const c of canaries) {
        assert.equal(readFileSync(c, 'utf8'), secret, `the host canary ${c} was changed`);
        assert.equal(statSync(c).size, secret.length);
      }
      for (const [dir, was] of watched) assert.deepEqual(ls(dir), was, `something new appeared in the host directory ${dir}`);
      // The race was real: the swapper ran throughout, and calls succeeded beneath it.
      const procs = await sb.commands.list();
      assert.ok(
        procs.some((p) => p.info.status === 'running'),
        `the swapper is not running: ${JSON.stringify(procs.map((p) => p.info))}`,
      );
      assert.ok((statuses.get(200) ?? 0) > 0, `no call succeeded: ${JSON.stringify([...statuses])}`);
    });
  },
);
