/**
 * The load a restart test leaves standing while dsec restarts: N live sandboxes, each with a file
 * of its own, some paused, some with an open shell session (cwd and a variable set), some with a
 * background process, some with a network policy (a link to the host). After a restart `verify`
 * asks the API about every one of them and lists what is wrong: a sandbox missing or not in its
 * state, its file changed, a command that does not run, a network policy or address gone, and a
 * session or process that is neither alive nor reported as ended with a reason.
 */
import type { NetworkPolicyState, ProcessOutput, SandboxInfo, SessionInfo } from '@dsec/sdk/schema';

export interface Conn {
  url: string;
  apiKey: string;
}

export interface Planted {
  id: string;
  index: number;
  paused: boolean;
  sessionId?: string;
  processId?: string;
  network?: NetworkPolicyState;
}

/** An answer's body as the checks read it: an exec result or an error, else anything. */
export type Body = { stdout?: string; error?: { code?: string; message?: string } } & Record<string, unknown>;

export async function api(
  conn: Conn,
  method: string,
  path: string,
  json?: unknown,
  timeoutMs = 120_000,
): Promise<{ status: number; body: Body }> {
  const res = await fetch(conn.url + path, {
    method,
    headers: { authorization: `Bearer ${conn.apiKey}`, ...(json !== undefined ? { 'content-type': 'application/json' } : {}) },
    ...(json !== undefined ? { body: JSON.stringify(json) } : {}),
    signal: AbortSignal.timeout(timeoutMs),
  });
  const text = await res.text();
  let body: Body = {};
  try {
    if (text) body = JSON.parse(text) as Body;
  } catch {
    body = { text }; // not JSON: kept for the message
  }
  return { status: res.status, body };
}

async function ok(conn: Conn, method: string, path: string, json?: unknown): Promise<unknown> {
  const r = await api(conn, method, path, json);
  if (r.status >= 300) throw new Error(`${method} ${path}: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

/** Runs `work` over 0..n-1, `concurrency` at a time. */
export async function pool(n: number, concurrency: number, work: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, n) }, async () => {
      while (next < n) await work(next++);
    }),
  );
}

const fileText = (p: Planted): string => `sandbox ${p.index} ${p.id}\n`;

/**
 * Creates and shapes `n` sandboxes. Kinds rotate by index: 0 plain, 1 paused, 2 a session,
 * 3 a background process; every 5th (index 4, 9, …) also has an open network policy.
 */
export async function plant(conn: Conn, n: number, concurrency: number, label: string): Promise<Planted[]> {
  const out: Planted[] = [];
  await pool(n, concurrency, async (index) => {
    const withNet = index % 5 === 4;
    const sb = (await ok(conn, 'POST', '/v1/sandboxes', {
      image: 'busybox',
      labels: { restart: label, i: String(index) },
      ...(withNet ? { network: { mode: 'open' } } : {}),
    })) as SandboxInfo;
    const p: Planted = { id: sb.id, index, paused: false };
    out.push(p);
    await ok(conn, 'POST', `/v1/sandboxes/${sb.id}/exec`, { cmd: ['sh', '-c', `printf '%s' "$0" > /planted.txt`, fileText(p)] });
    if (withNet) p.network = (await ok(conn, 'GET', `/v1/sandboxes/${sb.id}/network`)) as NetworkPolicyState;
    const kind = index % 4;
    if (kind === 2) {
      const s = (await ok(conn, 'POST', `/v1/sandboxes/${sb.id}/sessions`, {})) as SessionInfo;
      await ok(conn, 'POST', `/v1/sandboxes/${sb.id}/sessions/${s.id}/exec`, { cmd: `cd /tmp && V=${index}` });
      p.sessionId = s.id;
    } else if (kind === 3) {
      const proc = (await ok(conn, 'POST', `/v1/sandboxes/${sb.id}/processes`, {
        cmd: ['sh', '-c', `echo started ${index}; exec sleep 86400`],
      })) as { id: string };
      p.processId = proc.id;
    } else if (kind === 1) {
      await ok(conn, 'POST', `/v1/sandboxes/${sb.id}/pause`);
      p.paused = true;
    }
  });
  return out.sort((a, b) => a.index - b.index);
}

/**
 * What the API says about every planted sandbox after a restart, as a list of problems (empty
 * when all is well). `edgeRestarted`: the edge process ended, so sessions and background
 * processes (their state and pipes live in the edge) must be reported as ended with a reason;
 * otherwise they must still be alive and work.
 */
export async function verify(conn: Conn, planted: Planted[], opts: { edgeRestarted: boolean; concurrency: number }): Promise<string[]> {
  const problems: string[] = [];
  const list = ((await ok(conn, 'GET', '/v1/sandboxes')) as { sandboxes: SandboxInfo[] }).sandboxes;
  const byId = new Map(list.map((s) => [s.id, s]));
  await pool(planted.length, opts.concurrency, async (k) => {
    const p = planted[k]!;
    const bad = (what: string) => problems.push(`${p.id} (#${p.index}): ${what}`);
    const sb = byId.get(p.id);
    if (!sb) return void bad('missing from the sandbox list');
    const want = p.paused ? 'paused' : 'running';
    if (sb.status !== want) return void bad(`status ${sb.status} (${sb.reason ?? 'no reason'}), expected ${want}`);
    // A paused sandbox runs no command: its policy is read from the API now, its file and address once resumed, at the end.
    problems.push(...(await verifyNetwork(conn, p, { inside: !p.paused })));
    if (p.paused) return;
    const r = await api(conn, 'POST', `/v1/sandboxes/${p.id}/exec`, { cmd: ['cat', '/planted.txt'] });
    if (r.status !== 200) return void bad(`exec answers ${r.status} ${JSON.stringify(r.body)}`);
    if (r.body.stdout !== fileText(p)) bad(`its file reads ${JSON.stringify(r.body.stdout)}`);
    if (p.sessionId) problems.push(...(await verifySession(conn, p, opts.edgeRestarted)));
    if (p.processId) problems.push(...(await verifyProcess(conn, p, opts.edgeRestarted)));
  });
  return problems.sort();
}

