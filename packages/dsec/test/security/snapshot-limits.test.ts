/**
 * Red team, snapshots without limits (issue 10, Medium 4): a 4 TiB sparse file kept mkfs.erofs
 * at a full core with no end, after the client left and after the sandbox was killed. Here it is
 * refused with 413 before anything is packed, leaving no staging dir or blob, and the sandbox
 * goes on. (Not run against the old code: it would keep a core of the shared host busy for good.)
 */
import assert from 'node:assert/strict';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import { integrationSkipReason, startTestServer, type TestServer } from '../helpers/server.js';
import { call, expectWireError } from '../helpers/wire.js';
import { must } from './support/harness.js';

describe('red team: snapshot limits', { skip: integrationSkipReason(), timeout: 300_000 }, () => {
  let server: TestServer;
  let tmp: string;

  before(async () => {
    server = await startTestServer();
    tmp = join(server.dataDir, 'node', 'tmp');
  });
  after(async () => {
    await server?.close();
  });

  const staged = (): string[] => readdirSync(tmp).filter((n) => n.startsWith('snap-') || n.startsWith('layer-'));

  test('a 4 TiB sparse file: 413 naming the limit, nothing staged or packed, the sandbox unharmed', async () => {
    const sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 64 } });
    await must(server, sb, 'truncate -s 4398046511104 /tmp/huge && ls -ls /tmp/huge');
    const res = await call(server.conn, 'POST', `/v1/sandboxes/${sb.id}/snapshot`, { json: {} });
    const err = expectWireError(res, 413, 'PAYLOAD_TOO_LARGE');
    assert.match(err.message, /exceed/, err.message);
    assert.deepEqual(staged(), []);
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
    await sb.kill();
  });
});
