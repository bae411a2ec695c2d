// Counts the promises (and other async resources) the control plane makes per create, as issue
// 31's eleventh stop counted them. Load it into the control plane that `bench cluster` starts:
//   DSEC_BENCH_CHILD_NODE_ARGS="--import $PWD/bench/results/cpu-31/count-promises.mjs" \
//     node packages/dsec/dist/src/cli/main.js bench cluster --creates 5000 --warmup 5000 --batch-count 200 --real-count 0
// Every 2 s it writes /tmp/promises-<pid>.log: promises and other resources per POST /v1/sandboxes
// answered 201 in those 2 s (the simulated edges' process writes one too, with no creates).
import { createHook } from 'node:async_hooks';
import { subscribe } from 'node:diagnostics_channel';
import { appendFileSync } from 'node:fs';

const c = { promises: 0, other: 0, creates: 0 };
createHook({
  init(_id, type) {
    if (type === 'PROMISE') c.promises++;
    else c.other++;
  },
}).enable();
subscribe('http.server.response.finish', ({ request, response }) => {
  if (request.method === 'POST' && request.url === '/v1/sandboxes' && response.statusCode === 201) c.creates++;
});
setInterval(() => {
  if (c.creates > 0)
    appendFileSync(
      `/tmp/promises-${process.pid}.log`,
      `${JSON.stringify({ creates: c.creates, promisesPerCreate: +(c.promises / c.creates).toFixed(1), otherPerCreate: +(c.other / c.creates).toFixed(1) })}\n`,
    );
  c.promises = c.other = c.creates = 0;
}, 2000).unref();
