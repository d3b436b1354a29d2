#!/usr/bin/env bash
# Tier 1 of the first GPU contact: one command, about 8 minutes, nothing to carry.
#
#   bash results/gpu/first-contact.sh                 # on the GPU machine, in the repository root
#   bash results/gpu/first-contact.sh --rehearse      # here, on the CPU (CUDA simulator, tiny corpus)
#
# Options (see python3 gpu_dedup/bench/first_contact.py --help): --steps a,b  --fail-step NAME  --cap STEP=S
# --deadline S.  FC_DOCS (end-to-end documents, default 1000000), FC_SIG_DOCS, FC_SMOKE_DOCS, FC_WARMUP_DOCS,
# FC_CONFIGS, FC_WORDS, FC_SIG_PERMS, FC_DEADLINE override the sizes; FC_PROFILE=1 profiles each end-to-end
# GPU run (cProfile, into the logs).  Writes summary.md, summary.json and logs.tar.gz to $OUT (default
# /tmp/gpu-dedup-first-contact/out); prints the summary's table last.
set -u
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
"$PY" gpu_dedup/bench/first_contact.py --python "$PY" "$@"
rc=$?
# on the device (OUT set): a driver that could not start still leaves a summary saying so
if [ -n "${OUT:-}" ] && [ ! -s "$OUT/summary.md" ]; then  # the driver itself did not start (a Python that cannot run it)
  mkdir -p "$OUT"
  printf '# gpu_dedup first contact\n\nThe driver did not run: %s gpu_dedup/bench/first_contact.py exited with %s.\n' \
    "$PY" "$rc" > "$OUT/summary.md"
  cat "$OUT/summary.md"
fi
exit $rc
