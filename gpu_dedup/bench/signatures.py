"""Signature stage alone, side by side in one process, one thread: gpu_dedup against rensa.

    gpu-dedup bench signatures [--docs 100000] [--repeats 5] [--results bench-results]

Both tools run in this process on one thread (``numba.set_num_threads(1)``,
``RAYON_NUM_THREADS=1``), alternating, ``--repeats`` times each; the best
time of each counts (the least disturbed by other work on a shared machine).
Process CPU time is reported beside wall time: on a machine shared with other
jobs the wall time of a one-thread call includes time the thread waited.

* **gpu_dedup**: ``CPUBackend.minhash`` on the normalized text buffers: its
  time includes tokenizing, shingling and hashing (as in a run).
* **rensa**: ``RMinHash.digest_matrix_from_token_sets`` on ready-made lists
  of shingle strings (built untimed, as ``bench peers`` does).

Same corpus (the planted corpus of ``bench peers``), word 5-grams, 128
permutations.  A second table times the permutation step alone for three
families on the same random keys (the choice behind hash family v2,
``kernels/hash_scalar.py``): 32-bit affine maps (v2), 64-bit multiply-shift
``((a*x + b) mod 2**64) >> 32`` on 64-bit keys, and Dietzfelbinger's
multiply-add-shift of a 32-bit key with 64-bit ``a, b``; each as explicit
vector code (16 permutations per operation, eight keys per pass, the
production sweep's structure), so only the arithmetic and its lane width
differ.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before rensa starts its thread pool

import numba  # noqa: E402
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from gpu_dedup.backends import get_backend  # noqa: E402
from gpu_dedup.backends.strings import string_buffers  # noqa: E402
from gpu_dedup.bench import machine, scratch, write_results  # noqa: E402
from gpu_dedup.bench.argtypes import at_least, positive_int  # noqa: E402
from gpu_dedup.bench.peers import _read_corpus, peer_shingles  # noqa: E402
from gpu_dedup.bench.workers import make_corpus  # noqa: E402
from gpu_dedup.config import Config  # noqa: E402
from gpu_dedup.kernels.params import hash_params  # noqa: E402
from gpu_dedup.stages.normalize import normalize  # noqa: E402


def _timed(fn, repeats: int):
    """Best wall and best process-CPU seconds of ``repeats`` calls (after one untimed call)."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)


# ---------------------------------------------------------------- permutation families


LANES = 16  # permutations per explicit vector operation (one AVX-512 register of 64-bit values)
KEYS = 8  # keys folded per pass, as in the production sweep (kernels/hash_cpu.py)


def _family_intrinsic(family: str):
    """``sig[j:j+LANES] = min(sig[j:j+LANES], h(xs[i+q]) for q < KEYS)`` for one family, as explicit vector IR
    (like the production sweep), so every family gets the widest registers the CPU has.

    * ``affine32``: ``(a*x + b) mod 2**32`` on 32-bit lanes (hash family v2);
    * ``multiply_shift64``: ``((a*x + b) mod 2**64) >> 32`` on 64-bit lanes, 64-bit keys;
    * ``multiply_add_shift32``: the same with 32-bit keys (Dietzfelbinger), 64-bit ``a``, ``b``.
    """
    wide = family != "affine32"
    lane = ir.IntType(64 if wide else 32)
    vec = ir.VectorType(lane, LANES)
    vec32 = ir.VectorType(ir.IntType(32), LANES)
    splat = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES)

    @intrinsic
    def fold(typingctx, a, b, sig, j, xs, i):
        def codegen(context, builder, signature, args):
            arr_a, arr_b, arr_sig, at, arr_xs, first = args

            def ptr(arrty, value, vt):
                data = context.make_array(arrty)(context, builder, value=value).data
                return builder.bitcast(builder.gep(data, [at]), vt.as_pointer())

            va = builder.load(ptr(signature.args[0], arr_a, vec), align=4)
            vb = builder.load(ptr(signature.args[1], arr_b, vec), align=4)
            ps = ptr(signature.args[2], arr_sig, vec32)
            m = builder.load(ps, align=4)
            keys = context.make_array(signature.args[4])(context, builder, value=arr_xs).data
            for q in range(KEYS):
                x = builder.load(builder.gep(keys, [builder.add(first, ir.Constant(first.type, q))]))
                if family == "multiply_add_shift32":
                    x = builder.lshr(x, ir.Constant(x.type, 32))
                xv = builder.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
                xv = builder.shuffle_vector(xv, ir.Constant(vec, ir.Undefined), splat)
                h = builder.add(builder.mul(va, xv), vb)
                if wide:
                    h = builder.trunc(builder.lshr(h, ir.Constant(vec, [32] * LANES)), vec32)
                m = builder.select(builder.icmp_unsigned("<", h, m), h, m)
            builder.store(m, ps, align=4)
            return context.get_dummy_value()

        return types.void(a, b, sig, j, xs, i), codegen

    return fold


