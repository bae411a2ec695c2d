import { useEffect, useState } from 'preact/hooks';

export interface Polled<T> {
  data?: T;
  error?: Error;
}

/**
 * Calls `load` now and every `intervalMs` while the component is mounted (and again when a dep
 * changes); the latest answer or error is the state. A call still in flight is aborted on
 * unmount, and calls never overlap.
 */
export function usePoll<T>(load: (signal: AbortSignal) => Promise<T>, intervalMs: number, deps: unknown[] = []): Polled<T> {
  const [state, setState] = useState<Polled<T>>({});
  useEffect(() => {
    const ctl = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const tick = async (): Promise<void> => {
      try {
        const data = await load(ctl.signal);
        if (!ctl.signal.aborted) setState({ data });
      } catch (err) {
        if (!ctl.signal.aborted) setState((s) => ({ data: s.data, error: err as Error }));
      }
      if (!ctl.signal.aborted) timer = setTimeout(() => void tick(), intervalMs);
    };
    setState({});
    void tick();
    return () => {
      ctl.abort();
      clearTimeout(timer);
    };
  }, deps);
  return state;
}
