#!/bin/bash
# The second sitting, 2026-12-06 12:51 UTC: after = 04ec447 (no pid file per command); before, /tmp/wt1-base as in alternate.sh.
out=/tmp/bench-out/final2; mkdir -p $out
for i in 1 2 3 4; do
  for side in base new; do
    dir=/tmp/wt1-base; [ $side = new ] && dir=/work/wt1
    echo "== bench $side run $i $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && node packages/dsec/dist/src/cli/main.js bench exec --out $out/$side-$i 2>&1 | grep -E "^(dsec|crun|floor) +exec p50")
    echo "   end load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
for i in 1 2 3; do
  for side in base new; do
    dir=/tmp/wt1-base; [ $side = new ] && dir=/work/wt1
    echo "== edge-only $side run $i $(date -u +%T)"
    node /tmp/x/loop2.mjs $dir 300 2>&1 | tail -1
  done
done
