# Alternates `bench hardening` on the original session code (5e981b2) and the branch's, same CLI otherwise.
# usage: abbench.sh ROUNDS COUNT
set -e
cd /work/wt-session
FILES="packages/dsec/src/edge/backends/shared/session-table.ts packages/dsec/src/edge/backends/shared/shell-session.ts packages/dsec/src/edge/backends/shared/session-state.ts"
NEWTESTS="packages/dsec/test/fast/session-table.test.ts packages/dsec/test/fast/session-shell.test.ts packages/dsec/test/fast/support/host-shell.ts"
build() {
  if [ "$1" = orig ]; then
    git checkout 5e981b2 -- $FILES
    mkdir -p /tmp/sessfast-hold && for f in $NEWTESTS; do mv $f /tmp/sessfast-hold/; done
  fi
  npx tsc -b packages/sdk packages/dsec packages/bench
  if [ "$1" = orig ]; then
    git checkout HEAD -- $FILES
    for f in $NEWTESTS; do mv /tmp/sessfast-hold/$(basename $f) $f; done
  fi
}
for r in $(seq $1); do
  for v in orig new; do
    build $v
    echo "## $v round $r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    node packages/dsec/dist/src/cli/main.js bench hardening -n $2 --rounds 2 --warmup 3 --switches 10 --attaches 2 --out /var/tmp/sessfast-work/results-$v 2>&1 | grep -E "^exec   (dsec|crun spawn)|results: "
  done
done
build new
git status --short
