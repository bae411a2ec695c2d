import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { AgentClient, newAgentKey } from './agent-client.js';
import { FrameDecoder, type AgentFrame, type AgentHeader } from './agent-frames.js';

/** A frame as vm-agent.c's send_frame writes it: with a key, `{"mac":"<hex>",` before the rest of the header. */
function agentFrame(header: AgentHeader, payload = Buffer.alloc(0), key?: string): Buffer {
  let h = JSON.stringify(header);
  if (key) {
    const mac = createHmac('sha256', Buffer.from(key, 'hex')).update(h).update(payload).digest('hex');
    h = `{"mac":"${mac}",${h.slice(1)}`;
  }
  const pre = Buffer.alloc(8);
  pre.writeUInt32BE(Buffer.byteLength(h), 0);
  pre.writeUInt32BE(payload.length, 4);
  return Buffer.concat([pre, Buffer.from(h), payload]);
}

/** The guest's end of the channel, played by the test: what the edge sent, and a way to answer. */
class FakeGuest {
  readonly requests: AgentFrame[] = [];
  #socket: Socket | undefined;
  #waiters: (() => void)[] = [];

  attach(s: Socket): void {
    this.#socket = s;
    const d = new FrameDecoder();
    s.on('data', (c: Buffer) => {
      this.requests.push(...d.push(c));
      for (const w of this.#waiters.splice(0)) w();
    });
    s.on('error', () => undefined);
  }

  async request(op: string): Promise<AgentFrame> {
    return (await this.requestsOf(op, 1))[0]!;
  }

  /** The first `n` requests of `op`, once they came. */
  async requestsOf(op: string, n: number): Promise<AgentFrame[]> {
    for (;;) {
      const r = this.requests.filter((f) => f.header['op'] === op);
      if (r.length >= n) return r.slice(0, n);
      await new Promise<void>((res) => this.#waiters.push(res));
    }
  }

  write(b: Buffer): void {
    this.#socket!.write(b);
  }
}

describe('AgentClient: only frames the guest agent wrote for the request are taken', () => {
  let dir: string;
  let server: Server;
  let guest: FakeGuest;
  let connected: Promise<void>;

  before(() => {
    dir = mkdtempSync(join(tmpdir(), 'dsec-agent-client-'));
  });
  after(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  /** A client on a fresh fake guest; with `key`, as for an adopted VM (the guest has it already). */
  async function open(key?: string): Promise<AgentClient> {
    guest = new FakeGuest();
    const path = join(dir, `s${Math.random().toString(36).slice(2)}.sock`);
    server = createServer((s) => guest.attach(s));
    connected = new Promise((r) => server.once('connection', () => r()));
    await new Promise<void>((r) => server.listen(path, r));
    const c = await AgentClient.open(path, key);
    await connected;
    return c;
  }

  async function booted(): Promise<{ client: AgentClient; key: string }> {
    const client = await open();
    const key = newAgentKey();
    const ready = client.ready();
    guest.write(agentFrame({ id: 0, ev: 'ready' }));
    await ready;
    const given = client.giveKey(key);
    const req = await guest.request('key');
    assert.equal(req.header['key'], key);
    assert.match(String(req.header['nonce']), /^[0-9a-f]{32}$/);
    guest.write(agentFrame({ id: req.header.id, nonce: req.header['nonce'], ev: 'ok' }, undefined, key));
    await given;
    return { client, key };
  }

  test("each request carries a fresh 128-bit nonce; an answer with the key's MAC and that nonce is taken", async () => {
    const { client, key } = await booted();
    try {
      const p = client.call('ping', {});
      const a = client.call('ping', {});
      const [r1, r2] = (await guest.requestsOf('ping', 2)) as [AgentFrame, AgentFrame];
      assert.notEqual(r1.header['nonce'], r2.header['nonce']);
      for (const r of [r1, r2]) guest.write(agentFrame({ id: r.header.id, nonce: r.header['nonce'], ev: 'ok' }, undefined, key));
      await Promise.all([p, a]);
      assert.equal(client.refusedFrames, 0);
    } finally {
      client.close();
      server.close();
    }
  });

  test("an event that does not repeat its request's nonce is dropped, and the request goes on to its own events", async () => {
    const { client, key } = await booted();
    try {
      const seen: string[] = [];
      let done!: () => void;
      const exited = new Promise<void>((r) => (done = r));
      const id = client.send('exec', { argv: ['true'] }, undefined, (f) => {
        seen.push(`${String(f.header['ev'])}:${f.payload.toString()}:${String(f.header['code'] ?? '')}`);
        if (f.header['ev'] === 'exit') done();
      });
      const req = await guest.request('exec');
      assert.equal(req.header.id, id);
      const nonce = String(req.header['nonce']);
      guest.write(agentFrame({ id, nonce: 'f'.repeat(32), ev: 'stdout' }, Buffer.from('ALL TESTS PASSED\n'), key));
      guest.write(agentFrame({ id, ev: 'exit', code: 0 }, undefined, key));
      guest.write(agentFrame({ id, nonce, ev: 'stdout' }, Buffer.from('FAIL\n'), key));
      guest.write(agentFrame({ id, nonce, ev: 'exit', code: 1 }, undefined, key));
      await exited;
      assert.deepEqual(seen, ['stdout:FAIL\n:', 'exit::1']);
      assert.equal(client.refusedFrames, 2);
      assert.equal(client.closed, undefined, 'a frame the agent wrote with a stale nonce does not end the channel');
    } finally {
      client.close();
      server.close();
    }
  });

  test('a frame without the MAC of the channel key fails the channel: what waits hears why, and takes nothing from the frame', async () => {
    const { client, key } = await booted();
    try {
      const seen: string[] = [];
      let done!: (f: AgentFrame) => void;
      const ended = new Promise<AgentFrame>((r) => (done = r));
      const id = client.send('exec', { argv: ['true'] }, undefined, (f) => {
        seen.push(String(f.header['ev']));
        if (f.header['ev'] === 'exit' || f.header['ev'] === 'closed') done(f);
      });
      const pending = client.call('stat', { path: '/' });
      const req = await guest.request('exec');
      const nonce = String(req.header['nonce']);
      const reasons: string[] = [];
      client.onRefused((reason) => reasons.push(reason));
      // What a process in the guest with the port (and the nonce, say) but not the key writes:
      guest.write(agentFrame({ id, nonce, ev: 'stdout' }, Buffer.from('ALL TESTS PASSED\n')));
      guest.write(agentFrame({ id, nonce, ev: 'exit', code: 0 }, undefined, newAgentKey()));
      const end = await ended;
      assert.equal(end.header['ev'], 'closed');
      assert.match(String(end.header['message']), /refused a frame \(id \d+, stdout\) without the MAC/);
      assert.deepEqual(seen, ['closed']);
      await assert.rejects(pending, /refused a frame/);
      assert.equal(client.refusedFrames, 1);
      assert.equal(reasons.length, 1);
      assert.ok(client.closed);
      assert.equal(key.length, 64);
    } finally {
      client.close();
      server.close();
    }
  });

  test("a frame whose payload was changed after the agent's MAC is refused", async () => {
    const { client, key } = await booted();
    try {
      const call = client.call('read', { path: '/etc/hostname' });
      const req = await guest.request('read');
      const good = agentFrame({ id: req.header.id, nonce: req.header['nonce'], ev: 'data' }, Buffer.from('sandbox\n'), key);
      good.writeUInt8(good.readUInt8(good.length - 2) ^ 1, good.length - 2);
      guest.write(good);
      await assert.rejects(call, /without the MAC/);
    } finally {
      client.close();
      server.close();
    }
  });

  test("before the key only the guest's own ready is taken; a client opened with the key takes nothing without it", async () => {
    const fresh = await open();
    try {
      guest.write(agentFrame({ id: 7, ev: 'exit', code: 0 }));
      await new Promise((r) => setTimeout(r, 50));
      assert.match(fresh.closed?.message ?? '', /before the channel had its key/);
    } finally {
      fresh.close();
      server.close();
    }
    const key = newAgentKey();
    const adopted = await open(key);
    try {
      const ping = adopted.call('ping', {});
      const req = await guest.request('ping');
      guest.write(agentFrame({ id: req.header.id, nonce: req.header['nonce'], ev: 'ok' })); // an agent without the key (an older guest)
      await assert.rejects(ping, /without the MAC/);
    } finally {
      adopted.close();
      server.close();
    }
  });
});
