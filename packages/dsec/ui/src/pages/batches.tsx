import type { BatchEvent, BatchInfo } from '@dsec/sdk/schema';
import { useEffect, useState } from 'preact/hooks';
import { getJson, ndjson, sendJson } from '../api';
import { ErrorLine } from '../components/error-line';
import { ProgressBar } from '../components/progress-bar';
import { ago } from '../format';
import { href } from '../hash-route';
import { usePoll } from '../use-poll';

function Counts(props: { b: BatchInfo }) {
  const { b } = props;
  return (
    <span data-testid={`batch-counts-${b.id}`}>
      {b.running} running, {b.failed} failed, {b.placed} placed of {b.count}
    </span>
  );
}

/** Every batch, newest first, with its progress (polled each second while any runs). */
export function BatchesPage() {
  const list = usePoll((signal) => getJson<{ batches: BatchInfo[] }>('/v1/batches', signal), 1000);
  return (
    <div>
      <h1>Batches</h1>
      <ErrorLine error={list.error} />
      {list.data && list.data.batches.length === 0 && <p class="muted">No batches yet (POST /v1/batches, or dsec run --count N).</p>}
      <table data-testid="batches">
        <thead>
          <tr>
            <th>batch</th>
            <th>state</th>
            <th>progress</th>
            <th>items</th>
            <th>created</th>
          </tr>
        </thead>
        <tbody>
          {(list.data?.batches ?? []).map((b) => (
            <tr data-batch={b.id}>
              <td>
                <a href={href(['batches', b.id])}>
                  <code>{b.id}</code>
                </a>
              </td>
              <td class={`state-${b.state}`}>{b.state}</td>
              <td>
                <ProgressBar {...b} />
              </td>
              <td>
                <Counts b={b} />
              </td>
              <td title={b.createdAt}>{ago(b.createdAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

const SHOWN_EVENTS = 200;

/** One batch: counts, and its events as they happen (the NDJSON progress stream, resumed after the last one seen). */
export function BatchPage(props: { id: string }) {
  const { id } = props;
  const info = usePoll((signal) => getJson<BatchInfo>(`/v1/batches/${id}`, signal), 1000, [id]);
  const [events, setEvents] = useState<BatchEvent[]>([]);
  const [streamError, setStreamError] = useState<Error | undefined>();
  const [cancelError, setCancelError] = useState<Error | undefined>();

  useEffect(() => {
    const ctl = new AbortController();
    setEvents([]);
    void (async () => {
      try {
        for await (const e of ndjson<BatchEvent>(`/v1/batches/${id}/events?after=-1`, ctl.signal))
          setEvents((old) => [...old.slice(-(SHOWN_EVENTS - 1)), e]);
      } catch (err) {
        if (!ctl.signal.aborted) setStreamError(err as Error);
      }
    })();
    return () => ctl.abort();
  }, [id]);

  const b = info.data;
  return (
    <div>
      <p>
        <a href={href(['batches'])}>← batches</a>
      </p>
      <h1>
        <code>{id}</code> {b && <span class={`badge state-${b.state}`}>{b.state}</span>}
      </h1>
      <ErrorLine error={info.error} />
      {b && (
        <section class="card">
          <ProgressBar {...b} />
          <p>
            <Counts b={b} />
            {b.finishedAt && <span class="muted"> · finished {ago(b.finishedAt)}</span>}
          </p>
          <div class="row">
            <a href={href(['sandboxes'], { label: `dsec.batch=${id}` })}>its sandboxes</a>
            {b.state === 'running' && (
              <button
                class="danger"
                onClick={() => {
                  if (!confirm(`Cancel ${id} and kill what it made?`)) return;
                  sendJson('DELETE', `/v1/batches/${id}`).catch((err: Error) => setCancelError(err));
                }}
              >
                Cancel batch
              </button>
            )}
          </div>
          <ErrorLine error={cancelError} />
        </section>
      )}
      <section class="card">
        <h2>
          Events <span class="muted">last {SHOWN_EVENTS}</span>
        </h2>
        <ErrorLine error={streamError} />
        <table>
          <tbody>
            {[...events].reverse().map((e) => (
              <tr>
                <td>{e.seq}</td>
                <td class={`event-${e.type}`}>{e.type}</td>
                <td>{e.index ?? ''}</td>
                <td>{e.sandboxId ? <a href={href(['sandboxes', e.sandboxId])}>{e.sandboxId}</a> : ''}</td>
                <td>{e.edge ?? ''}</td>
                <td>{e.code ? `${e.code}: ${e.reason ?? ''}` : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>
    </div>
  );
}
