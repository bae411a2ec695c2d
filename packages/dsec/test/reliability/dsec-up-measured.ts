/**
 * `dsec up` (the CLI, its arguments as given) with one addition for memory measurements, test
 * support only: on SIGUSR2 it runs a full garbage collection and then writes where its resident
 * memory is to the file named by DSEC_MEMORY_REPORT. A soak measures dsec's own process this way
 * (not the test's, which also holds the SDK client and the test's bookkeeping), after a GC so that
 * RSS compares live memory, not how far the collector had got.
 */
import { readFileSync, renameSync, writeFileSync } from 'node:fs';
import { setFlagsFromString, writeHeapSnapshot } from 'node:v8';
import { runInNewContext } from 'node:vm';

export interface MemoryReport {
  rssBytes: number;
  heapUsedMiB: number;
  /** V8's heap as committed, V8-tracked memory outside it (Buffers), and the kernel's anonymous and file-backed resident pages. */
  detailMiB: Record<string, number>;
}

const report = process.env['DSEC_MEMORY_REPORT'];
/** A dir to write a V8 heap snapshot to at each report (`heap-<n>.heapsnapshot`), for a diff in Chrome's devtools. */
const snapshots = process.env['DSEC_MEMORY_HEAP_SNAPSHOTS'];
let reports = 0;
if (report) {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  process.on('SIGUSR2', () => {
    gc();
    const m = process.memoryUsage();
    const rollup = readFileSync('/proc/self/smaps_rollup', 'utf8');
    const kib = (k: string): number => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(rollup)?.[1] ?? 0);
    const mib = (bytes: number): number => Math.round((bytes / 2 ** 20) * 10) / 10;
    const out: MemoryReport = {
      rssBytes: m.rss,
      heapUsedMiB: Math.round(m.heapUsed / 2 ** 20),
      detailMiB: {
        heapTotal: mib(m.heapTotal),
        external: mib(m.external),
        arrayBuffers: mib(m.arrayBuffers),
        anonymous: mib(kib('Anonymous') * 1024),
        file: mib(kib('Pss_File') * 1024),
      },
    };
    if (snapshots) writeHeapSnapshot(`${snapshots}/heap-${reports}.heapsnapshot`);
    reports++;
    writeFileSync(`${report}.tmp`, JSON.stringify(out));
    renameSync(`${report}.tmp`, report);
  });
}
await import('../../src/cli/main.js');
