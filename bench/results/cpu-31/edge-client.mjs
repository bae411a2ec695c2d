// The control plane's CPU per JSON call to an edge, by HTTP client: node:http with a keep-alive
// agent (what http-edge-client.ts uses) against fetch (what its file reads and writes used before
// the twelfth stop) and undici's Pool. A plain node:http server in a child
// process answers a group create's size of JSON; 6 calls in flight on kept-alive loopback
// connections, as the control plane keeps a few groups out per edge.
//   node bench/results/cpu-31/edge-client.mjs [calls=20000] [rounds=3]
// Prints the caller's CPU (user + system) per call, each client in turn, after 5,000 calls of warm-up.
// The twelfth stop measured node:http 73-95 µs, fetch 340-352, undici 39-56, moved file reads,
// writes and stdin from fetch to node:http, and kept node:http rather than undici: importing
// undici 7 into the control plane makes its Agent the global dispatcher of Node 20's own fetch (an
// undici 6), which then refused registry uploads with a streamed body (UND_ERR_INVALID_ARG), and
// `dsec bench cluster` showed no difference above its noise (groups carry ~10 creates per call).
import { fork } from 'node:child_process';
import http from 'node:http';
import { Pool } from 'undici';

if (process.argv[2] === 'serve') {
  const answer = JSON.stringify({
    results: Array.from({ length: 8 }, (_, i) => ({ id: `sb-${i}`, sandbox: { id: `sb-${i}`, status: 'running', edge: 'e1' } })),
  });
  const server = http.createServer((req, res) => {
    req.resume();
    req.on('end', () =>
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) }).end(answer),
    );
  });
  server.listen(0, '127.0.0.1', () => process.send(server.address().port));
} else {
  const calls = Number(process.argv[2] ?? 20000);
  const rounds = Number(process.argv[3] ?? 3);
  const child = fork(new URL(import.meta.url).pathname, ['serve']);
  const port = await new Promise((resolve) => child.once('message', resolve));
  const body = Buffer.from(
    JSON.stringify({
      sandboxes: Array.from({ length: 3 }, (_, i) => ({
        id: `sb-${i}`,
        layers: ['a'.repeat(64)],
        config: { env: [] },
        env: {},
        limits: { cpu: 0.1, memoryMiB: 64 },
      })),
    }),
  );
  const headers = { authorization: 'Bearer x', 'content-type': 'application/json', 'x-request-id': 'req-1' };
  const agent = new http.Agent({ keepAlive: true });
  const pool = new Pool(`http://127.0.0.1:${port}`, { headersTimeout: 0, bodyTimeout: 0 });
  const clients = {
    'node:http': () =>
      new Promise((resolve, reject) => {
        const req = http.request(
          {
            hostname: '127.0.0.1',
            port,
            method: 'POST',
            path: '/v1/edge/sandboxes/group',
            agent,
            headers: { ...headers, 'content-length': body.length },
          },
          (res) => {
            const chunks = [];
            res.on('data', (c) => chunks.push(c));
            res.on('end', () => resolve(JSON.parse(Buffer.concat(chunks).toString('utf8'))));
            res.on('error', reject);
          },
        );
        req.on('error', reject);
        req.end(body);
      }),
    fetch: async () => {
      const res = await fetch(`http://127.0.0.1:${port}/v1/edge/sandboxes/group`, { method: 'POST', headers, body });
      return res.json();
    },
    undici: async () => {
      const res = await pool.request({ method: 'POST', path: '/v1/edge/sandboxes/group', headers, body });
      return JSON.parse(await res.body.text());
    },
  };
  const run = async (call, n) => {
    let i = 0;
    await Promise.all(
      Array.from({ length: 6 }, async () => {
        while (i++ < n) await call();
      }),
    );
  };
  for (let r = 0; r < rounds; r++) {
    for (const [name, call] of Object.entries(clients)) {
      await run(call, 5000);
      const c0 = process.cpuUsage();
      await run(call, calls);
      const c = process.cpuUsage(c0);
      console.log(`${name}: ${((c.user + c.system) / calls).toFixed(1)} µs of the caller's CPU per call`);
    }
  }
  agent.destroy();
  await pool.close();
  child.kill();
}
