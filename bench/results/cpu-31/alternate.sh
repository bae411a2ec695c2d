#!/bin/bash
# usage: alternate.sh ROUNDS DIR_A DIR_B [bench args...] — alternate `bench cluster` between two checkouts (each built), printing each run's rate and CPU per create (control plane/simulated edges/load generator)
R=$1; A=$2; B=$3; shift 3
ARGS=${@:-"--creates 5000 --batch-count 32000 --real-count 0"}
mkdir -p /tmp/ab-out
for r in $(seq $R); do for d in $A $B; do
  out=/tmp/ab-out/$(basename $d)-$r; rm -rf $out; mkdir -p $out
  (cd $d && node packages/dsec/dist/src/cli/main.js bench cluster $ARGS --out $out > $out/log 2>&1)
  j=$(ls $out/*.json | head -1)
  node -e '
const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")).result;

const rate = r.rate, b = r.batch;
const cpu = (a) => (a ?? []).map((c) => c.usPerCreate ?? c.usPerSandbox).join("/");
console.log(process.argv[2].padEnd(10), "rate", rate?.createsPerSecond, "warm", rate?.warmup?.createsPerSecond, "p50", rate?.latency?.p50, "cp", cpu(rate?.cpu), "| batch s", b?.placedSeconds, "cp", cpu(b?.cpu));
' $j $(basename $d) 2>/dev/null || (echo "$(basename $d) parse failed: $j"; tail -3 $out/log)
done; done
