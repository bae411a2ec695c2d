// One round of the TypeScript side of python/bench/exec_p50.py: `n` execs of `cmd` through the
// TS SDK (`sdk`) or a bare fetch loop (`raw`), after `warm` untimed ones; prints the latencies
// (ms) as JSON. Node's start-up is outside the timed loop.
import { Sandbox } from '@dsec/sdk';

const [mode, url, apiKey, id, n, warm, cmd] = process.argv.slice(2);
const lat = [];
if (mode === 'sdk') {
  const sb = await Sandbox.connect(id, { url, apiKey });
  for (let i = 0; i < Number(warm) + Number(n); i++) {
    const t = performance.now();
    const r = await sb.commands.run(cmd);
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
    if (i >= Number(warm)) lat.push(performance.now() - t);
  }
} else {
  const body = JSON.stringify({ cmd });
  const headers = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };
  for (let i = 0; i < Number(warm) + Number(n); i++) {
    const t = performance.now();
    const res = await fetch(`${url}/v1/sandboxes/${id}/exec`, { method: 'POST', headers, body });
    const r = await res.json();
    if (r.exitCode !== 0) throw new Error(`exit ${r.exitCode}`);
    if (i >= Number(warm)) lat.push(performance.now() - t);
  }
}
process.stdout.write(JSON.stringify(lat));
