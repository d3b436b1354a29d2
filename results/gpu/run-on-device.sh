#!/usr/bin/env bash
# The GPU tests and benchmarks on a GPU machine, in steps that each fit a 10-minute command.
#
# From the repository root, after the kit is installed (bash .gpu/install-on-device.sh 9):
#
#     bash results/gpu/run-on-device.sh STEP [STEP ...]      # or: all
#
# Steps (results under $OUT/STEP/, $OUT defaults to results/gpu/out):
#   env         device, driver, versions; imports checked (every step first makes gpu_dedup importable)
#   test-gpu    pytest -m gpu: the gpu-marked tests (cuDF handoff, residency, RMM, batches, Dask-CUDA)
#   test-sim    the CUDA simulator cases and the PTX compile check (CPU-side; proves the image's numba-cuda)
#   test-backend  pytest --backend gpu over the stage, run and backend tests (every CPU test on the GPU backend)
#   test-all    pytest --backend gpu over the whole suite (long: split across calls with PYTEST_ARGS if needed)
#   bench-signatures   signature kernel vs cuDF str.minhash: 100k and 1M docs, char 5/24, word 5, 128/260 perms
#   bench-e2e   Parquet to deduplicated Parquet, GPU vs CPU on all cores, 1M docs (E2E_DOCS to change)
#   bench-dask  Dask-CUDA --workers 1 vs the single-process GPU run, 1M docs
# Every step writes its log and exit status; a failing step does not stop the next one.
set -u
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
OUT=${OUT:-results/gpu/out}
E2E_DOCS=${E2E_DOCS:-1000000}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
TIMEOUT=""  # pytest-timeout, where the image has it
$PY -c "import pytest_timeout" 2>/dev/null && TIMEOUT="--timeout 900"

# gpu_dedup.kernels and gpu_dedup.configs are the checkout's top-level kernels/ and configs/ (setup.py maps
# them): an editable install provides them, or, where the machine has no setuptools >= 77 to build one,
# links in this checkout.  Checked before every step: a fresh machine has neither.
ensure_project() {
  importable() { $PY -c "import gpu_dedup.kernels, gpu_dedup.configs" 2>/dev/null; }
  importable && return 0
  $PY -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/pip-install.txt" 2>&1
  importable && return 0
  ln -sfn ../kernels gpu_dedup/kernels && ln -sfn ../configs gpu_dedup/configs
  echo "editable install failed: linked gpu_dedup/kernels and gpu_dedup/configs" >> "$OUT/pip-install.txt"
  importable || echo "gpu_dedup.kernels is still not importable: see $OUT/pip-install.txt"
}

step_env() {
  nvidia-smi > "$1/nvidia-smi.txt" 2>&1
  $PY - <<'PY' > "$1/versions.txt" 2>&1
import importlib
for mod in ("gpu_dedup", "numpy", "pandas", "pyarrow", "numba", "numba_cuda", "cupy", "cudf", "rmm", "dask",
            "distributed", "dask_cuda", "dask_cudf", "pynvml", "pytest", "hypothesis", "scipy", "yaml"):
    try:
        m = importlib.import_module(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as exc:
        print(mod, "MISSING", type(exc).__name__, exc)
from gpu_dedup.backends import get_backend
gpu = get_backend("gpu")
print("mode:", gpu.mode)
PY
}

step_test_gpu() { $PY -m pytest -q -m gpu -rfEs -p no:cacheprovider $TIMEOUT ${PYTEST_ARGS:-} > "$1/pytest.txt" 2>&1; }

step_test_sim() {
  $PY -m pytest -q -rfEs -p no:cacheprovider tests/kernels/test_cuda_sim.py tests/kernels/test_cuda_compile.py \
    tests/kernels/test_cosine_cuda_sim.py tests/kernels/test_cosine_cuda_compile.py > "$1/pytest.txt" 2>&1
}

step_test_backend() {
  $PY -m pytest -q --backend gpu -rfEs -p no:cacheprovider $TIMEOUT \
    ${PYTEST_ARGS:-tests/stages tests/backends tests/run/test_local.py tests/test_api.py} > "$1/pytest.txt" 2>&1
}

step_test_all() { $PY -m pytest -q --backend gpu -rfEs -p no:cacheprovider $TIMEOUT ${PYTEST_ARGS:-} > "$1/pytest.txt" 2>&1; }

step_bench_signatures() {
  $PY -m gpu_dedup.bench.gpu --docs 100000 1000000 --perms 128 260 --shingles char:5 char:24 word:5 \
    --out "$1/signatures.json" > "$1/log.txt" 2>&1
}

step_bench_e2e() {
  $PY -m gpu_dedup.bench.gpu --suite end-to-end --e2e-docs $E2E_DOCS --e2e-backends cpu gpu gpu-pyarrow --workdir /tmp \
    --out "$1/end-to-end.json" > "$1/log.txt" 2>&1
}

step_bench_dask() {
  $PY -m gpu_dedup.bench.gpu --suite dask --e2e-docs $E2E_DOCS --workdir /tmp --out "$1/dask.json" > "$1/log.txt" 2>&1
}

steps=("$@")
[ ${#steps[@]} -eq 0 ] && { sed -n '2,20p' "$0"; exit 2; }
[ "${steps[0]}" = all ] && steps=(env test-gpu test-sim test-backend bench-signatures bench-e2e bench-dask)
ensure_project
for s in "${steps[@]}"; do
  fn="step_${s//-/_}"
  if ! declare -F "$fn" > /dev/null; then echo "unknown step $s"; exit 2; fi
  dir="$OUT/$s"; mkdir -p "$dir"
  start=$(date +%s)
  "$fn" "$dir"; rc=$?
  echo "$rc" > "$dir/rc"
  echo "step $s: exit $rc in $(( $(date +%s) - start ))s; $dir"
  tail -n 3 "$dir"/*.txt 2>/dev/null | tail -n 4
done
