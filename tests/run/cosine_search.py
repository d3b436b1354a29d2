"""Cases of the seeded random search over cosine dedup (tests/run/test_cosine_search.py), each checked against the
slow reference (tests/reference_cosine.py).

A case is a small corpus and config drawn from its seed, one of:

- ``vectors``: an embedding column (dims 1..1025, float16/32/64, list / large_list / fixed_size_list) with
  exact copies, near copies, antiparallel rows, zero vectors, huge and tiny magnitudes, NaN / inf / null
  values, null rows, rows of another length, float64 beyond float32; thresholds 0.01..0.9999999, bits,
  bands x rows, keep policies, split_chains, exact_dedup, cosine.bad_vectors error / keep;
- ``text``: tf / tf-idf vectors of word or char n-grams (non-ASCII, empty and one-token texts, vocabularies
  of 5..5000 words, idf_bits 8..20);
- ``shards``: the same float32 vectors over Parquet shards of different list types and float widths and
  JSON Lines shards, against one in-memory frame;
- ``index``: half the corpus indexed (``index_out``), the other half run ``against`` it, against the full
  run with ``split_chains: false`` (vectors or tf text vectors).

What is checked: bad input is one InputError where ``cosine.bad_vectors: error`` says so, never another
exception; the report's unsigned counts equal the reference's statuses; every removed row's survivor is
kept, in the same component of the reference's graph (pairs sharing a reference band bucket at or above the
threshold by the reference's exact cosine, and exact copies), and with split_chains at or above the
threshold to it; without split_chains the clusters are the reference's components; a second run is identical.
"""
import json
import math
import random
import shutil
import struct
import traceback

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import gpu_dedup
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup
from tests import reference_cosine as ref


def f32(v):
    try:
        return struct.unpack("f", struct.pack("f", v))[0]
    except OverflowError:
        return math.copysign(math.inf, v)