_FOLD = {name: _family_intrinsic(name) for name in ("affine32", "multiply_shift64", "multiply_add_shift32")}
_fold_affine32 = _FOLD["affine32"]
_fold_multiply_shift64 = _FOLD["multiply_shift64"]
_fold_multiply_add_shift32 = _FOLD["multiply_add_shift32"]


@numba.njit(cache=True)
def _affine32(xs, a, b, sig):
    for i in range(0, xs.shape[0] - KEYS + 1, KEYS):
        for j in range(0, a.shape[0], LANES):
            _fold_affine32(a, b, sig, j, xs, i)


@numba.njit(cache=True)
def _multiply_shift64(xs, a, b, sig):
    for i in range(0, xs.shape[0] - KEYS + 1, KEYS):
        for j in range(0, a.shape[0], LANES):
            _fold_multiply_shift64(a, b, sig, j, xs, i)


@numba.njit(cache=True)
def _multiply_add_shift32(xs, a, b, sig):
    for i in range(0, xs.shape[0] - KEYS + 1, KEYS):
        for j in range(0, a.shape[0], LANES):
            _fold_multiply_add_shift32(a, b, sig, j, xs, i)


FAMILIES = {"affine32 (v2)": _affine32, "multiply-shift 64-bit key": _multiply_shift64,
            "multiply-add-shift 32-bit key": _multiply_add_shift32}


def _reference_min(keys, a, b, family: str) -> np.ndarray:
    """The minima by NumPy (Python ints where products exceed 64 bits), to check each loop."""
    if family.startswith("affine"):
        h = (a.astype(np.uint64)[None, :] * keys.astype(np.uint64)[:, None] + b.astype(np.uint64)) & np.uint64(2**32 - 1)
    else:
        x = keys if "64-bit" in family else keys >> np.uint64(32)
        h = (a[None, :] * x[:, None] + b) >> np.uint64(32)  # NumPy uint64 products wrap: mod 2**64
    return h.min(axis=0).astype(np.uint32)


