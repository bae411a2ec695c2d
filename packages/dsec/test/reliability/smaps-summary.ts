/**
 * Where a process's resident memory is, by kind of mapping, from /proc/<pid>/smaps: a soak
 * compares two of these to say which kind grew (V8's heap pages, malloc's arenas, the brk heap,
 * thread stacks, code), where RSS alone only says that something did.
 *
 * Anonymous mappings carry no name, so they are told apart by their reserved size, which each
 * allocator makes in its own shape: glibc's per-thread arenas reserve 64 MiB, thread stacks 8 MiB
 * (plus a guard page), V8 allocates its heap in 256 KiB pages and large objects in mappings of
 * their own.
 */
export interface SmapsGroup {
  /** Resident KiB of the group's mappings. */
  rssKiB: number;
  mappings: number;
}

export type SmapsSummary = Record<string, SmapsGroup>;

/** Summarises `/proc/<pid>/smaps` (the text). */
export function summariseSmaps(text: string): SmapsSummary {
  const out: SmapsSummary = {};
  let group: string | undefined;
  for (const line of text.split('\n')) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (head) {
      const sizeKiB = (parseInt(head[2]!, 16) - parseInt(head[1]!, 16)) / 1024;
      group = groupOf(head[3]!.trim(), sizeKiB);
      const g = (out[group] ??= { rssKiB: 0, mappings: 0 });
      g.mappings++;
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss && group) out[group]!.rssKiB += Number(rss[1]);
  }
  return out;
}

function groupOf(name: string, sizeKiB: number): string {
  if (name === '[heap]') return 'brk heap (main malloc arena)';
  if (name.startsWith('[stack')) return 'main stack';
  if (name.startsWith('[')) return name;
  if (name) return name.includes('.so') ? 'shared libraries' : name.endsWith('/node') ? 'node binary' : `file ${name}`;
  if (sizeKiB === 65536 || sizeKiB === 131072) return 'anonymous 64/128 MiB (malloc arena reserve)';
  if (sizeKiB === 8192 || sizeKiB === 8196) return 'anonymous 8 MiB (thread stack)';
  if (sizeKiB === 256) return 'anonymous 256 KiB (V8 page)';
  if (sizeKiB < 256) return 'anonymous < 256 KiB';
  if (sizeKiB < 4096) return 'anonymous 256 KiB – 4 MiB';
  return 'anonymous ≥ 4 MiB (other)';
}

/** The groups whose resident size changed by at least `minKiB`, largest change first: "group": [startKiB, endKiB, mappings start → end]. */
export function smapsGrowth(start: SmapsSummary, end: SmapsSummary, minKiB = 512): Record<string, string> {
  const names = new Set([...Object.keys(start), ...Object.keys(end)]);
  const rows = [...names]
    .map((n) => ({ n, a: start[n] ?? { rssKiB: 0, mappings: 0 }, b: end[n] ?? { rssKiB: 0, mappings: 0 } }))
    .filter((r) => Math.abs(r.b.rssKiB - r.a.rssKiB) >= minKiB)
    .sort((x, y) => Math.abs(y.b.rssKiB - y.a.rssKiB) - Math.abs(x.b.rssKiB - x.a.rssKiB));
  return Object.fromEntries(
    rows.map((r) => [
      r.n,
      `${r.a.rssKiB} → ${r.b.rssKiB} KiB (${r.b.rssKiB - r.a.rssKiB >= 0 ? '+' : ''}${r.b.rssKiB - r.a.rssKiB}), mappings ${r.a.mappings} → ${r.b.mappings}`,
    ]),
  );
}
