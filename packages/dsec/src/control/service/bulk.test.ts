import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { SandboxInfo } from '@dsec/sdk/schema';
import { applyByLabels, BULK_SELECT_PAGE } from './bulk.js';
import { SYSTEM } from './callers.js';
import type { SandboxService } from './sandboxes.js';

test('a bulk kill reads its selection a page at a time and kills every sandbox of every page', async () => {
  const all = Array.from({ length: BULK_SELECT_PAGE * 2 + 500 }, (_, i) => `sb-e-${String(i).padStart(6, '0')}`);
  const pages: { limit?: number; after?: string }[] = [];
  const killed: string[] = [];
  const fake = {
    async page(_caller: unknown, filter: { labels?: Record<string, string>; limit?: number; after?: string }) {
      pages.push({ ...(filter.limit ? { limit: filter.limit } : {}), ...(filter.after ? { after: filter.after } : {}) });
      assert.deepEqual(filter.labels, { job: 'j' });
      const from = filter.after ? all.indexOf(filter.after) + 1 : 0;
      const ids = all.slice(from, from + (filter.limit ?? all.length));
      const next = from + ids.length < all.length ? ids[ids.length - 1] : undefined;
      return { sandboxes: ids.map((id) => ({ id }) as SandboxInfo), ...(next ? { next } : {}) };
    },
    async kill(_caller: unknown, id: string) {
      killed.push(id);
    },
  } as unknown as SandboxService;
  const r = await applyByLabels(fake, SYSTEM, { job: 'j' }, 'kill');
  assert.equal(pages.length, 3);
  assert.ok(pages.every((p) => p.limit === BULK_SELECT_PAGE));
  assert.deepEqual(r.ids, all);
  assert.deepEqual(killed.sort(), all);
  assert.deepEqual(r.failures, []);
});
