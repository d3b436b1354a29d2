"""Does changing select.keep or select.split_chains between runs against one index give a result that no single
configuration gives?  Chain-heavy corpora (40 chains of 3-9 documents of 30-60 words, each document 1-3 word
edits -- replace, insert, delete -- from the previous one, 214-263 documents) shuffled into two parts: part 0 builds
the index (--index-out), part 1 runs --against it with --update-index.  Each mixed pair (part 0 with one value,
part 1 with the other) is compared with both values used throughout, with one full dedup under each, and with
each value's own guarantee (README, "Incremental dedup and queries"):

- split_chains true: every removed document is at or above the threshold to its kept survivor;
- split_chains false: each run removes from its own documents exactly what one dedup of all the documents so
  far removes from them.

Run from the repository root:  PYTHONPATH=. python tools/index_settings_experiment.py 0 1 2 3 4
(one JSON line per seed and pair; about 13 s a seed on two cores).  Seeds 0-4 gave:

- keep first -> longest and longest -> first: 6-14 and 16-29 documents decided otherwise than with either value
  throughout, but in all 10 cases exactly (removed set and every survivor) what one run with keep = score gives
  when the score ranks part 0's documents first (by part 0's policy), then part 1's (by part 1's): a change of
  keep is a change of ranking for new clusters, and every run against an index already ranks its indexed
  documents first.  No removed document below the threshold or with a survivor that is not kept.
- split_chains true -> false: 12-15 removed documents below the threshold to their survivor (0 with true
  throughout) and 3-6 documents of part 0 not removed as the false rule removes them (0 with false throughout).
- split_chains false -> true: 3-9 removed documents below the threshold (0 with true throughout) and 7-12
  documents of part 1 not removed as the false rule removes them (0 with false throughout).

So a change of keep is meaningful but consistent (accepted), and a change of split_chains gives results that
follow neither value's rule (an index records it and refuses another value).

Other settings (--settings=star_rounds,star_rounds_wide,star_rounds_wide8,threshold,verify_threshold,
verify_method,exact_dedup; see OTHER): each mixed pair is compared, whole decisions (kept, survivor), with each
value throughout, incremental and full.  Seeds 0-2 (0-4 for star_rounds_wide*, exact_dedup) gave:

- lsh.threshold 0.8 <-> 0.7 with the layout given (16 x 8), and verify.threshold 0.8 -> 0.7: the removed set
  differs from the nearer value's by 21-31 documents (part 1 decided at its threshold, part 0 at the index's):
  no single threshold gives it (refused; the index records verify_threshold).
- lsh.star_rounds 1 <-> 3, 2 <-> 4 with 16 x 8 (the default) and 32 x 2: every value removes the same documents
  (another band links what a centre rejects).  With 4 x 1 and 8 x 2: 16 of the 20 runs mixing 1 and 3 removed a
  set neither value removes throughout, 1-11 documents off the nearer one (2 <-> 4: 6 of 20, 1-2): refused.
- verify.method signature -> exact (and none -> exact, which with split_chains decides as signature does): 5-13
  documents off the nearer value's set: refused.  exact -> signature or none: refused already (the index has no
  signatures; none crashed with a KeyError before).
- exact_dedup true <-> false (a corpus with 20% exact copies, half differing in case and punctuation): the same
  decisions as every value throughout (exact copies are near duplicates at similarity 1): accepted.
"""
import random, shutil, sys, tempfile, json
from pathlib import Path
import pyarrow as pa, pyarrow.compute as pc, pyarrow.parquet as pq
from gpu_dedup.config import Config
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.normalize import normalize
from tests import reference as ref

NGRAM, T = 3, 0.8

# The mixed runs are what an index refuses (another split_chains, threshold, ...): the experiment measures what they
# would give, so it skips the check (Index.check) that refuses them.
Index.check = lambda self, cfg: None

