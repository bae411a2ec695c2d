import type { NetworkPolicyState, SandboxInfo, Trajectory, TrajectoryEntry } from '@dsec/sdk/schema';
import { useEffect, useState } from 'preact/hooks';
import { ApiCallError, getJson, sendJson } from '../api';
import { ErrorLine } from '../components/error-line';
import { SandboxTerminal } from '../components/terminal';
import { ago, bytes } from '../format';
import { href } from '../hash-route';
import { usePoll } from '../use-poll';

/** One sandbox: what it was given, what it uses now, its egress policy, its steps, a terminal. */
export function SandboxPage(props: { id: string }) {
  const { id } = props;
  const info = usePoll((signal) => getJson<SandboxInfo>(`/v1/sandboxes/${id}`, signal), 2000, [id]);
  const live = info.data && (info.data.status === 'running' || info.data.status === 'paused');
  const [terminalOpen, setTerminalOpen] = useState(false);
  const [actionError, setActionError] = useState<Error | undefined>();
  const s = info.data;

  const act = async (what: 'pause' | 'resume' | 'kill'): Promise<void> => {
    setActionError(undefined);
    try {
      if (what === 'kill') {
        if (!confirm(`Kill ${id}? Its processes, writable layer and network go; the trajectory is kept for a while.`)) return;
        await sendJson('DELETE', `/v1/sandboxes/${id}`);
        location.hash = href(['sandboxes']);
      } else await sendJson('POST', `/v1/sandboxes/${id}/${what}`);
    } catch (err) {
      setActionError(err as Error);
    }
  };

  return (
    <div>
      <p>
        <a href={href(['sandboxes'])}>← sandboxes</a>
      </p>
      <h1>
        <code>{id}</code>{' '}
        {s && (
          <span class={`badge state-${s.status}`} data-testid="sandbox-status">
            {s.status}
          </span>
        )}
      </h1>
      {info.error instanceof ApiCallError && info.error.code === 'SANDBOX_NOT_FOUND' ? (
        <p class="error">No sandbox {id}: it was killed or never existed.</p>
      ) : (
        <ErrorLine error={info.error} />
      )}
      {s && (
        <>
          <div class="row">
            {s.status === 'running' && <button onClick={() => void act('pause')}>Pause</button>}
            {s.status === 'paused' && <button onClick={() => void act('resume')}>Resume</button>}
            <button class="danger" onClick={() => void act('kill')}>
              Kill
            </button>
          </div>
          <ErrorLine error={actionError} />
          {s.reason && <p class="error">reason: {s.reason}</p>}
          <div class="grid">
            <section class="card" aria-label="resources">
              <h2>Resources</h2>
              <dl>
                <dt>image</dt>
                <dd>
                  {s.image} <span class="muted">{s.imageId.slice(0, 19)}</span>
                </dd>
                <dt>backend</dt>
                <dd>{s.backend}</dd>
                <dt>edge</dt>
                <dd>{s.edge}</dd>
                <dt>CPU</dt>
                <dd>{s.resources.cpu}</dd>
                <dt>memory</dt>
                <dd>{s.resources.memoryMiB} MiB</dd>
                <dt>pids</dt>
                <dd>{s.resources.pids}</dd>
                <dt>disk</dt>
                <dd>{s.resources.diskMiB ? `${s.resources.diskMiB} MiB` : 'no limit of its own'}</dd>
                <dt>layers</dt>
                <dd>{s.layers.length}</dd>
                <dt>labels</dt>
                <dd>
                  {Object.entries(s.labels).map(([k, v]) => (
                    <span class="label">
                      {k}={v}
                    </span>
                  ))}
                </dd>
                <dt>created</dt>
                <dd title={s.createdAt}>{ago(s.createdAt)}</dd>
                <dt>last activity</dt>
                <dd title={s.lastActivityAt}>{ago(s.lastActivityAt)}</dd>
                {s.expiresAt && (
                  <>
                    <dt>expires</dt>
                    <dd>
                      {s.expiresAt} ({s.onExpiry})
                    </dd>
                  </>
                )}
              </dl>
            </section>
            <section class="card" aria-label="usage">
              <h2>Live usage</h2>
              {s.usage ? (
                <dl data-testid="usage">
                  <dt>memory</dt>
                  <dd>
                    {bytes(s.usage.memoryBytes)} of {s.resources.memoryMiB} MiB
                  </dd>
                  <dt>processes</dt>
                  <dd>
                    {s.usage.pids} of {s.resources.pids}
                  </dd>
                  <dt>OOM kills</dt>
                  <dd>{s.usage.oomKills}</dd>
                </dl>
              ) : (
                <p class="muted">No usage: the sandbox is {s.status}.</p>
              )}
            </section>
            {live && <NetworkCard id={id} />}
          </div>
          {live && (
            <section class="card" aria-label="terminal">
              <h2>Terminal</h2>
              {terminalOpen ? (
                <SandboxTerminal id={id} onClose={() => setTerminalOpen(false)} />
              ) : (
                <button onClick={() => setTerminalOpen(true)} disabled={s.status !== 'running'}>
                  Open a terminal
                </button>
              )}
            </section>
          )}
        </>
      )}
      <TrajectoryCard id={id} />
    </div>
  );
}

