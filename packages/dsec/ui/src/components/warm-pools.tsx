import type { PoolInfo } from '@dsec/sdk/schema';
import { getJson } from '../api';
import { usePoll } from '../use-poll';
import { ErrorLine } from './error-line';

/** Warm pools (`GET /v1/pools`): ready sandboxes kept for fast creates, with claims, misses and refills. */
export function WarmPools() {
  const pools = usePoll((signal) => getJson<{ pools: PoolInfo[] }>('/v1/pools', signal), 2000);
  const list = pools.data?.pools ?? [];
  return (
    <section class="card" aria-label="warm pools">
      <h2>Warm pools</h2>
      <ErrorLine error={pools.error} />
      {pools.data && list.length === 0 && <p class="muted">No warm pools (POST /v1/pools, or dsec pool create).</p>}
      {list.length > 0 && (
        <table data-testid="warm-pools">
          <thead>
            <tr>
              <th>pool</th>
              <th>image</th>
              <th>ready / size</th>
              <th>refilling</th>
              <th>claims</th>
              <th>misses</th>
              <th>refill p50</th>
              <th>refill failures</th>
            </tr>
          </thead>
          <tbody>
            {list.map((p) => (
              <tr data-pool={p.name}>
                <td>{p.name}</td>
                <td>{p.spec.image}</td>
                <td>
                  {p.ready} / {p.size}
                </td>
                <td>{p.creating}</td>
                <td>{p.claims}</td>
                <td>{p.misses}</td>
                <td>{p.refillMsP50 === undefined ? '–' : `${Math.round(p.refillMsP50)} ms`}</td>
                <td title={p.lastRefillError}>{p.refillFailures}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