def corpus(seed, chains=40, copies=0.0):
    rng = random.Random(seed); vocab = [f"w{i}" for i in range(400)]; texts = []
    for _ in range(chains):
        words = [rng.choice(vocab) for _ in range(rng.randint(30, 60))]
        for k in range(rng.randint(3, 9)):
            if k:
                words = list(words)
                for _ in range(rng.randint(1, 3)):
                    op = rng.random()
                    if op < 0.5: words[rng.randrange(len(words))] = rng.choice(vocab)
                    elif op < 0.75: words.insert(rng.randrange(len(words) + 1), rng.choice(vocab))
                    elif len(words) > 5: del words[rng.randrange(len(words))]
            texts.append(" ".join(words))
    for d in range(int(len(texts) * copies)):  # exact copies (some differ only in case and punctuation)
        t = texts[rng.randrange(len(texts))]
        texts.append(t.upper() + "!" if d % 2 else t)
    order = list(range(len(texts))); rng.shuffle(order)
    part = {d: i % 2 for i, d in enumerate(order)}
    return texts, part

def write(root, texts, part):
    for k in (0, 1):
        docs = [d for d in range(len(texts)) if part[d] == k]
        # score: part 0 by input order (first), part 1 by length (longest): one ranking of both parts
        # one ranking of both parts: part 0 before part 1; s_fl: part 0 by input order, part 1 by length
        # (first then longest); s_lf: part 0 by length, part 1 by input order (longest then first)
        order = [-float(i) for i in range(len(docs))]; length = [float(len(texts[d])) for d in docs]
        fl = [1e9 + x for x in order] if k == 0 else length
        lf = [1e9 + x for x in length] if k == 0 else [1e6 + x for x in order]
        t = pa.table({"id": docs, "text": [texts[d] for d in docs], "s_fl": fl, "s_lf": lf})
        (root / f"p{k}").mkdir(parents=True); pq.write_table(t, root / f"p{k}" / "part.parquet")
        (root / "all").mkdir(exist_ok=True); pq.write_table(t, root / "all" / f"p{k}.parquet")

def cfg(**sel):
    return Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "minhash": {"ngram": NGRAM},
                             "lsh": {"threshold": T}, "select": sel})

def cfg_of(dotted):
    """cfg() with dotted overrides ({"lsh.star_rounds": 1})."""
    return cfg().with_overrides(dotted)

def dec(r):
    d = r.duplicates.to_pydict()
    return {i: (k, s) for i, k, s in zip(d["id"], d["kept"], d["survivor_id"])}

def incremental(root, c0, c1, tag):
    ix = root / f"ix-{tag}"
    r0 = run_dedup(root / "p0", root / f"o0-{tag}", c0, index_out=ix)
    r1 = run_dedup(root / "p1", root / f"o1-{tag}", c1, against=ix, update_index=True)
    shutil.rmtree(root / f"o0-{tag}"); shutil.rmtree(root / f"o1-{tag}")
    d = {**dec(r0), **dec(r1)}
    return d

def removed(d): return {i for i, (k, _) in d.items() if not k}

def unexplained(root, full, diff, part):
    """Docs decided otherwise than in the full dedup in a component no part-1 document joined (the contract
    says every difference lies in a component that a later document joined)."""
    ids = pc.cast(pq.read_table(root / "all").column("id"), pa.int64()).to_pylist()
    edges = list(zip(full.edges.src.tolist(), full.edges.dst.tolist()))
    edges += [(r, int(rep)) for r, rep in enumerate(full.rep) if rep != r]
    comp = ref.connected_components(len(ids), edges)
    members = {}
    for row, c in enumerate(comp): members.setdefault(c, []).append(ids[row])
    bad = 0
    for docs in members.values():
        ch = [d for d in docs if d in diff]
        if ch and not max(part[d] for d in docs) > min(part[d] for d in ch): bad += len(ch)
    return bad

def below(d, norm):
    """removed documents whose survivor is not kept, and those below the threshold to their survivor"""
    kept = {i for i, (k, _) in d.items() if k} | {i for i in range(len(norm)) if i not in d}
    nk = sum(1 for i, (k, s) in d.items() if not k and s not in kept)
    lo = sum(1 for i, (k, s) in d.items() if not k and ref.jaccard(norm[i], norm[s], "word", NGRAM) < T - 1e-9)
    return nk, lo

def false_contract(root, d, part, n):
    """split_chains false: each run removes from its own documents exactly what one dedup (false) of all the
    documents so far removes from them; mismatching documents of part 0 and of part 1"""
    F = cfg(split_chains=False)
    f0, f1 = removed(dec(run_dedup(root / "p0", None, F))), removed(dec(run_dedup(root / "all", None, F)))
    m = removed(d)
    return [len({i for i in m ^ f0 if part[i] == 0}), len({i for i in m ^ f1 if part[i] == 1})]

