// Temporary probe (not part of the product): every GC of this process, with absolute times, to a file per pid.
import { PerformanceObserver, performance, constants } from 'node:perf_hooks';
import { appendFileSync } from 'node:fs';
const dir = process.env.PROBE_DIR ?? '/tmp/pages-probe/out';
const file = `${dir}/gc-${process.pid}.log`;
appendFileSync(file, `# ${process.argv.slice(1).join(' ')}\n`);
const kinds = {
  [constants.NODE_PERFORMANCE_GC_MAJOR]: 'major',
  [constants.NODE_PERFORMANCE_GC_MINOR]: 'minor',
  [constants.NODE_PERFORMANCE_GC_INCREMENTAL]: 'incr',
  [constants.NODE_PERFORMANCE_GC_WEAKCB]: 'weakcb',
};
let buf = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries())
    buf.push(`${(performance.timeOrigin + e.startTime).toFixed(1)} ${kinds[e.detail?.kind] ?? e.detail?.kind} ${e.duration.toFixed(2)}`);
  if (buf.length > 50) {
    appendFileSync(file, buf.join('\n') + '\n');
    buf = [];
  }
}).observe({ entryTypes: ['gc'] });
setInterval(() => {
  if (buf.length) {
    appendFileSync(file, buf.join('\n') + '\n');
    buf = [];
  }
}, 1000).unref();
process.on('exit', () => {
  if (buf.length) appendFileSync(file, buf.join('\n') + '\n');
});
// Whole-request timing of the hold's page reads in the server process, with this process's CPU time and the other requests that arrived meanwhile.
import http from 'node:http';
let seen = 0;
const reqFile = `${dir}/srv-${process.pid}.log`;
const emit = http.Server.prototype.emit;
http.Server.prototype.emit = function (ev, req, res) {
  if (ev === 'request') {
    seen++;
    if (req.url.startsWith('/v1/sandboxes?label=hold-batch')) {
      const t0 = performance.timeOrigin + performance.now(),
        c0 = process.cpuUsage(),
        n0 = seen;
      res.once('finish', () => {
        const c = process.cpuUsage(c0);
        appendFileSync(
          reqFile,
          `${t0.toFixed(1)} wall ${(performance.timeOrigin + performance.now() - t0).toFixed(2)} cpu ${((c.user + c.system) / 1000).toFixed(2)} others ${seen - n0}\n`,
        );
      });
    }
  }
  return emit.apply(this, arguments);
};
