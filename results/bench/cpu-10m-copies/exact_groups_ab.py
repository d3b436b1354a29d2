"""exact_groups of two checkouts side by side, in one process, taken in turn: 10^7 keys where every document has
nine copies (the copies 10^6 rows apart, one length), and 10^7 keys of which 30 % are copied over others.

    python exact_groups_ab.py BEFORE_REPO AFTER_REPO
"""
import importlib.util
import sys
import time

import numpy as np


def load(repo, name):
    spec = importlib.util.spec_from_file_location(name, f"{repo}/gpu_dedup/stages/exact.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


before, after = load(sys.argv[1], "before_exact"), load(sys.argv[2], "after_exact")
rng = np.random.default_rng(7)
copied = np.tile(rng.integers(0, 2**63, (1_000_000, 3), dtype=np.uint64), (10, 1))
copied[:, 0] = 39  # one byte length
some = rng.integers(0, 2**63, (10_000_000, 3), dtype=np.uint64)
some[rng.integers(0, 10_000_000, 3_000_000)] = some[rng.integers(0, 10_000_000, 3_000_000)]
some[:, 0] >>= np.uint64(50)  # lengths of a few bits
for label, keys in (("10^7, every one with 9 copies", copied), ("10^7, 30 % copied", some)):
    ranks = np.arange(keys.shape[0])
    for _ in range(3):
        got = {}
        for name, module in (("before", before), ("after", after)):
            t0 = time.perf_counter()
            got[name] = module.exact_groups(keys, ranks)
            print(f"{label}: {name} {time.perf_counter() - t0:.3f} s", flush=True)
        assert np.array_equal(got["before"], got["after"])
