#!/usr/bin/env bash
# Old and new code taken in turn, two rounds: `gpu-dedup bench gpu --suite dask` with one CPU worker, the host
# routes, 10^6 planted documents.  OLD_CHECKOUT / OLD_PYTHON: a checkout of the old commit and a Python that
# imports gpu_dedup from it; NEW_CHECKOUT: this checkout (with .venv); CORPORA: where the planted corpus is kept.
set -euo pipefail
for r in 1 2; do for arm in old new; do
  if [ "$arm" = old ]; then cd "$OLD_CHECKOUT"; PY="$OLD_PYTHON"; else cd "$NEW_CHECKOUT"; PY=.venv/bin/python; fi
  timeout 900 "$PY" -m gpu_dedup.bench.gpu --suite dask --dask-backend cpu --dask-workers 1 --dask-shuffles host \
      --dask-no-memory-probe --e2e-docs 1000000 --corpus-dir "$CORPORA" 2>/dev/null \
    | grep '^{' | sed "s/^{/{\"arm\": \"$arm\", \"round\": $r, /"
done; done