def below_parts(d, norm, part):
    return [below({i: v for i, v in d.items() if part[i] == k}, norm)[1] for k in (0, 1)]

# Other settings that decide which documents are removed, changed between part 0 and part 1 (--settings NAME,...):
# dotted overrides of each pair.  lsh.threshold is changed with the layout fixed (16 x 8): the run's layout stays
# the index's, only the verification threshold moves.
OTHER = {
    "star_rounds": [({"lsh.star_rounds": 1}, {"lsh.star_rounds": 3}), ({"lsh.star_rounds": 3}, {"lsh.star_rounds": 1}),
                    ({"lsh.star_rounds": 2}, {"lsh.star_rounds": 4})],
    "threshold": [({"lsh.bands": 16, "lsh.rows": 8}, {"lsh.bands": 16, "lsh.rows": 8, "lsh.threshold": 0.7}),
                  ({"lsh.bands": 16, "lsh.rows": 8, "lsh.threshold": 0.7}, {"lsh.bands": 16, "lsh.rows": 8})],
    "verify_threshold": [({}, {"verify.threshold": 0.7})],
    "verify_method": [({"verify.method": "signature"}, {"verify.method": "exact"}),
                      ({}, {"verify.method": "none"}), ({"verify.method": "none"}, {})],
    "exact_dedup": [({}, {"exact_dedup": False}), ({"exact_dedup": False}, {})],
}
# star_rounds matters where a bucket's centre rejects members and no other band links them: a layout of few bands
# and rows (4 x 1, 8 x 2) fills a few buckets with documents well below the threshold to each other (with 16 x 8 or
# 32 x 2, one value or another removes the same documents: another band links what a centre rejects)
for tag, lay in (("wide", {"lsh.bands": 4, "lsh.rows": 1}), ("wide8", {"lsh.bands": 8, "lsh.rows": 2})):
    OTHER[f"star_rounds_{tag}"] = [({**lay, "lsh.star_rounds": a}, {**lay, "lsh.star_rounds": b})
                                   for a, b in ((1, 3), (3, 1), (2, 4), (4, 2))]
COPIES = {"exact_dedup": 0.2}  # the corpus of a setting: its fraction of exact copies added


def decided(d, n):
    """Every document's (kept, survivor): documents not in duplicates.parquet are kept, their own survivor."""
    return {i: d.get(i, (True, i)) for i in range(n)}


def below_at(d, norm, part, t):
    """Removed documents of each part below the threshold of that part (t[k]) to their survivor."""
    return [sum(1 for i, (k, s) in d.items() if not k and part[i] == p
                and ref.jaccard(norm[i], norm[s], "word", NGRAM) < t[p] - 1e-9) for p in (0, 1)]


def other(root, seed, name, a, b, texts, part, norm):
    """One mixed pair of another setting: the mixed run against both values throughout (incremental and full)."""
    A, B = cfg_of(a), cfg_of(b)
    n = len(texts)
    try:
        mixed = decided(incremental(root, A, B, "mix"), n)
    except Exception as exc:  # refused, or failed: say so
        shutil.rmtree(root / "ix-mix", ignore_errors=True)
        shutil.rmtree(root / "o1-mix", ignore_errors=True); shutil.rmtree(root / "o0-mix", ignore_errors=True)
        return {"seed": seed, "setting": name, "part0": a, "part1": b, "error": f"{type(exc).__name__}: {exc}"[:300]}
    shutil.rmtree(root / "ix-mix")
    incA = decided(incremental(root, A, A, "a"), n); shutil.rmtree(root / "ix-a")
    incB = decided(incremental(root, B, B, "b"), n); shutil.rmtree(root / "ix-b")
    fullA = decided(dec(run_dedup(root / "all", None, A)), n)
    fullB = decided(dec(run_dedup(root / "all", None, B)), n)
    m = removed(mixed)
    t = [A.verify_threshold, B.verify_threshold]
    return {"seed": seed, "setting": name, "part0": a, "part1": b, "docs": n,
            "removed_mixed,incA,incB,fullA,fullB": [len(m)] + [len(removed(x)) for x in (incA, incB, fullA, fullB)],
            "mixed_equals_incA,incB,fullA,fullB": [mixed == x for x in (incA, incB, fullA, fullB)],
            "removed_set_diff_vs_incA,incB,fullA,fullB": [len(m ^ removed(x)) for x in (incA, incB, fullA, fullB)],
            "removed_set_diff_per_part_vs_incA,incB": [[len({i for i in m ^ removed(x) if part[i] == p})
                                                        for p in (0, 1)] for x in (incA, incB)],
            "below_own_part_threshold_mixed,incA,incB": [below_at(mixed, norm, part, t), below_at(incA, norm, part, [t[0]] * 2),
                                                         below_at(incB, norm, part, [t[1]] * 2)]}


