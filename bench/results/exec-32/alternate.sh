#!/bin/bash
# The run of 2026-12-06 12:25 UTC, as run: before (/tmp/wt1-base: a copy of the built tree of
# 6ed2d4c, main where branch exec-spawner began) and after (/work/wt1 at 799989f) alternating,
# `dsec bench exec` at its defaults four times each, then edge-exec-timeline.mjs (there at
# /tmp/x/loop2.mjs) three times each. Results were copied here as <side>-<n>-exec-*.{md,json,svg}.
out=/tmp/bench-out/final; mkdir -p $out
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
