set -e
cd /work/wt-session
FILES="packages/dsec/src/edge/backends/shared/session-table.ts packages/dsec/src/edge/backends/shared/shell-session.ts packages/dsec/src/edge/backends/shared/session-state.ts"
NEWTESTS="packages/dsec/test/fast/session-table.test.ts packages/dsec/test/fast/session-shell.test.ts packages/dsec/test/fast/support/host-shell.ts"
git checkout 5e981b2 -- $FILES
mkdir -p /tmp/sessfast-hold && for f in $NEWTESTS; do mv $f /tmp/sessfast-hold/; done
npx tsc -b packages/sdk packages/dsec packages/bench
rm -rf /var/tmp/sessfast-work/base/packages/dsec/dist
cp -a packages/dsec/dist /var/tmp/sessfast-work/base/packages/dsec/
git checkout HEAD -- $FILES
for f in $NEWTESTS; do mv /tmp/sessfast-hold/$(basename $f) $f; done
npx tsc -b packages/sdk packages/dsec packages/bench
git status --short
