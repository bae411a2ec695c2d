// The sixteenth stop (issue-less: the red team's F1): the RSS high-water mark of dsec's control
// plane and edge (one process, as `dsec up`) across N buffered execs at once of 2 x M MiB of output
// each, maxOutputBytes M MiB; the client is curl, in its own process. Run as root from anywhere:
//   node bench/results/output-budget/execmem.mjs M N
// 2026-12-07: `64 1` +761 MiB; `64 4` +1,358 MiB; `64 5` the fifth 503 OUTPUT_BUDGET_EXCEEDED.
import { startTestServer } from '../../../packages/dsec/dist/test/helpers/server.js';
import { Sandbox } from '../../../packages/sdk/dist/index.js';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
const mib = Number(process.argv[2] ?? 64),
  n = Number(process.argv[3] ?? 1);
const hwm = () => Number(/VmHWM:\s+(\d+)/.exec(readFileSync('/proc/self/status', 'utf8'))[1]) / 1024;
const rss = () => process.memoryUsage().rss / 2 ** 20;
const scratch = mkdtempSync(join(tmpdir(), 'execmem-'));
const bodyFile = join(scratch, 'body.json');
const server = await startTestServer();
try {
  const sb = await Sandbox.create({ ...server.conn, resources: { memoryMiB: 256 } });
  globalThis.gc?.();
  writeFileSync('/proc/self/clear_refs', '5'); // reset VmHWM
  const before = rss();
  const body = JSON.stringify({
    cmd: ['sh', '-c', `head -c ${mib << 20} /dev/zero | tr '\\0' a; head -c ${mib << 20} /dev/zero | tr '\\0' b >&2`],
    maxOutputBytes: mib << 20,
  });
  writeFileSync(bodyFile, body);
  const { spawn } = await import('node:child_process');
  const runs = [];
  for (let i = 0; i < n; i++)
    runs.push(
      new Promise((res) => {
        const c = spawn('curl', [
          '-s',
          '-o',
          '/dev/null',
          '-w',
          '%{http_code} %{size_download}\n',
          '-H',
          `authorization: Bearer ${server.apiKey}`,
          '-H',
          'content-type: application/json',
          '--data-binary',
          `@${bodyFile}`,
          `${server.url}/v1/sandboxes/${sb.id}/exec`,
        ]);
        let out = '';
        c.stdout.on('data', (d) => (out += d));
        c.on('close', () => res(out.trim()));
      }),
    );
  const results = await Promise.all(runs);
  console.log(
    `${n} x exec of 2 x ${mib} MiB: ${results.join(', ')}; rss before ${before.toFixed(0)} MiB, high-water ${hwm().toFixed(0)} MiB (+${(hwm() - before).toFixed(0)}), after ${rss().toFixed(0)} MiB`,
  );
  await sb.kill();
} finally {
  await server.close();
  rmSync(scratch, { recursive: true, force: true });
}
