import { useEffect, useState } from 'preact/hooks';

/**
 * Routing by the URL fragment (#/sandboxes/sb-…): every page is the one index.html, so the
 * server needs no fallback route, and a reload or a shared link opens the same page.
 */
export interface Route {
  /** Path segments after '#/', e.g. ['sandboxes', 'sb-x-y']. */
  parts: string[];
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const [path = '', qs = ''] = hash.replace(/^#\/?/, '').split('?', 2);
  return { parts: path.split('/').filter(Boolean).map(decodeURIComponent), query: new URLSearchParams(qs) };
}

export function useHashRoute(): Route {
  const [route, setRoute] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const on = (): void => setRoute(parseHash(location.hash));
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return route;
}

export function href(parts: string[], query?: Record<string, string | string[]>): string {
  const qs = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) for (const one of Array.isArray(v) ? v : [v]) if (one) qs.append(k, one);
  const q = qs.toString();
  return `#/${parts.map(encodeURIComponent).join('/')}${q ? `?${q}` : ''}`;
}