def gen_vectors(rng):
    n = rng.randint(2, 14)
    d = rng.choice([1, 2, 3, 5, 8, 16, 64, 200, 1000, 1025]) if rng.random() < 0.9 else rng.randint(1, 1000)
    base = [[rng.gauss(0, 1) for _ in range(d)] for _ in range(max(1, n // 3))]
    rows = []
    for i in range(n):
        b = rng.choice(base)
        k = rng.random()
        if k < 0.3:
            r = list(b)
        elif k < 0.55:
            r = [v + rng.gauss(0, 0.05) for v in b]
        elif k < 0.62:
            r = [-v for v in b]
        elif k < 0.7:
            s = rng.choice([1e-30, 1e-20, 1e20, 1e30, 3.0e38, 1e-40, 2.0 ** -140])
            r = [v * s for v in b]
        elif k < 0.75:
            r = [0.0] * d
        else:
            r = [rng.gauss(0, 1) for _ in range(d)]
        rows.append(r)
    bad = rng.random() < 0.4
    if bad:
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(n)
            kind = rng.choice(["nan", "inf", "null_val", "null_row", "short", "long", "big64"])
            if not rows[i]:
                continue
            if kind in ("nan", "inf", "null_val", "big64"):  # one value of the row
                rows[i] = list(rows[i])
                rows[i][rng.randrange(d)] = {"nan": math.nan, "inf": -math.inf, "null_val": None, "big64": 1e300}[kind]
            elif kind == "null_row":
                rows[i] = None
            elif kind == "short":
                rows[i] = rows[i][:-1] if d > 1 else []
            else:
                rows[i] = list(rows[i]) + [1.0]
    return rows


def arrow_col(rows, typ, kind, rng, d):
    vt = {"f16": pa.float16(), "f32": pa.float32(), "f64": pa.float64()}[typ]
    if typ == "f16":
        rows = [None if r is None else [None if v is None else float(np.float16(v)) for v in r] for r in rows]
    if kind == "fixed":
        if any(r is not None and len(r) != d for r in rows):
            kind = "list"
        else:
            flat = [v for r in rows for v in (r if r is not None else [0.0] * d)]
            mask = pa.array([r is None for r in rows])
            return pa.FixedSizeListArray.from_arrays(_values(flat, vt), d, mask=mask), rows
    lt = pa.list_(vt) if kind == "list" else pa.large_list(vt)
    if typ == "f16":  # pa.array does not take Python floats as float16
        offs = [0]
        flat = []
        for r in rows:
            flat += r or []
            offs.append(len(flat))
        ocls = pa.ListArray if kind == "list" else pa.LargeListArray
        offsets = pa.array(offs, pa.int32() if kind == "list" else pa.int64())
        return ocls.from_arrays(offsets, _values(flat, vt), mask=pa.array([r is None for r in rows])), rows
    return pa.array(rows, lt), rows


def _values(flat, vt):
    """Arrow values of type ``vt`` (None: a null value)."""
    if vt != pa.float16():
        return pa.array(flat, vt)
    return pa.array(np.array([np.nan if v is None else v for v in flat], np.float16),
                    mask=np.array([v is None for v in flat], bool))


def oracle_status(rows):
    dim = next((len(r) for r in rows if r is not None), None)
    st, f = [], []
    for r in rows:
        x = None if r is None else [math.nan if v is None else f32(v) for v in r]
        if x is None:
            st.append("null")
        elif len(x) != dim or dim == 0:
            st.append("bad_length")
        elif any(not math.isfinite(v) for v in x):
            st.append("non_finite")
        elif all(v == 0 for v in x):
            st.append("zero_vector")
        else:
            st.append("ok")
        f.append(x if st[-1] == "ok" else None)
    return st, f


class UF:
    """Union-find over rows."""

    def __init__(self, n):
        self.p = list(range(n))

    def f(self, a):
        while self.p[a] != a:
            self.p[a] = self.p[self.p[a]]
            a = self.p[a]
        return a

    def u(self, a, b):
        self.p[self.f(b)] = self.f(a)


def check_result(res, n, t, usable, hashes, sim, split, exact_keys, tag):
    errs = []
    kept, cl = np.asarray(res.kept), np.asarray(res.clusters)
    uf = UF(n)
    buckets = ref.groups(hashes, valid=usable)
    for _b, mem in buckets:
        m = sorted(mem)
        for a in m:
            for b in m:
                if a < b and sim(a, b) >= t:
                    uf.u(a, b)
    if exact_keys is not None:
        seen = {}
        for i, k in enumerate(exact_keys):
            if k is not None:
                if k in seen:
                    uf.u(seen[k], i)
                else:
                    seen[k] = i
    for i in range(n):
        c = int(cl[i])
        if not kept[i]:
            if not kept[c]:
                errs.append(f"{tag}: removed {i} survivor {c} not kept")
            if uf.f(i) != uf.f(c):
                errs.append(f"{tag}: removed {i} survivor {c} not in one oracle component")
            same_key = exact_keys is not None and exact_keys[i] is not None and exact_keys[i] == exact_keys[c]
            if split and not same_key:
                if sim(i, c) < t - 1e-12:
                    errs.append(f"{tag}: removed {i} survivor {c} cos {sim(i, c)} < {t}")
        else:
            if c != i:
                errs.append(f"{tag}: kept {i} has cluster {c}")
    comp, got = {}, {}  # without split_chains the clusters are the reference's components
    for i in range(n):
        comp.setdefault(uf.f(i), []).append(i)
        got.setdefault(int(cl[i]), []).append(i)
    incomplete = (not split) and sorted(map(sorted, comp.values())) != sorted(map(sorted, got.values()))
    if incomplete:
        errs.append(f"{tag}: clusters {sorted(got.values())} != reference components {sorted(comp.values())}")
    return errs, incomplete


def vec_case(rng, seed):
    rows = gen_vectors(rng)
    d = next((len(r) for r in rows if r is not None), 1) or 1
    typ, kind = rng.choice(["f16", "f32", "f64"]), rng.choice(["list", "large", "fixed"])
    col, rows = arrow_col(rows, typ, kind, rng, d)
    n = len(rows)
    t = rng.choice([0.01, 0.05, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 0.9999999])
    bits = rng.choice([64, 128, 256, 1024])
    over = {"similarity": "cosine", "vector_column": "emb", "threshold": t, "backend": "cpu",
            "cosine.bits": bits, "cosine.seed": rng.randint(0, 100),
            "split_chains": rng.random() < 0.6, "exact_dedup": rng.random() < 0.5,
            "keep": rng.choice(["first", "lowest_id", "longest", "score"]),
            "cosine.bad_vectors": rng.choice(["error", "keep"])}
    if rng.random() < 0.5:
        r_ = rng.randint(1, 64)
        over["cosine.rows"], over["cosine.bands"] = r_, rng.randint(1, max(1, bits // r_))
    tab = pa.table({"emb": col, "id": pa.array([f"d{i:03d}" for i in range(n)]), "score": pa.array([rng.random() for _ in range(n)]),
                    "text": pa.array(["x" * rng.randint(0, 5) for _ in range(n)])})
    if over["keep"] == "score":
        over["score"] = "score"
    return tab, rows, over


def run_case(rng, seed, stats):
    tab, rows, over = vec_case(rng, seed)
    n = tab.num_rows
    tag = f"seed={seed} n={n} type={tab.column('emb').type} over={over}"
    st, fr = oracle_status(rows)
    bad = any(s in ("non_finite", "bad_length") for s in st)
    try:
        res = gpu_dedup.dedup(tab, id="id", **over)
    except (InputError, ConfigError) as e:
        msg = str(e)
        if over["cosine.bad_vectors"] == "error" and bad:
            stats["expected_errors"] += 1
            return []
        return [f"{tag}: unexpected {type(e).__name__}: {msg}"]
    except Exception:
        return [f"{tag}: TRACEBACK {traceback.format_exc()}"]
    if over["cosine.bad_vectors"] == "error" and bad:
        return [f"{tag}: expected an error for statuses {st}"]
    errs = []
    c = res.report["counts"]
    if c.get("null_text") != st.count("null"):
        errs.append(f"{tag}: null_text {c.get('null_text')} != oracle {st.count('null')}")
    for k in ("zero_vector", "non_finite", "bad_length"):
        if c.get(f"unsigned_{k}") != st.count(k):
            errs.append(f"{tag}: unsigned_{k} {c.get('unsigned_' + k)} != oracle {st.count(k)} ({st})")
    bands, r_ = res.report["lsh"]["bands"], res.report["lsh"]["rows"]
    bits, seedc = over["cosine.bits"], over["cosine.seed"]
    dim = next((len(x) for x in fr if x is not None), 1)
    planes = ref.hyperplanes(dim, bits, seedc) if any(x is not None for x in fr) and dim * bits <= 300000 else None
    if planes is None and any(x is not None for x in fr):
        stats["skipped_big"] += 1
        return errs
    hashes, usable = [], []
    for x in fr:
        if x is None:
            hashes.append([0] * bands)
            usable.append(False)
            continue
        b, s = ref.signature_bits(x, bits, seedc, planes)
        hashes.append(ref.band_hashes(ref.pack(b), bands, r_))
        usable.append(s == 0)
    cache = {}
    def sim(a, b):
        if fr[a] is None or fr[b] is None: return 0.0
        k = (min(a, b), max(a, b))
        if k not in cache:
            cache[k] = ref.cosine(fr[a], fr[b])
        return cache[k]
    keys = None
    if over["exact_dedup"]:
        keys = [tuple(x) if x is not None else None for x in fr]
    e2, inc = check_result(res, n, over["threshold"], usable, hashes, sim, over["split_chains"], keys, tag)
    errs += e2
    if inc:
        stats["incomplete"] += 1
    # determinism / representation
    res2 = gpu_dedup.dedup(tab, id="id", **over)
    if not (np.array_equal(res.kept, res2.kept) and np.array_equal(res.clusters, res2.clusters)):
        errs.append(f"{tag}: second run differs")
    return errs


WORDS = ["a", "b", "cc", "ddd", "é", "日本", "straße", "x1", "ω", "🙂", "the", "of", "and"]


def text_case(rng):
    n = rng.randint(2, 12)
    vocab = WORDS + [f"w{i}" for i in range(rng.choice([5, 50, 5000]))]
    base = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(max(1, n // 3))]
    texts = []
    for i in range(n):
        k = rng.random()
        b = rng.choice(base)
        if k < 0.3: t = b
        elif k < 0.6:
            w = b.split()
            if w:
                w[rng.randrange(len(w))] = rng.choice(vocab)
            t = " ".join(w)
        elif k < 0.7: t = ""
        elif k < 0.8: t = rng.choice(vocab)
        elif k < 0.85: t = "   "
        else: t = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 40)))
        texts.append(None if rng.random() < 0.05 else t)
    t = rng.choice([0.05, 0.3, 0.5, 0.8, 0.9, 0.99])
    bits = rng.choice([64, 128, 256])
    over = {"similarity": "cosine", "threshold": t, "backend": "cpu", "cosine.bits": bits,
            "cosine.seed": rng.randint(0, 100), "split_chains": rng.random() < 0.6, "exact_dedup": rng.random() < 0.5,
            "keep": rng.choice(["first", "lowest_id", "longest"]),
            "cosine.text.shingle": rng.choice(["word", "char"]), "cosine.text.ngram": rng.choice([1, 2, 3, 5]),
            "cosine.text.weighting": rng.choice(["tf", "tfidf"]), "cosine.text.idf_bits": rng.choice([8, 9, 20]),
            "normalize.unicode": "none", "normalize.lowercase": False, "normalize.punctuation": False,
            "normalize.whitespace": False}
    if rng.random() < 0.5:
        r_ = rng.randint(1, 64)
        over["cosine.rows"], over["cosine.bands"] = r_, rng.randint(1, max(1, bits // r_))
    return texts, over


def run_text_case(rng, seed, stats):
    texts, over = text_case(rng)
    n = len(texts)
    tag = f"TEXT seed={seed} n={n} over={over} texts={texts!r}"[:3000]
    tab = pa.table({"text": pa.array(texts), "id": pa.array([f"d{i:03d}" for i in range(n)])})
    try:
        res = gpu_dedup.dedup(tab, id="id", **over)
    except (InputError, ConfigError) as e:
        return [f"{tag}: unexpected {type(e).__name__}: {e}"]
    except Exception:
        return [f"{tag}: TRACEBACK {traceback.format_exc()}"]
    t, sh, ng = over["threshold"], over["cosine.text.shingle"], over["cosine.text.ngram"]
    data = [b"" if x is None else x.encode() for x in texts]
    idf, ib = None, over["cosine.text.idf_bits"]
    if over["cosine.text.weighting"] == "tfidf":
        idf = ref.idf_weights(ref.document_frequencies(data, sh, ng, ib), n)
    vecs = [{} if texts[i] is None else ref.term_vector(x, sh, ng, idf, ib) for i, x in enumerate(data)]
    bands, r_ = res.report["lsh"]["bands"], res.report["lsh"]["rows"]
    hashes = [ref.band_hashes(ref.pack(ref.simhash(v, over["cosine.bits"], over["cosine.seed"])), bands, r_)
              if v else [0] * bands for v in vecs]
    usable = [bool(v) for v in vecs]
    errs = []
    c = res.report["counts"]
    empty = [i for i in range(n) if not usable[i] and texts[i] is not None]
    want_empty = len({data[i] for i in empty}) if over["exact_dedup"] else len(empty)
    if c.get("unsigned_empty_text") != want_empty:
        errs.append(f"{tag}: unsigned_empty_text {c.get('unsigned_empty_text')} != {want_empty}")
    def sim(a, b):
        return ref.sparse_cosine(vecs[a], vecs[b])

    keys = [None if texts[i] is None else x for i, x in enumerate(data)] if over["exact_dedup"] else None
    e2, inc = check_result(res, n, t, usable, hashes, sim, over["split_chains"], keys, tag)
    if inc:
        stats["incomplete"] += 1
    return errs + e2


def shard_case(rng, seed, tmp):
    """Multi-shard run (Parquet list/large_list/fixed_size_list float32/float64, JSON Lines) equals the
    single-frame run of the same float32 values."""
    rows = gen_vectors(rng)
    d = next((len(r) for r in rows if r is not None), 1) or 1
    rows = [None if r is None else [math.nan if v is None else f32(v) for v in r] for r in rows]
    n = len(rows)
    over = {"similarity": "cosine", "vector_column": "emb", "threshold": rng.choice([0.3, 0.8, 0.9, 0.99]),
            "backend": "cpu", "cosine.bits": rng.choice([64, 256]), "split_chains": rng.random() < 0.5,
            "exact_dedup": rng.random() < 0.5, "cosine.bad_vectors": "keep"}
    ids = [f"d{i:03d}" for i in range(n)]
    frame = pa.table({"id": pa.array(ids), "emb": pa.array(rows, pa.list_(pa.float32()))})
    base = gpu_dedup.dedup(frame, id="id", **over)
    root = tmp / f"s{seed}"
    shutil.rmtree(root, ignore_errors=True)
    (root / "in").mkdir(parents=True)
    k = rng.randint(1, min(4, n))
    cuts = sorted(rng.sample(range(1, n), k - 1)) if k > 1 else []
    bounds = [0] + cuts + [n]
    kinds = []
    for s in range(k):
        lo, hi = bounds[s], bounds[s + 1]
        kind = rng.choice(["list32", "list64", "large32", "fixed32", "fixed64", "jsonl"])
        part = rows[lo:hi]
        if kind.startswith("fixed") and any(r is not None and len(r) != d for r in part):
            kind = "list32"
        kinds.append(kind)
        name = root / "in" / f"p{s:02d}.{'jsonl' if kind == 'jsonl' else 'parquet'}"
        if kind == "jsonl":
            name.write_text("".join(json.dumps({"id": ids[lo + i], "emb": r}) + "\n" for i, r in enumerate(part)))
            continue
        vt = pa.float64() if kind.endswith("64") else pa.float32()
        if kind.startswith("fixed"):
            flat = pa.array([v for r in part for v in (r if r is not None else [0.0] * d)], vt)
            col = pa.FixedSizeListArray.from_arrays(flat, d, mask=pa.array([r is None for r in part]))
        else:
            col = pa.array(part, pa.large_list(vt) if kind.startswith("large") else pa.list_(vt))
        pq.write_table(pa.table({"id": pa.array(ids[lo:hi]), "emb": col}), name)
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "exact_dedup": over["exact_dedup"],
                            "input": {"id_column": "id", "vector_column": "emb"},
                            "lsh": {"threshold": over["threshold"]}, "select": {"split_chains": over["split_chains"]},
                            "cosine": {"bits": over["cosine.bits"], "bad_vectors": "keep"}})
    tag = f"SHARDS seed={seed} kinds={kinds} bounds={bounds} over={over}"
    try:
        res = run_dedup(root / "in", root / "out", cfg)
    except Exception as e:
        return [f"{tag}: {type(e).__name__}: {str(e)[:500]}"]
    if not (np.array_equal(res.kept, base.kept) and np.array_equal(res.cluster, base.clusters)):
        return [f"{tag}: differs from one frame kept={res.kept.astype(int)} base={base.kept.astype(int)}"]
    return []


def index_case(rng, seed, tmp):
    text_mode = rng.random() < 0.4
    root = tmp / f"i{seed}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    if text_mode:
        texts, _ = text_case(rng)
        n = len(texts)
        col = {"text": pa.array(texts)}
    else:
        rows = gen_vectors(rng)
        rows = [None if r is None else [math.nan if v is None else f32(v) for v in r] for r in rows]
        n = len(rows)
        col = {"emb": pa.array(rows, pa.list_(pa.float32()))}
    if n < 2:
        return []
    cut = rng.randint(1, n - 1)
    t = pa.table({"id": pa.array([f"d{i:03d}" for i in range(n)]), **col})
    pq.write_table(t.slice(0, cut), root / "a.parquet")
    pq.write_table(t.slice(cut), root / "b.parquet")
    d = {"backend": "cpu", "similarity": "cosine", "exact_dedup": rng.random() < 0.5,
         "input": {"id_column": "id", "vector_column": None if text_mode else "emb"},
         "lsh": {"threshold": rng.choice([0.3, 0.8, 0.9, 0.99])}, "select": {"split_chains": False},
         "cosine": {"bits": rng.choice([64, 256]), "bad_vectors": "keep",
                    "text": {"weighting": "tf", "shingle": rng.choice(["word", "char"]), "ngram": rng.choice([1, 3])}}}
    cfg = Config.from_dict(d)
    tag = f"INDEX seed={seed} text={text_mode} cut={cut} n={n} cfg={d}"
    try:
        run_dedup([root / "a.parquet"], root / "o1", cfg, index_out=root / "idx")
        inc = run_dedup([root / "b.parquet"], root / "o2", cfg, against=root / "idx")
        index = Index.open(root / "idx")
        b, r = index.manifest["config"]["bands"], index.manifest["config"]["rows"]
        full = run_dedup([root / "a.parquet", root / "b.parquet"], root / "f", cfg.with_overrides({"cosine.bands": b, "cosine.rows": r}))
    except Exception:
        return [f"{tag}: {traceback.format_exc()[-1500:]}"]
    if not (inc.kept == full.kept[cut:]).all():
        return [f"{tag}: incremental kept {inc.kept.astype(int)} != full {full.kept[cut:].astype(int)} (full all {full.kept.astype(int)})"]
    return []


KINDS = ("vectors", "vectors", "text", "shards", "index")


def one_case(seed: int, tmp) -> tuple:
    """(kind, problems, stats) of case ``seed``: problems empty when the case agrees with the reference."""
    kind = KINDS[seed % len(KINDS)]
    rng = random.Random(seed)
    stats = {"expected_errors": 0, "incomplete": 0, "skipped_big": 0}
    try:
        if kind == "vectors":
            problems = run_case(rng, seed, stats)
        elif kind == "text":
            problems = run_text_case(rng, seed, stats)
        elif kind == "shards":
            problems = shard_case(rng, seed, tmp)
        else:
            problems = index_case(rng, seed, tmp)
    except Exception:
        problems = [f"seed={seed} {kind}: the check itself failed: {traceback.format_exc()}"]
    return kind, problems, stats
