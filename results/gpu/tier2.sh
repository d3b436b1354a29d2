#!/usr/bin/env bash
# Tier 2 of the first GPU contact: the RAPIDS stack (cuDF reader and writer, RMM pool, Dask-CUDA with one
# worker, cuGraph components when the kit has it) and the signature kernel against cuDF's str.minhash.
#
# Before: the kit of ../shared/gpu (pack.sh here; its parts copied to /tmp/gpu-parts on the GPU machine, one
# run call each; results/gpu/README.md, "Tier 2").  Then, on the GPU machine, in the repository root:
#
#   FC_KIT_PARTS=9 bash results/gpu/tier2.sh          # installs the kit into /tmp/site, then measures
#   bash results/gpu/tier2.sh --dry-run               # here: kit files, pins, test paths, command lines
#
# Same options, variables, time budget and outputs as first-contact.sh (summary.md, summary.json,
# logs.tar.gz under $OUT).
set -u
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
"$PY" gpu_dedup/bench/first_contact.py --tier 2 --python "$PY" "$@"
rc=$?
# on the device (OUT set): a driver that could not start still leaves a summary saying so
if [ -n "${OUT:-}" ] && [ ! -s "$OUT/summary.md" ]; then
  mkdir -p "$OUT"
  printf '# gpu_dedup GPU tier 2\n\nThe driver did not run: %s gpu_dedup/bench/first_contact.py exited with %s.\n' \
    "$PY" "$rc" > "$OUT/summary.md"
  cat "$OUT/summary.md"
fi
exit $rc
