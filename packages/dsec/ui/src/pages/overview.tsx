import type { NodeInfo, SandboxCounts } from '@dsec/sdk/schema';
import { getJson } from '../api';
import { CreateRateChart } from '../components/rate-chart';
import { UtilBar } from '../components/util-bar';
import { WarmPools } from '../components/warm-pools';
import { ErrorLine } from '../components/error-line';
import { ago, bytes } from '../format';
import { href } from '../hash-route';
import { usePoll } from '../use-poll';

const STATES = ['creating', 'running', 'paused', 'stopped', 'failed', 'lost'] as const;

interface PoolRow {
  pool: string;
  edges: number;
  ready: number;
  sandboxes: number;
  maxSandboxes: number;
  utilisation: number;
}

/** Node pools from the edges' own reports; a pool's utilisation is the mean over its ready edges. */
function poolsOf(nodes: NodeInfo[]): PoolRow[] {
  const byPool = new Map<string, PoolRow & { utilSum: number }>();
  for (const n of nodes) {
    const p = byPool.get(n.pool) ?? { pool: n.pool, edges: 0, ready: 0, sandboxes: 0, maxSandboxes: 0, utilisation: 0, utilSum: 0 };
    p.edges++;
    p.sandboxes += n.sandboxes;
    if (n.state === 'ready') {
      p.ready++;
      p.maxSandboxes += n.maxSandboxes;
      p.utilSum += n.utilisation;
    }
    byPool.set(n.pool, p);
  }
  return [...byPool.values()]
    .map(({ utilSum, ...p }) => ({ ...p, utilisation: p.ready ? utilSum / p.ready : 0 }))
    .sort((a, b) => a.pool.localeCompare(b.pool));
}

export function OverviewPage() {
  const nodes = usePoll((signal) => getJson<{ nodes: NodeInfo[] }>('/v1/nodes', signal), 2000);
  // Counted by the store, not by fetching every sandbox (400,000 of them would be ~200 MB a poll).
  const sandboxes = usePoll((signal) => getJson<SandboxCounts>('/v1/sandboxes/counts', signal), 3000);
  const counts = new Map<string, number>(Object.entries(sandboxes.data?.counts ?? {}));
  const list = nodes.data?.nodes ?? [];

  return (
    <div>
      <h1>Overview</h1>
      <section class="card" aria-label="sandboxes by state">
        <h2>Sandboxes by state</h2>
        <ErrorLine error={sandboxes.error} />
        <div class="tiles">
          {STATES.map((st) => (
            <a class={`tile state-${st}`} href={href(['sandboxes'], { status: st })} data-testid={`count-${st}`}>
              <b>{sandboxes.data ? (counts.get(st) ?? 0) : '…'}</b>
              <span>{st}</span>
            </a>
          ))}
        </div>
      </section>

      <CreateRateChart />

      <section class="card" aria-label="pools">
        <h2>Node pools</h2>
        <table>
          <thead>
            <tr>
              <th>pool</th>
              <th>edges (ready)</th>
              <th>sandboxes</th>
              <th>utilisation</th>
            </tr>
          </thead>
          <tbody>
            {poolsOf(list).map((p) => (
              <tr>
                <td>{p.pool}</td>
                <td>
                  {p.edges} ({p.ready})
                </td>
                <td>
                  {p.sandboxes} / {p.maxSandboxes}
                </td>
                <td>
                  <UtilBar value={p.utilisation} />
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>

      <WarmPools />

      <section class="card" aria-label="edges">
        <h2>Edges</h2>
        <ErrorLine error={nodes.error} />
        <table data-testid="edges">
          <thead>
            <tr>
              <th>edge</th>
              <th>pool</th>
              <th>state</th>
              <th>sandboxes</th>
              <th>utilisation</th>
              <th>CPU committed</th>
              <th>memory available</th>
              <th>processes</th>
              <th>layer cache</th>
              <th>last heartbeat</th>
            </tr>
          </thead>
          <tbody>
            {list.map((n) => (
              <tr>
                <td>
                  <code>{n.id}</code>
                  {Object.keys(n.labels).length > 0 && (
                    <div class="muted">
                      {Object.entries(n.labels)
                        .map(([k, v]) => `${k}=${v}`)
                        .join(' ')}
                    </div>
                  )}
                </td>
                <td>{n.pool}</td>
                <td class={`state-${n.state}`}>{n.state}</td>
                <td>
                  {n.sandboxes} / {n.maxSandboxes}
                </td>
                <td>
                  <UtilBar value={n.utilisation} />
                </td>
                <td>
                  {n.capacity.cpuCommitted} / {n.capacity.cpus} CPUs
                </td>
                <td>
                  {bytes(n.capacity.memoryAvailableBytes)} of {bytes(n.capacity.memoryBytes)}
                  <div class="muted">{n.capacity.memoryCommittedMiB} MiB committed</div>
                </td>
                <td>
                  {n.capacity.pidsInUse} / {n.capacity.pidMax}
                </td>
                <td>
                  {n.layerCache.entries} layers, {bytes(n.layerCache.bytes)}
                  <div class="muted">{n.layerCache.mounted} mounted</div>
                </td>
                <td>{ago(n.lastSeenAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </section>
    </div>
  );
}
