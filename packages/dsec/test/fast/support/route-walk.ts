/** What the fast tier's route walks share: a concrete path and a body for a declared route. */

/** A concrete path for a route pattern: `:param`s from `values` (else `x`), a wildcard as `x`. */
export function pathOf(url: string, values: Record<string, string> = {}): string {
  return url
    .split('/')
    .map((s) => (s === '*' ? 'x' : s.startsWith(':') ? (values[s.slice(1)] ?? 'x') : s))
    .join('/');
}

/** An empty JSON body for the methods that take one, none for the others. */
export function bodyOf(method: string): object | undefined {
  return ['POST', 'PUT', 'PATCH'].includes(method) ? {} : undefined;
}
