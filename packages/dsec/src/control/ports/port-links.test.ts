import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PortLinks } from './port-links.js';

const claims = { sandbox: 'sb-e1-abcdef', port: 8000, expires: 2000, project: 'team-a' };

test('a port link verifies with its claims until it expires, and only under its own key', () => {
  const links = new PortLinks('dsecjoin_a');
  const token = links.sign(claims);
  assert.deepEqual(links.verify(token, 1999), claims);
  assert.equal(links.verify(token, 2001), undefined, 'expired');
  assert.equal(new PortLinks('dsecjoin_b').verify(token, 1999), undefined, 'another cluster');
});

test('a port link whose claims were changed (port, expiry, project), or that is malformed, does not verify', () => {
  const links = new PortLinks('dsecjoin_a');
  const token = links.sign(claims);
  const mac = token.split('.').pop()!;
  for (const forged of [`sb-e1-abcdef.22.2000.team-a.${mac}`, `sb-e1-abcdef.8000.2000.team-b.${mac}`, `sb-e1-abcdef.8000.2000.${mac}`])
    assert.equal(links.verify(forged, 1000), undefined, forged);
  for (const bad of ['', '.', 'abc', `${token}x`, token.replace('.', ''), token.replace('.2000.', '.99999.')])
    assert.equal(links.verify(bad, 1000), undefined, bad);
});
