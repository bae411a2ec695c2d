/**
 * Writing stdin to, signalling and killing a background process change the sandbox: each must be in
 * the trajectory, and a replay must do it again on the new sandbox's own processes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Sandbox } from '@dsec/sdk';
import type { RunningDsec } from '../../src/runtime/all-in-one.js';
import { assertCleanAndRemove, integrationSkipReason, makeDataDir, newEdgeId, startDsec } from '../helpers/server.js';
import { call } from '../helpers/wire.js';

const skip = integrationSkipReason();
const conn = (d: RunningDsec) => ({ url: d.url, apiKey: d.apiKey });

describe('background process stdin and signals are in the trajectory', { skip, timeout: 180_000 }, () => {
  const edgeId = newEdgeId();
  let dataDir = '';
  let dsec: RunningDsec | undefined;
  let id = '';

  before(async () => {
    dataDir = makeDataDir();
    dsec = await startDsec(dataDir, { edgeId });
    id = (await Sandbox.create({ ...conn(dsec) })).id;
  });
  after(async () => {
    await dsec?.close({ killAll: true });
    if (dataDir) await assertCleanAndRemove(dataDir, edgeId);
  });

  test('stdin, a signal and a kill are each logged', async () => {
    const c = conn(dsec!);
    const cat = await call(c, 'POST', `/v1/sandboxes/${id}/processes`, { json: { cmd: 'cat > /tmp/in.txt', stdin: true } });
    assert.equal(cat.status, 201, cat.text);
    const catId = (cat.json as { id: string }).id;
    const w = await call(c, 'POST', `/v1/sandboxes/${id}/processes/${catId}/stdin?eof=true`, { body: 'from stdin\n' });
    assert.equal(w.status, 204, w.text);
    await call(c, 'POST', `/v1/sandboxes/${id}/processes/${catId}/wait`, { json: { timeoutMs: 30_000 } });
    const sleeper = (await call(c, 'POST', `/v1/sandboxes/${id}/processes`, { json: { cmd: ['sleep', '1000'] } })).json as { id: string };
    const sig = await call(c, 'POST', `/v1/sandboxes/${id}/processes/${sleeper.id}/signal`, { json: { signal: 'SIGTERM' } });
    assert.equal(sig.status, 200, sig.text);
    const other = (await call(c, 'POST', `/v1/sandboxes/${id}/processes`, { json: { cmd: ['sleep', '1001'] } })).json as { id: string };
    const del = await call(c, 'DELETE', `/v1/sandboxes/${id}/processes/${other.id}`);
    assert.equal(del.status, 200, del.text);
    const log = (await call(c, 'GET', `/v1/sandboxes/${id}/trajectory`)).json as {
      entries: { kind: string; request: Record<string, unknown> }[];
    };
    const kinds = log.entries.map((e) => e.kind);
    assert.deepEqual(kinds, ['process.start', 'process.stdin', 'process.start', 'process.signal', 'process.start', 'process.signal']);
    assert.deepEqual(log.entries[1]!.request, { processId: catId, bytes: 11, eof: true });
    assert.deepEqual(log.entries[3]!.request, { processId: sleeper.id, signal: 'SIGTERM' });
    assert.deepEqual(log.entries[5]!.request, { processId: other.id, signal: 'SIGKILL' });
  });

  test('a replay writes the logged stdin and sends the logged signals', async () => {
    const c = conn(dsec!);
    const res = await call(c, 'POST', `/v1/sandboxes/${id}/replay`, { json: {} });
    assert.equal(res.status, 201, res.text);
    const r = res.json as { sandbox: { id: string }; steps: { kind: string; diverged: boolean; error?: string }[] };
    assert.deepEqual(
      r.steps.filter((s) => s.diverged),
      [],
    );
    const copy = await Sandbox.connect(r.sandbox.id, c);
    // cat reads the replayed stdin up to its EOF and exits: the file is whole once it is gone.
    const procs = (await call(c, 'GET', `/v1/sandboxes/${copy.id}/processes`)).json as { processes: { id: string; cmd: unknown }[] };
    for (const p of procs.processes)
      await call(c, 'POST', `/v1/sandboxes/${copy.id}/processes/${p.id}/wait`, { json: { timeoutMs: 30_000 } });
    assert.equal(new TextDecoder().decode(await copy.files.read('/tmp/in.txt')), 'from stdin\n');
    const after = (await call(c, 'GET', `/v1/sandboxes/${copy.id}/processes`)).json as { processes: { status: string }[] };
    assert.deepEqual(
      after.processes.map((p) => p.status),
      ['exited', 'exited', 'exited'],
    );
    await copy.kill();
  });
});
