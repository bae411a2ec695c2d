import assert from 'node:assert/strict';
import { test } from 'node:test';
import Fastify from 'fastify';
import { requestArrivals, requestIdOptions, useRequestLog } from './request-log.js';

/**
 * A request is "being served" (requestArrivals.current) from its onRequest hook until its
 * response is sent: work it starts and leaves running (a batch's driver, a pool's refill) is then
 * background work, which looks for other connections' commits again (control/store/change-feed.ts).
 */
test('requestArrivals: numbered as they arrive; current while served, undefined for work that outlives the response', async () => {
  const app = Fastify({ ...requestIdOptions });
  useRequestLog(app, () => undefined);
  let during: number | undefined;
  let later: Promise<number | undefined> | undefined;
  app.get('/x', async () => {
    during = requestArrivals.current();
    // Left running by the handler, in the request's async context.
    later = new Promise((resolve) => setTimeout(() => resolve(requestArrivals.current()), 50));
    return { ok: true };
  });
  await app.ready();
  try {
    const before = requestArrivals.count();
    assert.equal((await app.inject({ method: 'GET', url: '/x' })).statusCode, 200);
    assert.equal(during, before + 1, 'the request has the next number while it is served');
    assert.equal(requestArrivals.count(), before + 1);
    assert.equal(await later, undefined, 'work still running after the response is not serving the request');
    assert.equal(requestArrivals.current(), undefined, 'outside any request');
  } finally {
    await app.close();
  }
});
