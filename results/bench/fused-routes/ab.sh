#!/bin/bash
# alternate main (before) and the branch (after), 3 invocations each of 3 runs, for one block_rows setting
BR=$1
for round in 1 2 3; do
  PYTHONPATH=/work/main /work/main/.venv/bin/python /tmp/hb/bench.py 3 $BR before-$BR >> /tmp/hb/ab.log 2>&1
  PYTHONPATH=/tmp/hb/snap /work/main/.venv/bin/python /tmp/hb/bench.py 3 $BR after-$BR >> /tmp/hb/ab.log 2>&1
done
