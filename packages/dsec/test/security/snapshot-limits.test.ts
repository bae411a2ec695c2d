/**
 * Red team, snapshots without limits (issue 10, Medium 4): a 4 TiB sparse file kept mkfs.erofs
 * at a full core with no end, after the client left and after the sandbox was killed. Here it is
 * refused with 413 before anything is packed, leaving no staging dir or blob, and the sandbox
 * goes on. (Not run against the old code: it would keep a core of the shared host busy for good.)
 * And a snapshot whose caller hangs up stops where it is, in the copy or in mkfs.erofs: nothing
 * is left staged or packed and no image is registered for nobody.
 */
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
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

  /** mkfs.erofs processes on the host writing into this server's tmp dir. */
  function packers(): number[] {
    const out: number[] = [];
    for (const pid of readdirSync('/proc').filter((n) => /^\d+$/.test(n))) {
      try {
        const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        if (argv[0]?.endsWith('mkfs.erofs') && argv.some((a) => a.startsWith(tmp))) out.push(Number(pid));
      } catch {
        // exited meanwhile
      }
    }
    return out;
  }

  async function until(check: () => boolean, tries = 3000): Promise<boolean> {
    for (let i = 0; i < tries; i++) {
      if (check()) return true;
      await new Promise((r) => setTimeout(r, 20));
    }
    return false;
  }

  for (const phase of ['copy', 'pack'] as const) {
    test(`a caller that hangs up during the ${phase === 'copy' ? 'copy of the upper dir' : 'mkfs.erofs of the layer'} stops the snapshot: nothing staged, packed or registered`, async () => {
      const sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 128 } });
      // Enough bytes that both phases take seconds: the test hangs up once it sees the phase.
      await must(server, sb, 'for i in 1 2 3 4 5 6; do dd if=/dev/urandom of=/tmp/big$i bs=1M count=256 2>/dev/null; done; du -sm /tmp');
      const imagesBefore = (
        (await (await fetch(`${server.url}/v1/images`, { headers: { authorization: `Bearer ${server.apiKey}` } })).json()) as {
          images: unknown[];
        }
      ).images.length;
      const ctrl = new AbortController();
      const req = fetch(`${server.url}/v1/sandboxes/${sb.id}/snapshot`, {
        method: 'POST',
        headers: { authorization: `Bearer ${server.apiKey}`, 'content-type': 'application/json' },
        body: '{}',
        signal: ctrl.signal,
      }).catch((err: Error) => err);
      const seen = phase === 'copy' ? () => staged().some((n) => n.startsWith('snap-')) : () => packers().length > 0;
      assert.ok(await until(seen), `the snapshot reached its ${phase} phase`);
      ctrl.abort();
      assert.ok((await req) instanceof Error, 'the request was aborted before it answered');
      assert.ok(
        await until(() => staged().length === 0 && packers().length === 0),
        `nothing left: ${JSON.stringify({ staged: staged(), packers: packers() })}`,
      );
      const imagesAfter = (
        (await (await fetch(`${server.url}/v1/images`, { headers: { authorization: `Bearer ${server.apiKey}` } })).json()) as {
          images: unknown[];
        }
      ).images.length;
      assert.equal(imagesAfter, imagesBefore, 'no image was registered for the caller that left');
      assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n', 'the sandbox is thawed and answers');
      await sb.kill();
    });
  }

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
