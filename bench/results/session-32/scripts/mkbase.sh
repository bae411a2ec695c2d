# Builds HEAD (the last commit) into /var/tmp/sessfast-work/base, then the working tree again; both instrumented.
set -e
cd /work/wt-session
git stash -u -q
npx tsc -b packages/sdk packages/dsec packages/bench
rm -rf /var/tmp/sessfast-work/base/packages/dsec/dist
cp -a packages/dsec/dist /var/tmp/sessfast-work/base/packages/dsec/
git stash pop -q
npx tsc -b packages/sdk packages/dsec packages/bench
python3 /var/tmp/sessfast-work/instrument.py /work/wt-session
python3 /var/tmp/sessfast-work/instrument.py /var/tmp/sessfast-work/base
