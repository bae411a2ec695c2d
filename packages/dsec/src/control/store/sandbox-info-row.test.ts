import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import Fastify from 'fastify';
import { SandboxList } from '@dsec/sdk/schema';
import { StateStore, type SandboxFilter } from '../state-store.js';
import { testStoreLocation } from '../../../test/helpers/postgres.js';
import { sandboxRow } from '../../../test/helpers/sandbox-row.js';

/**
 * GET /v1/sandboxes answers with pageJson's text where it answered with page()'s objects through
 * Fastify's serializer (fast-json-stringify, compiled from SandboxList): both answers, from the
 * same store, must be the same bytes, and so parse to the same objects, for rows with every
 * optional field and with text that JSON must escape.
 */
describe('sandbox rows as SandboxList JSON', () => {
  let dir: string;
  let store: StateStore;
  const app = Fastify();

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-unit-page-json-'));
    store = await StateStore.open(await testStoreLocation(join(dir, 'state.db')));
    const at = (s: number): string => `2025-01-01T00:00:0${s}.000Z`;
    await store.sandboxes.insertMany([
      { info: sandboxRow('sb-local-plain0', { labels: { run: 'r' }, createdAt: at(1) }), spec: {} },
      {
        info: sandboxRow('sb-local-every1', {
          labels: { run: 'r', 'quote"and\\slash': 'line\nbreak\ttab \u2028 é 😀', '10': 'a number-like key', '2': 'another' },
          createdAt: at(2),
          project: 'team-a',
          backend: 'microvm',
          image: 'registry.local/img:"tag"',
          resources: { cpu: 0.25, memoryMiB: 128, pids: 64, diskMiB: 1024 },
          layers: [`sha256:${'a'.repeat(64)}`, `sha256:${'b'.repeat(64)}`],
          reason: 'failed: "exit 1"\n\u0001',
          ttlSeconds: 60,
          idleTimeoutSeconds: 30,
          expiresAt: '2025-01-01T00:01:02.000Z',
          onExpiry: 'pause',
          lastActivityAt: '2025-01-01T00:00:09.123Z',
        }),
        spec: {},
      },
      { info: sandboxRow('sb-local-moves2', { labels: { run: 'r' }, createdAt: at(3) }), spec: {} },
      { info: sandboxRow('sb-local-other3', { labels: { run: 'x' }, createdAt: at(4), status: 'failed', reason: 'boom' }), spec: {} },
    ]);
    await store.moves.begin(
      'sb-local-moves2',
      'edge-b',
      { owner: 'r1', until: Date.now() + 60_000 },
      Date.parse('2025-01-01T00:00:05.500Z'),
    );
    // A row whose last activity was never recorded (0): lastActivityAt is its creation.
    await store.db.run('UPDATE sandboxes SET last_activity = 0 WHERE id = ?', ['sb-local-plain0']);

    const querystring = (q: { filter: string }): SandboxFilter => JSON.parse(q.filter) as SandboxFilter;
    app.get('/objects', { schema: { response: { 200: SandboxList } } }, async (req) =>
      store.sandboxes.page(querystring(req.query as { filter: string })),
    );
    app.get('/text', async (req, reply) =>
      reply.type('application/json; charset=utf-8').send(await store.sandboxes.pageJson(querystring(req.query as { filter: string }))),
    );
    await app.ready();
  });
  after(async () => {
    await app.close();
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const filters: [string, SandboxFilter][] = [
    ['all, unpaged', {}],
    ['by label, one page of all', { labels: { run: 'r' }, limit: 10 }],
    ['by label, a page with a next', { labels: { run: 'r' }, limit: 2 }],
    ['a status', { status: 'failed' }],
    ['nothing', { labels: { run: 'none' } }],
  ];
  for (const [what, filter] of filters) {
    test(`${what}: the same bytes as the serialized objects`, async () => {
      const get = (path: string) => app.inject({ method: 'GET', url: path, query: { filter: JSON.stringify(filter) } });
      const [objects, text] = await Promise.all([get('/objects'), get('/text')]);
      assert.equal(objects.statusCode, 200, objects.body);
      assert.equal(text.statusCode, 200, text.body);
      assert.equal(text.headers['content-type'], objects.headers['content-type']);
      assert.deepEqual(JSON.parse(text.body), JSON.parse(objects.body));
      assert.equal(text.body, objects.body);
    });
  }

  test('the next page follows the cursor the text gave', async () => {
    const first = JSON.parse(await store.sandboxes.pageJson({ labels: { run: 'r' }, limit: 2 })) as SandboxList;
    assert.deepEqual(
      first.sandboxes.map((s) => s.id),
      ['sb-local-plain0', 'sb-local-every1'],
    );
    assert.ok(first.next);
    const second = JSON.parse(await store.sandboxes.pageJson({ labels: { run: 'r' }, limit: 2, after: first.next })) as SandboxList;
    assert.deepEqual(
      second.sandboxes.map((s) => [s.id, s.migration?.to]),
      [['sb-local-moves2', 'edge-b']],
    );
    assert.equal(second.next, undefined);
  });
});
