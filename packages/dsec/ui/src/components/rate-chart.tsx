import { useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { call } from '../api';
import { sumMetric } from '../metrics-text';

/** Counter the chart derives its rate from (Prometheus text at /metrics, summed over labels). */
const CREATES_COUNTER = 'dsec_sandbox_creates_total';
const SAMPLE_MS = 2000;
const WINDOW_POINTS = 90; // three minutes

/**
 * Sandbox creates per second, live: samples the control plane's creates counter every two
 * seconds and plots the difference over time (the first sample only sets the baseline).
 */
export function CreateRateChart() {
  const box = useRef<HTMLDivElement>(null);
  const [total, setTotal] = useState<number | undefined>();
  const [rate, setRate] = useState<number | undefined>();
  const [error, setError] = useState<string | undefined>();

  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const xs: number[] = [];
    const ys: number[] = [];
    const plot = new uPlot(
      {
        width: el.clientWidth || 600,
        height: 180,
        // A minute at least on the x axis, ending now before the first samples: uPlot would otherwise stretch one sample over years (or draw 1970 with none).
        scales: {
          x: {
            time: true,
            range: (_u, min, max) =>
              max == null || min == null || max - min < 60 ? [(max ?? Date.now() / 1000) - 60, max ?? Date.now() / 1000] : [min, max],
          },
          y: { range: (_u, _min, max) => [0, Math.max(1, max * 1.2)] },
        },
        axes: [{}, { label: 'creates/s' }],
        series: [{}, { label: 'creates/s', stroke: '#2563eb', fill: 'rgba(37,99,235,0.12)', width: 2 }],
        legend: { show: false },
      },
      [xs, ys],
      el,
    );
    const onResize = (): void => plot.setSize({ width: el.clientWidth || 600, height: 180 });
    addEventListener('resize', onResize);

    const ctl = new AbortController();
    let last: { t: number; v: number } | undefined;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const sample = async (): Promise<void> => {
      try {
        const text = await (await call('/metrics', { signal: ctl.signal })).text();
        const v = sumMetric(text, CREATES_COUNTER);
        if (v === undefined) throw new Error(`/metrics has no ${CREATES_COUNTER}`);
        const t = Date.now() / 1000;
        if (last && t > last.t) {
          const r = Math.max(0, (v - last.v) / (t - last.t));
          xs.push(t);
          ys.push(r);
          if (xs.length > WINDOW_POINTS) {
            xs.shift();
            ys.shift();
          }
          plot.setData([xs, ys]);
          setRate(r);
        }
        last = { t, v };
        setTotal(v);
        setError(undefined);
      } catch (err) {
        if (!ctl.signal.aborted) setError((err as Error).message);
      }
      if (!ctl.signal.aborted) timer = setTimeout(() => void sample(), SAMPLE_MS);
    };
    void sample();
    return () => {
      ctl.abort();
      clearTimeout(timer);
      removeEventListener('resize', onResize);
      plot.destroy();
    };
  }, []);

  return (
    <section class="card" aria-label="create rate">
      <h2>
        Create rate <span class="muted">{rate === undefined ? '' : `${rate.toFixed(2)}/s now`}</span>
      </h2>
      <div ref={box} class="chart" />
      <p class="muted">
        Creates since the control plane started: <b data-testid="creates-total">{total ?? '…'}</b>
        {error && <span class="error"> {error}</span>}
      </p>
    </section>
  );
}
