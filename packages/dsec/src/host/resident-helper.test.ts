import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ResidentHelper, type DecodedAnswer, type HelperFraming } from './resident-helper.js';

class EchoError extends Error {
  override readonly name = 'EchoError';
}

/** `<id> <length>\n<bytes>` each way: `cat` as the helper sends every request back as its answer. */
function decodeEcho(buf: Buffer, withId: boolean): DecodedAnswer<string> | 'incomplete' | 'garbled' {
  const nl = buf.indexOf(10);
  if (nl < 0) return 'incomplete';
  const m = /^(\d+) (\d+)$/.exec(buf.subarray(0, nl).toString('latin1'));
  if (!m) return 'garbled';
  const len = Number(m[2]);
  if (buf.length < nl + 1 + len) return 'incomplete';
  const answer = buf.subarray(nl + 1, nl + 1 + len).toString('utf8');
  return withId ? { size: nl + 1 + len, id: Number(m[1]), answer } : { size: nl + 1 + len, answer };
}

const framing = (withId: boolean): HelperFraming<string> => ({
  name: 'echo',
  error: (m) => new EchoError(m),
  decode: (b) => decodeEcho(b, withId),
});
const frame = (id: number, text: string): string[] => [`${id} ${Buffer.byteLength(text)}\n`, text];

describe('ResidentHelper: the process, pending requests and failures shared by dsec-spawn and dsec-nft', () => {
  test('answers that carry an id reach their own request, whatever the order; answers without reach the oldest', async () => {
    for (const withId of [true, false]) {
      const helper = new ResidentHelper('cat', framing(withId));
      try {
        // Ids given to the helper that differ from the request's own: with ids, the answers swap places.
        const a = helper.request((id) => frame(withId ? id + 1 : id, 'first'));
        const b = helper.request((id) => frame(withId ? id - 1 : id, 'second\nline'));
        assert.deepEqual(await Promise.all([a, b]), withId ? ['second\nline', 'first'] : ['first', 'second\nline']);
        // An answer split over many writes is put back together.
        const big = 'x'.repeat(300_000);
        assert.equal(await helper.request((id) => frame(id, big)), big);
      } finally {
        await helper.close();
      }
    }
  });

  test('a helper that dies fails the requests in flight with its stderr, and the next request starts a new one', async () => {
    // sh reading its script from stdin: a request is a command, and `exit` is the helper dying.
    const helper = new ResidentHelper('sh', framing(true));
    try {
      const inFlight = helper.request(() => ['echo "it broke" >&2; exit 3\n']);
      const first = helper.pid;
      await assert.rejects(inFlight, (err: unknown) => err instanceof EchoError && err.message === 'echo exited (3): it broke');
      assert.equal(await helper.request((id) => [`printf '${id} 5\\nagain'\n`]), 'again');
      assert.ok(helper.pid && helper.pid !== first, 'a new helper serves the next request');
    } finally {
      await helper.close();
    }
  });

  test('an answer that cannot be read kills the helper (out of step) and fails what is pending', async () => {
    const helper = new ResidentHelper('sh', framing(true));
    try {
      // `exec`: the helper itself waits, so the kill ends it. A child sleep would outlive the
      // killed shell holding its stdout, and keep this test file's process alive for 100 s.
      const pending = helper.request(() => ['echo not-a-header; exec sleep 100\n']);
      await assert.rejects(pending, (err: unknown) => err instanceof EchoError && /echo exited \(SIGKILL\)/.test(err.message));
    } finally {
      await helper.close();
    }
  });

  test('a helper that cannot start fails its requests with why, not a hang', async () => {
    const helper = new ResidentHelper('/no/such/helper', framing(true));
    await assert.rejects(
      helper.request((id) => frame(id, 'x')),
      (err: unknown) =>
        err instanceof EchoError && /echo could not run \(spawn \/no\/such\/helper ENOENT.*run scripts\/setup/.test(err.message),
    );
    await helper.close();
  });

  test('close() ends the helper (its stdin closes) and a later request starts another', async () => {
    const helper = new ResidentHelper('cat', framing(true));
    assert.equal(await helper.request((id) => frame(id, 'one')), 'one');
    const pid = helper.pid;
    assert.ok(pid);
    await helper.close();
    assert.equal(helper.pid, undefined);
    assert.equal(await helper.request((id) => frame(id, 'two')), 'two');
    assert.notEqual(helper.pid, pid);
    await helper.close();
  });
});
