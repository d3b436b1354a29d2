"""``backend.prepare(cfg)``: loads or compiles exactly the kernels a run with ``cfg`` calls, says so once.

The cold case runs in child processes with an empty Numba cache directory
(``NUMBA_CACHE_DIR``), as the first run after an install does.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpu_dedup.backends import get_backend
from gpu_dedup.backends.prepare import MESSAGE
from gpu_dedup.config import Config

CHILD = textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s")
    from gpu_dedup.backends import get_backend
    from gpu_dedup.config import Config
    from gpu_dedup.kernels import hash_cpu as k
    cfg = Config.from_dict(json.loads(sys.argv[1]))
    be = get_backend("cpu")
    seconds = be.prepare(cfg)
    again = be.prepare(cfg)
    names = ("exact_hashes", "minhash_word", "minhash_char", "band_hashes", "shingle_values_word",
             "shingle_values_char", "jaccard_pairs", "signature_similarity")
    print(json.dumps({"seconds": seconds, "again": again,
                      "compiled": {n: len(getattr(k, n).signatures) for n in names},
                      "misses": {n: sum(getattr(k, n).stats.cache_misses.values()) for n in names}}))
""")


def _child(cfg: dict, cache_dir) -> tuple[dict, str]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir), "NUMBA_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True, env=env,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_cold_prepare_compiles_only_what_the_config_uses_and_says_so_once(tmp_path):
    cfg = {"exact_dedup": False, "minhash": {"shingle": "word", "ngram": 3, "num_perm": 32},
           "verify": {"method": "signature"}}
    out, log = _child(cfg, tmp_path / "numba-cache")
    assert log.count(MESSAGE) == 1 and "gpu_dedup " + MESSAGE in log
    assert out["seconds"] > 0 and 0 <= out["again"] < out["seconds"]
    used = {"minhash_word": 1, "band_hashes": 1, "signature_similarity": 1}
    assert out["compiled"] == {n: used.get(n, 0) for n in out["compiled"]}, out["compiled"]
    assert all(out["misses"][n] == 1 for n in used)
    # the second process finds every kernel in the cache: nothing compiles, nothing is said
    out, log = _child(cfg, tmp_path / "numba-cache")
    assert MESSAGE not in log
    assert all(v == 0 for v in out["misses"].values()) and out["compiled"]["minhash_word"] == 1
    # another configuration compiles its own kernels only (char shingles, exact verification)
    cfg = {"exact_dedup": True, "minhash": {"shingle": "char", "ngram": 5, "num_perm": 32}}
    out, log = _child(cfg, tmp_path / "numba-cache")
    assert log.count(MESSAGE) == 1
    assert out["compiled"]["minhash_word"] == 0 and out["compiled"]["minhash_char"] == 1
    assert out["compiled"]["shingle_values_word"] == 0
    assert out["compiled"]["exact_hashes"] == out["compiled"]["shingle_values_char"] == out["compiled"]["jaccard_pairs"] == 1
    assert out["misses"]["band_hashes"] == 0  # shared with the first configuration: loaded, not compiled


def test_warm_prepare_in_process_is_quick_and_silent(caplog):
    be = get_backend("cpu")
    cfg = Config.from_dict({"minhash": {"num_perm": 16, "ngram": 2}})
    be.prepare(cfg)
    with caplog.at_level("INFO", logger="gpu_dedup"):
        seconds = be.prepare(cfg)
    assert MESSAGE not in caplog.text
    assert 0 <= seconds < 5


class CudaCompilingBackend:
    """The CPU backend, except that its normalization is counted and its exact hashes compile a CUDA kernel
    (to PTX, no device needed), as the GPU backend's first launches do."""

    def __init__(self, cpu):
        self.cpu, self.normalized = cpu, 0

    def __getattr__(self, name):
        return getattr(self.cpu, name)

    def normalize_column(self, column, cfg):
        self.normalized += 1
        return self.cpu.normalize_column(column, cfg)

    def exact_hashes(self, strings, seed1, seed2):
        from numba import cuda

        def touch(x):
            x[0] = 1

        cuda.compile_ptx(touch, "void(int64[::1])", cc=(8, 0))
        return self.cpu.exact_hashes(strings, seed1, seed2)


@pytest.mark.parametrize("source", ["text", "vectors"])
def test_a_cosine_run_prepares_its_own_kernels_not_minhash(source):
    """A cosine run calls no MinHash kernel: prepare loads what its family calls (SimHash, document frequencies
    and the sparse cosine of text vectors; the dense cosine of embeddings) on the backend."""
    from gpu_dedup.backends.prepare import prepare

    calls = []

    class Recording:
        def __init__(self, inner):
            self.inner, self.xp = inner, inner.xp

        def __getattr__(self, name):
            value = getattr(self.inner, name)
            if not callable(value):
                return value
            return lambda *a, **k: calls.append(name) or value(*a, **k)

    vector = {"input": {"vector_column": "emb"}} if source == "vectors" else {}
    prepare(Recording(get_backend("cpu")), Config.from_dict({"similarity": "cosine", **vector}))
    assert "minhash" not in calls and "shingle_sets" not in calls
    if source == "vectors":
        assert {"row_norms", "cosine_pairs"} <= set(calls) and "normalize_column" not in calls
    else:
        assert {"normalize_column", "exact_hashes", "text_features", "simhash_text", "sparse_norms",
                "sparse_cosine_pairs"} <= set(calls), calls


def _simulated() -> bool:
    from numba import config as numba_config

    return bool(numba_config.ENABLE_CUDASIM)


def test_prepare_normalizes_on_the_backend():
    """The GPU normalization kernel is the backend's normalize_column, so prepare must call that (not the host
    normalization) to compile it.  Runs under the CUDA simulator too."""
    from gpu_dedup.backends.prepare import prepare

    cpu = get_backend("cpu")

    class Counting(CudaCompilingBackend):
        def exact_hashes(self, strings, seed1, seed2):
            return self.cpu.exact_hashes(strings, seed1, seed2)

    backend = Counting(cpu)
    prepare(backend, Config.from_dict({"minhash": {"num_perm": 16, "ngram": 2}, "exact_dedup": True}))
    assert backend.normalized == 1


@pytest.mark.skipif(_simulated(), reason="the CUDA simulator compiles nothing (numba.cuda.compile_ptx is None "
                                         "under NUMBA_ENABLE_CUDASIM=1)")
def test_prepare_hears_numba_cuda_compiling(caplog):
    """numba-cuda raises its compile events on its own event module: prepare listens there too, and says once
    that kernels compile."""
    pytest.importorskip("numba_cuda")
    from numba import cuda  # noqa: F401  (the GPU backend has loaded the CUDA target before it prepares)

    from gpu_dedup.backends.prepare import prepare

    cfg = Config.from_dict({"minhash": {"num_perm": 16, "ngram": 2}, "exact_dedup": True})
    cpu = get_backend("cpu")
    cpu.prepare(cfg)  # every CPU kernel of cfg loaded: what compiles next is the CUDA kernel alone
    backend = CudaCompilingBackend(cpu)
    with caplog.at_level("INFO", logger="gpu_dedup"):
        _, compiled = prepare(backend, cfg)
    assert backend.normalized == 1
    assert compiled and caplog.text.count(MESSAGE) == 1