def main(seeds, settings=("keep", "split_chains")):
    rows = []
    for seed in seeds:
        if [s for s in settings if s not in ("keep", "split_chains")]:
            for name in settings:
                if name not in OTHER:
                    continue
                root = Path(tempfile.mkdtemp(prefix=f"exp{seed}-"))
                texts, part = corpus(seed, copies=COPIES.get(name, 0.0)); write(root, texts, part)
                norm = normalize(pa.array(texts, pa.large_string())).to_pylist()
                for a, b in OTHER[name]:
                    row = other(root, seed, name, a, b, texts, part, norm)
                    rows.append(row); print(json.dumps(row), flush=True)
                shutil.rmtree(root)
        if not {"keep", "split_chains"} & set(settings):
            continue
        root = Path(tempfile.mkdtemp(prefix=f"exp{seed}-"))
        texts, part = corpus(seed); write(root, texts, part)
        norm = normalize(pa.array(texts, pa.large_string())).to_pylist()
        for name, a, b in (("keep", {"keep": "first"}, {"keep": "longest"}),
                           ("keep", {"keep": "longest"}, {"keep": "first"}),
                           ("split_chains", {"split_chains": True}, {"split_chains": False}),
                           ("split_chains", {"split_chains": False}, {"split_chains": True})):
            if name not in settings:
                continue
            A, B = cfg(**a), cfg(**b)
            mixed = incremental(root, A, B, "mix"); shutil.rmtree(root / "ix-mix")
            incA = incremental(root, A, A, "a"); shutil.rmtree(root / "ix-a")
            incB = incremental(root, B, B, "b"); shutil.rmtree(root / "ix-b")
            fullA, fullB = run_dedup(root / "all", None, A), run_dedup(root / "all", None, B)
            m = removed(mixed)
            row = {"seed": seed, "setting": name, "part0": a, "part1": b, "docs": len(texts),
                   "removed_mixed": len(m), "removed_incA": len(removed(incA)), "removed_incB": len(removed(incB)),
                   "diff_vs_incA": len(m ^ removed(incA)), "diff_vs_incB": len(m ^ removed(incB)),
                   "unexplained_vs_fullA": unexplained(root, fullA, m ^ removed(dec(fullA)), part),
                   "unexplained_vs_fullB": unexplained(root, fullB, m ^ removed(dec(fullB)), part),
                   "unexplained_incA_vs_fullA": unexplained(root, fullA, removed(incA) ^ removed(dec(fullA)), part),
                   "unexplained_incB_vs_fullB": unexplained(root, fullB, removed(incB) ^ removed(dec(fullB)), part),
                   "mixed_survivor_not_kept,below_T": below(mixed, norm),
                   "incA_below": below(incA, norm), "incB_below": below(incB, norm)}
            if name == "split_chains":
                row["below_T_per_part: mixed, incTrue"] = [below_parts(mixed, norm, part),
                    below_parts(incA if a["split_chains"] else incB, norm, part)]
                row["false_contract_mismatch_per_part: mixed, incFalse"] = [false_contract(root, mixed, part, len(texts)),
                    false_contract(root, incB if a["split_chains"] else incA, part, len(texts))]
            if name == "keep":
                S = cfg(keep="score", score_column="s_fl" if a["keep"] == "first" else "s_lf")
                incS = incremental(root, S, S, "s"); shutil.rmtree(root / "ix-s")
                row["mixed_equals_single_keep_score_ranking"] = incS == mixed
                row["diff_vs_incScore"] = len(m ^ removed(incS))
            rows.append(row); print(json.dumps(row), flush=True)
        shutil.rmtree(root)

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--settings=")]
    chosen = [a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--settings=")]
    main([int(s) for s in args] or [0], *(chosen[-1:] or []))
