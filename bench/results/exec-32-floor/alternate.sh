#!/bin/bash
# Alternating before/after runs of `dsec bench exec` (each the built CLI of a checkout), then the
# edge's own exec (../exec-32/edge-exec-timeline.mjs) and session commands (session-loop.mjs).
# usage: alternate.sh <before checkout, built> <after checkout, built> <out dir> <pairs> [nice]
before=$1 after=$2 out=$3 pairs=$4 nice=${5:-0}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  for side in before after; do
    root=$before; [ $side = after ] && root=$after
    l=$(cut -d' ' -f1-3 /proc/loadavg)
    node "$root/packages/dsec/dist/src/cli/main.js" bench exec --nice "$nice" --out "$out/$side-$i" > "$out/$side-$i.log" 2>&1
    echo "bench exec $side $i load[$l] $(grep -E '^(dsec|crun|floor) ' "$out/$side-$i.log" | awk '{print $1, $4}' | tr '\n' ' ')"
  done
done
for i in $(seq 1 "$pairs"); do
  for side in before after; do
    root=$before; [ $side = after ] && root=$after
    echo "edge $side $i $(nice -n "$nice" node "$here/../exec-32/edge-exec-timeline.mjs" "$root" 300)"
    echo "session $side $i $(nice -n "$nice" node "$here/session-loop.mjs" "$root" 300 --session | tail -1)"
  done
done
