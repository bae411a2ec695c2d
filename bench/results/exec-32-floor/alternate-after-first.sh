#!/bin/bash
# like alternate.sh's first part, with `after` first in each pair
before=$1 after=$2 out=$3 pairs=$4 nice=${5:-0}
mkdir -p "$out"
for i in $(seq 1 "$pairs"); do
  for side in after before; do
    root=$before; [ $side = after ] && root=$after
    l=$(cut -d' ' -f1-3 /proc/loadavg)
    node "$root/packages/dsec/dist/src/cli/main.js" bench exec --nice "$nice" --out "$out/$side-$i" > "$out/$side-$i.log" 2>&1
    echo "bench exec $side $i load[$l] $(grep -E '^(dsec|crun|floor) ' "$out/$side-$i.log" | awk '{print $1, $4}' | tr '\n' ' ')"
  done
done