function NetworkCard(props: { id: string }) {
  const net = usePoll((signal) => getJson<NetworkPolicyState>(`/v1/sandboxes/${props.id}/network`, signal), 5000, [props.id]);
  const n = net.data;
  return (
    <section class="card" aria-label="network policy">
      <h2>Network policy</h2>
      <ErrorLine error={net.error} />
      {n && (
        <dl data-testid="network">
          {Object.entries(n).map(([k, v]) => (
            <>
              <dt>{k}</dt>
              <dd>{Array.isArray(v) ? v.join(', ') || '–' : typeof v === 'object' && v !== null ? JSON.stringify(v) : String(v)}</dd>
            </>
          ))}
        </dl>
      )}
    </section>
  );
}

/** Output of a logged command, decoded when the API kept it as base64 (binary output). */
function outputText(result: Record<string, unknown> | undefined, stream: 'stdout' | 'stderr'): string {
  const v = result?.[stream];
  if (typeof v !== 'string' || v === '') return '';
  if (result?.['encoding'] !== 'base64') return v;
  try {
    return new TextDecoder().decode(Uint8Array.from(atob(v), (c) => c.charCodeAt(0)));
  } catch {
    return `(${v.length} base64 characters)`;
  }
}

function describe(e: TrajectoryEntry): string {
  const r = e.request;
  const cmd = r['cmd'];
  if (Array.isArray(cmd)) return cmd.map(String).join(' ');
  if (typeof cmd === 'string') return cmd;
  if (typeof r['path'] === 'string') return String(r['path']);
  if (e.kind === 'network.set') return String(r['mode'] ?? '');
  return Object.keys(r).length ? JSON.stringify(r) : '';
}

/** The trajectory, step by step: fetched once, then only the steps after the last one seen. */
function TrajectoryCard(props: { id: string }) {
  const [entries, setEntries] = useState<TrajectoryEntry[]>([]);
  const [dropped, setDropped] = useState(0);
  const [error, setError] = useState<Error | undefined>();
  useEffect(() => {
    const ctl = new AbortController();
    let after = 0;
    let timer: ReturnType<typeof setTimeout> | undefined;
    setEntries([]);
    const tick = async (): Promise<void> => {
      try {
        const t = await getJson<Trajectory>(`/v1/sandboxes/${props.id}/trajectory?afterSeq=${after}`, ctl.signal);
        if (t.entries.length) {
          after = t.entries[t.entries.length - 1]!.seq;
          setEntries((old) => [...old, ...t.entries]);
        }
        setDropped(t.dropped);
        setError(undefined);
      } catch (err) {
        if (!ctl.signal.aborted) setError(err as Error);
      }
      if (!ctl.signal.aborted) timer = setTimeout(() => void tick(), 2000);
    };
    void tick();
    return () => {
      ctl.abort();
      clearTimeout(timer);
    };
  }, [props.id]);

  return (
    <section class="card" aria-label="trajectory">
      <h2>
        Trajectory{' '}
        <span class="muted">
          {entries.length} steps{dropped ? `, ${dropped} dropped` : ''}
        </span>
      </h2>
      <ErrorLine error={error} />
      <ol class="steps" data-testid="trajectory">
        {entries.map((e) => {
          const out = outputText(e.result, 'stdout');
          const err = outputText(e.result, 'stderr');
          return (
            <li class="step" data-seq={e.seq}>
              <div class="row">
                <b>#{e.seq}</b>
                <span class="kind">{e.kind}</span>
                <code class="cmd">{describe(e)}</code>
                {e.exitCode !== undefined && <span class={e.exitCode === 0 ? 'ok' : 'error'}>exit {e.exitCode}</span>}
                {e.durationMs !== undefined && <span class="muted">{e.durationMs.toFixed(0)} ms</span>}
                <span class="muted" title={e.at}>
                  {ago(e.at)}
                </span>
              </div>
              {out && <pre class="stdout">{out}</pre>}
              {err && <pre class="stderr">{err}</pre>}
              {e.result?.['logTruncated'] === true && <p class="muted">output cut at 64 KiB in the log</p>}
            </li>
          );
        })}
      </ol>
    </section>
  );
}
