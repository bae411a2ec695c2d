/**
 * "uid[:gid]" → numbers. Images carry numeric users (imports resolve names); anything else runs as
 * nobody, never as root by accident.
 */
export function parseUser(user: string): { uid: number; gid: number } {
  const m = /^(\d+)(?::(\d+))?$/.exec(user.trim());
  if (!m) return { uid: 65534, gid: 65534 };
  const uid = Number(m[1]);
  return { uid, gid: m[2] === undefined ? uid : Number(m[2]) };
}

/** Merges KEY=VALUE lists; later entries win, order of first appearance kept. */
export function mergeEnv(base: string[], ...overrides: Record<string, string>[]): string[] {
  const map = new Map<string, string>();
  for (const kv of base) {
    const i = kv.indexOf('=');
    if (i > 0) map.set(kv.slice(0, i), kv.slice(i + 1));
  }
  for (const o of overrides) for (const [k, v] of Object.entries(o)) map.set(k, v);
  return [...map].map(([k, v]) => `${k}=${v}`);
}
