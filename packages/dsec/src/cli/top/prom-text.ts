/**
 * A reader of the Prometheus text exposition format (version 0.0.4), for `dsec top` and the tests:
 * every sample with its labels, and the TYPE of each family. Written here because the npm parser
 * (parse-prometheus-text-format 1.1.1) drops the labels of labelled histograms and reads their
 * `_sum`/`_count` as NaN (tried on prom-client's own output); the format is line-based and small.
 */
export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

export interface Scrape {
  samples: Sample[];
  types: Map<string, string>;
  /** The one sample of `name` whose labels include all of `labels`; undefined when there is none. */
  get(name: string, labels?: Record<string, string>): number | undefined;
  /** The sum over every sample of `name` whose labels include all of `labels` (0 when none). */
  sum(name: string, labels?: Record<string, string>): number;
}

const SAMPLE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/gy;

export function parsePromText(text: string): Scrape {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    if (line.startsWith('#')) {
      const t = /^# TYPE (\S+) (\S+)$/.exec(line);
      if (t) types.set(t[1]!, t[2]!);
      continue;
    }
    const m = SAMPLE.exec(line);
    if (!m) throw new Error(`not a Prometheus sample line: ${JSON.stringify(line)}`);
    const labels: Record<string, string> = {};
    const body = m[2] ?? '';
    LABEL.lastIndex = 0;
    let consumed = 0;
    for (let l = LABEL.exec(body); l; l = LABEL.exec(body)) {
      labels[l[1]!] = l[2]!.replace(/\\n/g, '\n').replace(/\\"/g, '"').replace(/\\\\/g, '\\');
      consumed = LABEL.lastIndex;
    }
    if (consumed !== body.length) throw new Error(`bad labels in ${JSON.stringify(line)}`);
    const raw = m[3]!;
    // Prometheus parses values as Go floats (NaN in any case: prom-client writes "Nan").
    const value = raw === '+Inf' ? Infinity : raw === '-Inf' ? -Infinity : /^nan$/i.test(raw) ? NaN : Number(raw);
    if (Number.isNaN(value) && !/^nan$/i.test(raw)) throw new Error(`bad value in ${JSON.stringify(line)}`);
    samples.push({ name: m[1]!, labels, value });
  }
  const matching = (name: string, labels: Record<string, string> = {}): Sample[] =>
    samples.filter((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v));
  return {
    samples,
    types,
    get(name, labels) {
      const found = matching(name, labels);
      if (found.length > 1) throw new Error(`${found.length} samples of ${name} match ${JSON.stringify(labels)}`);
      return found[0]?.value;
    },
    sum(name, labels) {
      return matching(name, labels).reduce((n, s) => n + s.value, 0);
    },
  };
}
