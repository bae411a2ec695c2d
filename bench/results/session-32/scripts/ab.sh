# ab.sh ROUNDS ARMS N: alternate base and new builds
for r in $(seq $1); do
  for w in base new; do
    [ $w = base ] && WT=/var/tmp/sessfast-work/base || WT=/work/wt-session
    echo "## $w round $r load $(cut -d' ' -f1 /proc/loadavg)"
    WT=$WT ARMS=$2 N=$3 node /var/tmp/sessfast-work/time.mjs 2>&1 | grep -E "^(exec|sh|bash|bashstate) "
  done
done