/** The policy and the link-local address it had, in the API and (`inside`) in the sandbox's `ip addr`. */
async function verifyNetwork(conn: Conn, p: Planted, opts: { inside: boolean } = { inside: true }): Promise<string[]> {
  if (!p.network) return [];
  const out: string[] = [];
  const r = await api(conn, 'GET', `/v1/sandboxes/${p.id}/network`);
  const net = r.body as NetworkPolicyState | undefined;
  if (r.status !== 200 || net?.mode !== p.network.mode || net.address !== p.network.address)
    out.push(`${p.id} (#${p.index}): network ${JSON.stringify(r.body)}, was ${JSON.stringify(p.network)}`);
  if (!opts.inside) return out;
  const ip = await api(conn, 'POST', `/v1/sandboxes/${p.id}/exec`, { cmd: ['ip', '-4', '-o', 'addr', 'show'] });
  if (!String(ip.body?.stdout).includes(`${p.network.address}/`))
    out.push(`${p.id} (#${p.index}): its address ${p.network.address} is gone: ${JSON.stringify(ip.body)}`);
  return out;
}

async function verifySession(conn: Conn, p: Planted, edgeRestarted: boolean): Promise<string[]> {
  const out: string[] = [];
  const bad = (what: string) => out.push(`${p.id} (#${p.index}) session ${p.sessionId}: ${what}`);
  const sessions = ((await ok(conn, 'GET', `/v1/sandboxes/${p.id}/sessions`)) as { sessions: SessionInfo[] }).sessions;
  const s = sessions.find((x) => x.id === p.sessionId);
  if (!s) return [`${p.id} (#${p.index}) session ${p.sessionId}: silently gone from the session list`];
  const exec = await api(conn, 'POST', `/v1/sandboxes/${p.id}/sessions/${p.sessionId}/exec`, { cmd: 'echo $V $(pwd)' });
  if (edgeRestarted && !s.alive) {
    if (!s.endReason) bad('not alive, with no reason');
    if (exec.status !== 409 || exec.body?.error?.code !== 'SESSION_CLOSED')
      bad(`a command in the ended session answers ${exec.status} ${JSON.stringify(exec.body)}`);
  } else if (!s.alive) {
    bad(`ended although the edge did not restart: ${s.endReason ?? 'no reason'}`);
  } else if (exec.status !== 200 || exec.body.stdout !== `${p.index} /tmp\n`) {
    bad(`alive but its state is lost: ${exec.status} ${JSON.stringify(exec.body)}`);
  }
  return out;
}

async function verifyProcess(conn: Conn, p: Planted, edgeRestarted: boolean): Promise<string[]> {
  const out: string[] = [];
  const bad = (what: string) => out.push(`${p.id} (#${p.index}) process ${p.processId}: ${what}`);
  const r = await api(conn, 'GET', `/v1/sandboxes/${p.id}/processes/${p.processId}`);
  if (r.status !== 200)
    return [`${p.id} (#${p.index}) process ${p.processId}: answers ${r.status} ${JSON.stringify(r.body)} (silently gone)`];
  const info = (r.body as ProcessOutput).process;
  // What runs in the sandbox: an ended process must really be gone, a live one really there.
  const ps = await api(conn, 'POST', `/v1/sandboxes/${p.id}/exec`, {
    cmd: ['sh', '-c', 'for d in /proc/[0-9]*; do cat $d/cmdline 2>/dev/null | tr "\\0" " "; echo; done'],
  });
  const sleeping = String(ps.body?.stdout)
    .split('\n')
    .some((l) => l.startsWith('sleep 86400'));
  if (edgeRestarted && info.status === 'exited') {
    if (!info.endReason) bad('exited with no reason');
    if (sleeping) bad('reported ended but still runs in the sandbox');
  } else if (info.status === 'exited') {
    bad(`ended although the edge did not restart (exit ${info.exitCode}, ${info.endReason ?? 'no reason'})`);
  } else {
    if (!sleeping) bad('reported running but does not run in the sandbox');
    if (!(r.body as ProcessOutput).stdout.startsWith(`started ${p.index}`)) bad(`its output is lost: ${JSON.stringify(r.body)}`);
  }
  return out;
}

/** Resumes the paused sandboxes and checks each runs a command and reads its file; then kills all. */
export async function resumeCheckAndKill(conn: Conn, planted: Planted[], concurrency: number): Promise<string[]> {
  const problems: string[] = [];
  await pool(planted.length, concurrency, async (k) => {
    const p = planted[k]!;
    if (p.paused) {
      const r = await api(conn, 'POST', `/v1/sandboxes/${p.id}/resume`);
      if (r.status >= 300) problems.push(`${p.id}: resume answers ${r.status} ${JSON.stringify(r.body)}`);
      const e = await api(conn, 'POST', `/v1/sandboxes/${p.id}/exec`, { cmd: ['cat', '/planted.txt'] });
      if (e.status !== 200 || e.body.stdout !== fileText(p))
        problems.push(`${p.id}: after resume exec answers ${e.status} ${JSON.stringify(e.body)}`);
      problems.push(...(await verifyNetwork(conn, p)));
    }
    const d = await api(conn, 'DELETE', `/v1/sandboxes/${p.id}`);
    if (d.status >= 300) problems.push(`${p.id}: kill answers ${d.status} ${JSON.stringify(d.body)}`);
  });
  return problems;
}