def permutation_families(keys: int = 1 << 20, num_perm: int = 128, repeats: int = 5, seed: int = 0) -> list:
    """M keys/s of each family's permutation loop (``num_perm`` permutations, a multiple of 16), one thread."""
    rng = np.random.default_rng(seed)
    keys64 = rng.integers(0, 2**63, keys, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    keys32 = (keys64 >> np.uint64(32)).astype(np.uint32)
    a64 = rng.integers(0, 2**63, num_perm, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    b64 = rng.integers(0, 2**63, num_perm, dtype=np.int64).astype(np.uint64)
    a32, b32 = (a64 & np.uint64(0xFFFFFFFF)).astype(np.uint32), (b64 >> np.uint64(32)).astype(np.uint32)
    rows = []
    for name, fn in FAMILIES.items():
        args = (keys32, a32, b32) if name.startswith("affine") else (keys64, a64, b64)
        sig = np.full(num_perm, 0xFFFFFFFF, np.uint32)
        fn(args[0][:1024], args[1], args[2], sig)
        with np.errstate(over="ignore"):
            assert np.array_equal(sig, _reference_min(args[0][:1024], args[1], args[2], name)), name
        wall, cpu = _timed(lambda: fn(*args, sig), repeats)
        rows.append({"family": name, "keys": keys, "num_perm": num_perm, "wall_seconds": round(wall, 4),
                     "cpu_seconds": round(cpu, 4), "m_keys_per_s": round(keys / cpu / 1e6, 1)})
        print(f"  {name:<30} {keys / cpu / 1e6:7.1f} M keys/s ({num_perm} permutations, CPU time)", flush=True)
    return rows


# ---------------------------------------------------------------- the signature stage


def signature_stage(corpus: Path, num_perm: int = 128, shingle: str = "word", ngram: int = 5, repeats: int = 5) -> dict:
    """Each tool's signatures of the corpus on one thread (Numba's threads of the calling thread set back after)."""
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return _signature_stage(corpus, num_perm, shingle, ngram, repeats)
    finally:
        numba.set_num_threads(threads)


def _signature_stage(corpus: Path, num_perm: int, shingle: str, ngram: int, repeats: int) -> dict:
    cfg = Config(backend="cpu")
    texts = _read_corpus(corpus).column("text")
    strings = string_buffers(normalize(texts, cfg.normalize))
    params = hash_params(cfg.minhash.seed, num_perm)
    be = get_backend("cpu")
    ours_shingles = int(be.minhash(strings, params, shingle, ngram)[1].sum())
    rows = {"gpu_dedup": {"shingles": ours_shingles, "input": "normalized text buffers (tokenized, shingled, "
                          "hashed inside the kernel)"}}
    fns = {"gpu_dedup": lambda: be.minhash(strings, params, shingle, ngram)}
    try:
        import rensa

        tokens = peer_shingles(texts.to_pylist(), shingle, ngram)
        rows["rensa"] = {"shingles": sum(map(len, tokens)), "input": "lists of shingle strings (built untimed)",
                         "version": getattr(rensa, "__version__", None)}
        fns["rensa"] = lambda: rensa.RMinHash.digest_matrix_from_token_sets(tokens, num_perm, cfg.minhash.seed)
    except ImportError as exc:
        print(f"  rensa not measured: {exc}")
    best = {name: [float("inf"), float("inf")] for name in fns}
    for fn in fns.values():
        fn()  # load (or compile) and warm up, untimed
    for _ in range(repeats):  # alternate the tools: both see the same machine load
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            best[name][0] = min(best[name][0], time.perf_counter() - w0)
            best[name][1] = min(best[name][1], time.process_time() - c0)
    for name, (wall, cpu) in best.items():
        r = rows[name]
        r.update(wall_seconds=round(wall, 4), cpu_seconds=round(cpu, 4),
                 m_shingles_per_s_wall=round(r["shingles"] / wall / 1e6, 1),
                 m_shingles_per_s_cpu=round(r["shingles"] / cpu / 1e6, 1))
        print(f"  {name:<10} {wall:7.3f} s wall {cpu:7.3f} s CPU: {r['m_shingles_per_s_wall']:6.1f} M shingles/s "
              f"(wall), {r['m_shingles_per_s_cpu']:6.1f} (CPU)", flush=True)
    out = {"documents": len(strings), "text_mb": round(strings.nbytes / 1e6, 1), "num_perm": num_perm,
           "shingle": f"{shingle}:{ngram}", "threads": 1, "repeats": repeats, "tools": rows}
    if "rensa" in rows:
        out["ratio_cpu"] = round(rows["gpu_dedup"]["m_shingles_per_s_cpu"] / rows["rensa"]["m_shingles_per_s_cpu"], 2)
        out["ratio_wall"] = round(rows["gpu_dedup"]["m_shingles_per_s_wall"] / rows["rensa"]["m_shingles_per_s_wall"],
                                  2)
        print(f"  gpu_dedup / rensa per thread: {out['ratio_cpu']}x (CPU time), {out['ratio_wall']}x (wall)")
    return out


def markdown(p: dict) -> str:
    m = p["machine"]
    s = p["signatures"]
    lines = [f"Measured {p['date']} on {m['cpu']}, {m['cores']} cores; one thread per tool, side by side in one "
             f"process, best of {s['repeats']} alternating repeats.", "",
             f"**Signature stage** ({s['documents']:,} planted documents, {s['text_mb']} MB, {s['shingle']}, "
             f"{s['num_perm']} permutations):", "",
             "| tool | input | shingles | wall s | CPU s | M shingles/s (wall) | M shingles/s (CPU) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in s["tools"].items():
        lines.append(f"| {name} | {r['input']} | {r['shingles']:,} | {r['wall_seconds']} | {r['cpu_seconds']} | "
                     f"{r['m_shingles_per_s_wall']} | {r['m_shingles_per_s_cpu']} |")
    if "ratio_cpu" in s:
        lines += ["", f"gpu_dedup / rensa per thread: **{s['ratio_cpu']}x** (CPU time), {s['ratio_wall']}x (wall)."]
    lines += ["", "**Permutation step alone** (random keys, same loop, CPU time):", "",
              "| family | M keys/s |", "| --- | --- |"]
    lines += [f"| {r['family']} | {r['m_keys_per_s']} |" for r in p["families"]]
    return "\n".join(lines) + "\n"


def bench_signatures(docs: int = 100_000, repeats: int = 5, results="bench-results", corpus=None, workdir=None) -> dict:
    with scratch(workdir) as tmp:
        if corpus is None:
            corpus = Path(tmp) / "planted"
            make_corpus(corpus, docs)
        print(f"signature stage, one thread ({docs:,} documents):", flush=True)
        sig = signature_stage(Path(corpus), repeats=repeats)
    print("permutation step alone:", flush=True)
    fam = permutation_families(repeats=repeats)
    payload = {"benchmark": "signatures", "date": _dt.date.today().isoformat(), "machine": machine(),
               "signatures": sig, "families": fam}
    write_results(results, "signatures", payload, markdown(payload))
    return payload


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu-dedup bench signatures", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=at_least(6), default=100_000, help="planted corpus size (documents)")
    p.add_argument("--corpus", help="a Parquet corpus (id, text) instead of the planted one")
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--results", default="bench-results")
    args = p.parse_args(argv)
    bench_signatures(args.docs, args.repeats, args.results, args.corpus)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
