#!/bin/bash
# alternate a checkout before the change and one after it, 3 invocations each of 3 runs, for one block_rows
# setting: ab.sh BLOCK_ROWS BEFORE_REPO AFTER_REPO (0: the default block_rows); results in $WORK/results.jsonl
BR=$1 BEFORE=$2 AFTER=$3
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python3}
for round in 1 2 3; do
  PYTHONPATH=$BEFORE $PY "$HERE/bench.py" 3 "$BR" "before-$BR"
  PYTHONPATH=$AFTER $PY "$HERE/bench.py" 3 "$BR" "after-$BR"
done
