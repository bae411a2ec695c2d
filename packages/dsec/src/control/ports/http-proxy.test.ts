import assert from 'node:assert/strict';
import { test } from 'node:test';
import { responseHeaders, scopeCookie } from './http-proxy.js';

const P = '/v1/port-links/sb-e1-abcdef.8000.2000.team-a.MAC';

test("a sandbox's cookie is scoped to the link it came through, never the whole origin", () => {
  assert.equal(scopeCookie('session=x; Path=/', P), `session=x; Path=${P}/`);
  assert.equal(scopeCookie('session=x', P), `session=x; Path=${P}/`);
  assert.equal(scopeCookie('a=1; path=/app/; HttpOnly; SameSite=Lax', P), `a=1; Path=${P}/app/; HttpOnly; SameSite=Lax`);
  assert.equal(scopeCookie('a=1; Domain=127.0.0.1; Max-Age=60', `${P}/`), `a=1; Path=${P}/; Max-Age=60`, 'Domain dropped');
  assert.equal(scopeCookie('a=1; Path=relative', P), `a=1; Path=${P}/relative`);
});

test('the answer loses hop-by-hop headers, Service-Worker-Allowed and dsec* cookies; other cookies are scoped', () => {
  const out = responseHeaders(
    [
      'Content-Type',
      'text/html',
      'Connection',
      'close',
      'Service-Worker-Allowed',
      '/',
      'Set-Cookie',
      'dsec_key=1; Path=/',
      'set-cookie',
      'DSEC=1',
      'Set-Cookie',
      'app=1; Path=/',
    ],
    P,
  );
  assert.deepEqual(out, ['Content-Type', 'text/html', 'Set-Cookie', `app=1; Path=${P}/`]);
});
