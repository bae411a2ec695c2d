/**
 * What a control plane on PostgreSQL keeps in memory (API keys, projects, image owners:
 * store/read-cache.ts) follows every other replica's changes through the change feed
 * (LISTEN/NOTIFY): two stores on one real PostgreSQL database, as two replicas have them.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { StateStore } from '../../src/control/state-store.js';
import { postgresSkipReason, testPostgres } from '../helpers/postgres.js';
import { until } from './support/replica-pair.js';

describe(
  'replicas keep keys, projects and image owners in memory only while they hear each other',
  { skip: postgresSkipReason(), timeout: 60_000 },
  () => {
    let a: StateStore;
    let b: StateStore;
    let url: string;

    before(async () => {
      url = await (await testPostgres()).database(`dsec_caches_${Date.now()}`);
      a = await StateStore.open(url);
      b = await StateStore.open(url);
    });

    after(async () => {
      await a?.close();
      await b?.close();
    });

    test('a key revoked at one replica stops working at the other', async () => {
      await b.keys.insert('key-cache-1', 'hash-cache-1', 'cached', 'default');
      assert.equal((await a.keys.byHash('hash-cache-1'))?.id, 'key-cache-1');
      // A change no one announces (not one dsec makes) shows that A answers from memory.
      await b.db.run("UPDATE api_keys SET name = 'renamed' WHERE id = ?", ['key-cache-1']);
      assert.equal((await a.keys.byHash('hash-cache-1'))?.name, 'cached', 'kept in memory');
      await b.keys.revoke('key-cache-1');
      await until(async () => ((await a.keys.byHash('hash-cache-1')) === undefined ? true : undefined));
      assert.equal(await b.keys.byHash('hash-cache-1'), undefined, 'at once at the revoking replica');
    });

    test('a key made at one replica works at the other at once (a miss is not kept)', async () => {
      assert.equal(await a.keys.byHash('hash-cache-2'), undefined);
      await b.keys.insert('key-cache-2', 'hash-cache-2', 'new', 'default');
      assert.equal((await a.keys.byHash('hash-cache-2'))?.id, 'key-cache-2');
    });

    test('a project made or requoted at one replica is seen so at the other', async () => {
      assert.equal(await a.projects.get('cachedproj'), undefined, 'none yet (and that is kept)');
      await b.projects.insert('cachedproj', { maxSandboxes: 1 });
      const made = await until(async () => (await a.projects.get('cachedproj')) ?? undefined);
      assert.deepEqual(made.quota, { maxSandboxes: 1 });
      await b.projects.setQuota('cachedproj', { maxSandboxes: 7 });
      await until(async () => ((await a.projects.get('cachedproj'))?.quota.maxSandboxes === 7 ? true : undefined));
      assert.deepEqual((await b.projects.get('cachedproj'))?.quota, { maxSandboxes: 7 }, 'at once at the changing replica');
    });

    test("an image made private, or a name taken, at one replica is another project's no more at the other", async () => {
      assert.deepEqual(await a.imageOwners.owners('cachedimg:1', 'sha256:cached1'), { nameOwner: undefined, idOwners: [] }, 'shared');
      // A change no one announces (not one dsec makes) shows that A answers from memory.
      await b.db.run('INSERT INTO image_owners (image_id, project) VALUES (?, ?)', ['sha256:cached1', 'unannounced']);
      assert.deepEqual((await a.imageOwners.owners('cachedimg:1', 'sha256:cached1')).idOwners, [], 'kept in memory');
      const added = Date.now();
      await b.imageOwners.add('sha256:cached1', 'owner1');
      await until(async () =>
        (await a.imageOwners.owners('cachedimg:1', 'sha256:cached1')).idOwners.includes('owner1') ? true : undefined,
      );
      // Heard through the feed: A's copy would otherwise stand for its 10 s.
      assert.ok(Date.now() - added < 5_000, `seen after ${Date.now() - added} ms`);
      assert.deepEqual([...(await b.imageOwners.owners(undefined, 'sha256:cached1')).idOwners].sort(), ['owner1', 'unannounced']);
      await b.imageOwners.setNameOwner('cachedimg:1', 'owner1');
      await until(async () => ((await a.imageOwners.owners('cachedimg:1', 'sha256:cached1')).nameOwner === 'owner1' ? true : undefined));
      await b.imageOwners.removeNameOwner('cachedimg:1');
      await b.imageOwners.removeAll('sha256:cached1');
      await until(async () => {
        const o = await a.imageOwners.owners('cachedimg:1', 'sha256:cached1');
        return o.nameOwner === undefined && o.idOwners.length === 0 ? true : undefined;
      });
      assert.deepEqual(
        await b.imageOwners.owners('cachedimg:1', 'sha256:cached1'),
        { nameOwner: undefined, idOwners: [] },
        'at once at the changing replica',
      );
    });

    test('a store left open does not keep its process alive by its LISTEN connection', async () => {
      // The pool's idle connections end after 10 s; the feed's must not hold the process past that.
      const storeModule = new URL('../../src/control/state-store.js', import.meta.url).href;
      const script = `const { StateStore } = await import(${JSON.stringify(storeModule)}); await StateStore.open(${JSON.stringify(url)}); console.log('open');`;
      const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      const code = await new Promise<number | null>((res) => {
        const stop = setTimeout(() => child.kill('SIGKILL'), 45_000);
        child.once('exit', (c) => {
          clearTimeout(stop);
          res(c);
        });
      });
      assert.equal(out.trim(), 'open');
      assert.equal(code, 0, 'exited by itself (killed after 45 s otherwise)');
    });
  },
);
