/** A batch's items as one bar: running (green), failed (red), placed but not yet running (blue). */
export function ProgressBar(props: { count: number; placed: number; running: number; failed: number }) {
  const { count, placed, running, failed } = props;
  const pct = (n: number): string => `${(Math.max(0, n) / Math.max(1, count)) * 100}%`;
  return (
    <span class="progress" role="progressbar" aria-valuemin={0} aria-valuemax={count} aria-valuenow={running + failed}>
      <span class="progress-running" style={{ width: pct(running) }} />
      <span class="progress-failed" style={{ width: pct(failed) }} />
      <span class="progress-placed" style={{ width: pct(placed - running - failed) }} />
    </span>
  );
}
