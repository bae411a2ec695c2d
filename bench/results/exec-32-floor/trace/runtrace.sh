#!/bin/bash
# runtrace.sh <root> <traced binary> <label>
root=$1; bin=$2; label=$3
orig=$root/packages/dsec/dist/native/dsec-spawn
cp $orig /tmp/x32/spawn-save-$label
cp $bin $orig
rm -f /tmp/x32/trace.txt
node /tmp/x32/timeline2.mjs $root 400 | sed "s/^/$label: /"
cp /tmp/x32/spawn-save-$label $orig
python3 /tmp/x32/analyze.py > /tmp/x32/an-$label-$4.txt
