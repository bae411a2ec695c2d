import { percent } from '../format';

/** A 0..1 share as a bar with its percentage; amber above the burst threshold (80 %), red when full. */
export function UtilBar(props: { value: number }) {
  const v = Math.min(1, Math.max(0, props.value));
  const level = v >= 1 ? 'full' : v > 0.8 ? 'high' : 'ok';
  return (
    <span class="util">
      <span class={`util-bar util-${level}`}>
        <span style={{ width: `${v * 100}%` }} />
      </span>
      {percent(v)}
    </span>
  );
}
