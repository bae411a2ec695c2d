import type { SandboxInfo } from '@dsec/sdk/schema';
import { useEffect, useState } from 'preact/hooks';
import { getJson } from '../api';
import { ErrorLine } from '../components/error-line';
import { ago } from '../format';
import { href, type Route } from '../hash-route';
import { usePoll } from '../use-poll';

const STATES = ['creating', 'running', 'paused', 'stopped', 'failed', 'lost'];
/**
 * Rows drawn at once: the newest this many, asked of the server as one page (a list of 400,000
 * is never sent whole every 2 s); narrower views are filtered on the server, not scrolled.
 */
const MAX_ROWS = 500;

/** Label filters typed as `k=v k2=v2` (spaces or commas between them). */
export function parseLabelFilter(text: string): string[] {
  return text
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter((s) => /^[^=]+=.*$/.test(s));
}

/** Sandboxes with filters by label and state; the filters live in the URL so a view can be shared. */
export function SandboxesPage(props: { route: Route }) {
  const labels = props.route.query.getAll('label');
  const status = props.route.query.get('status') ?? '';
  const [labelText, setLabelText] = useState(labels.join(' '));
  useEffect(() => setLabelText(labels.join(' ')), [labels.join(' ')]); // a label link changed the URL

  const qs = new URLSearchParams();
  for (const l of labels) qs.append('label', l);
  if (status) qs.set('status', status);
  qs.set('order', 'newest');
  qs.set('limit', String(MAX_ROWS));
  const list = usePoll((signal) => getJson<{ sandboxes: SandboxInfo[]; next?: string }>(`/v1/sandboxes?${qs}`, signal), 2000, [
    qs.toString(),
  ]);
  const rows = list.data?.sandboxes ?? [];
  const more = list.data?.next !== undefined;

  const apply = (nextLabels: string[], nextStatus: string): void => {
    location.hash = href(['sandboxes'], { label: nextLabels, status: nextStatus });
  };

  return (
    <div>
      <h1>Sandboxes</h1>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          apply(parseLabelFilter(labelText), status);
        }}
      >
        <label>
          labels
          <input name="label" placeholder="task=t1 team=rl" value={labelText} onInput={(e) => setLabelText(e.currentTarget.value)} />
        </label>
        <label>
          state
          <select name="status" value={status} onChange={(e) => apply(parseLabelFilter(labelText), e.currentTarget.value)}>
            <option value="">any</option>
            {STATES.map((s) => (
              <option value={s}>{s}</option>
            ))}
          </select>
        </label>
        <button type="submit">Filter</button>
        {(labels.length > 0 || status) && (
          <button
            type="button"
            onClick={() => {
              setLabelText('');
              apply([], '');
            }}
          >
            Clear
          </button>
        )}
      </form>
      <ErrorLine error={list.error} />
      <p class="muted" data-testid="sandbox-count">
        {list.data
          ? more
            ? `more than ${MAX_ROWS} sandboxes, the newest ${MAX_ROWS} shown`
            : `${rows.length} sandbox${rows.length === 1 ? '' : 'es'}`
          : 'loading…'}
      </p>
      <table data-testid="sandboxes">
        <thead>
          <tr>
            <th>id</th>
            <th>state</th>
            <th>image</th>
            <th>backend</th>
            <th>edge</th>
            <th>CPU / memory</th>
            <th>labels</th>
            <th>created</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((s) => (
            <tr data-sandbox={s.id}>
              <td>
                <a href={href(['sandboxes', s.id])}>
                  <code>{s.id}</code>
                </a>
              </td>
              <td class={`state-${s.status}`} title={s.reason}>
                {s.status}
              </td>
              <td>{s.image}</td>
              <td>{s.backend}</td>
              <td>{s.edge}</td>
              <td>
                {s.resources.cpu} / {s.resources.memoryMiB} MiB
              </td>
              <td>
                {Object.entries(s.labels).map(([k, v]) => (
                  <a class="label" href={href(['sandboxes'], { label: `${k}=${v}` })}>
                    {k}={v}
                  </a>
                ))}
              </td>
              <td title={s.createdAt}>{ago(s.createdAt)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
