"""The stage functions over many partitions give what they give over one: exact groups, star rounds,
connected components (large-star / small-star) and chain splitting, with rows routed by key in process
the way the Dask executor routes them between workers."""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.stages import frames
from gpu_dedup.stages.buckets import bucket_part, long_frame
from gpu_dedup.stages.edges import StarRounds, star_rounds, unique_edges
from gpu_dedup.stages.exact import exact_copies, exact_groups
from gpu_dedup.stages.selection import ChainSplit, ClusterPart, cluster_start, split_chains, survivors

C = importlib.import_module("gpu_dedup.stages.components")  # the module (the package exports its function)


def route(parts, dest, n, **kw):
    """In process, what Executor.route does: rows to partitions, in source order."""
    out = [[] for _ in range(n)]
    for p in parts:
        d = dest(p, n, **kw) if frames.size(p) else np.zeros(0, np.int64)
        for k in range(n):
            out[k].append(frames.take(p, np.flatnonzero(d == k)))
    return [frames.concat(o, like=parts[0]) for o in out]


def split(frame, n, seed=0):
    """A frame cut into ``n`` contiguous blocks."""
    cuts = np.linspace(0, frames.size(frame), n + 1).astype(int)
    return [frames.take(frame, np.arange(cuts[i], cuts[i + 1])) for i in range(n)]


def graph(seed, n=400, m=300):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    keep = src != dst
    return src[keep].astype(np.int64), dst[keep].astype(np.int64)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 7))
def test_large_star_small_star_over_partitions_equals_union_find(seed, parts):
    src, dst = graph(seed)
    want = C.local_components({"src": src, "dst": dst}, "cpu")
    a = [C.unique_pairs_part(p) for p in route(split({"x": np.minimum(src, dst), "y": np.maximum(src, dst)}, parts),
                                                frames.hash_dest, parts, on=("x", "y"))]
    for _ in range(64):
        b = [C.large_star(p) for p in route([C.both_directions({"src": q["x"], "dst": q["y"]}) for q in a],
                                            frames.hash_dest, parts, on="x")]
        b = [C.unique_pairs_part(p) for p in route(b, frames.hash_dest, parts, on=("x", "y"))]
        c = [C.small_star(p) for p in route([C.small_star_orient(q) for q in b], frames.hash_dest, parts, on="x")]
        c = [C.unique_pairs_part(p) for p in route(c, frames.hash_dest, parts, on=("x", "y"))]
        changed = sum(C.changed_pairs(x, y)["changed"] for x, y in zip(a, c))
        a = c
        if changed == 0:
            break
    else:
        pytest.fail("large-star / small-star did not converge")
    labels = [C.star_labels(p) for p in route(a, frames.hash_dest, parts, on="x")]
    got = frames.sort_by(frames.concat(route(labels, frames.hash_dest, parts, on="node")), "node")
    keep = np.r_[True, got["node"][1:] != got["node"][:-1]]
    assert np.array_equal(got["node"][keep], want["node"]) and np.array_equal(got["label"][keep], want["label"])


@pytest.mark.parametrize("parts", [1, 3, 8])
def test_exact_groups_routed_by_key_equal_grouping_everything(parts):
    rng = np.random.default_rng(parts)
    n = 500
    keys = rng.integers(0, 40, (n, 3)).astype(np.uint64)
    rank = rng.permutation(n).astype(np.int64)
    want = exact_groups(keys, rank)
    rows = {"row": np.arange(n, dtype=np.int64), "rank": rank, "k0": keys[:, 0], "k1": keys[:, 1], "k2": keys[:, 2]}
    copies = frames.concat([exact_copies(p) for p in route(split(rows, parts), frames.hash_dest, parts,
                                                           on=("k0", "k1", "k2"))])
    got = np.arange(n)
    got[copies["row"]] = copies["rep"]
    assert np.array_equal(got, want)


def _bands(seed, n=600, b=6):
    rng = np.random.default_rng(seed)
    bh = rng.integers(0, 90, (n, b)).astype(np.uint64)  # few hash values: large, overlapping buckets
    return {"lsh_row": np.arange(n, dtype=np.int64), "band_hashes": bh}


@pytest.mark.parametrize("parts", [2, 5])
@pytest.mark.parametrize("rounds", [1, 3])
def test_star_rounds_over_bucket_partitions_equal_one_partition(parts, rounds):
    bands = _bands(parts * 10 + rounds)
    sim_of = np.random.default_rng(1).random((600, 600))

    def similarity(a, b):
        return sim_of[np.minimum(a, b), np.maximum(a, b)]

    whole = star_rounds(bucket_part_as_buckets(bucket_part(bands, 2)), similarity, 0.5, rounds)
    blocks = split(bands, parts)
    routed = route([long_frame(p) for p in blocks], frames.hash_dest, parts, on=("band", "hash"))
    states = [StarRounds(bucket_part_as_buckets(bucket_part(p, 2)), 0.5, rounds) for p in routed]
    for _ in range(rounds):  # every partition's round together, pairs scored once per round
        proposed = [s.propose() for s in states]
        for s, (src, dst) in zip(states, proposed):
            s.accept(similarity(src, dst) if src.shape[0] else None)
    got = [s.result() for s in states]
    verified = unique_edges(frames.concat([{"src": r.verified.src, "dst": r.verified.dst, "sim": r.verified.similarity}
                                           for r in got]))
    assert np.array_equal(verified["src"], whole.verified.src) and np.array_equal(verified["dst"], whole.verified.dst)
    assert np.array_equal(verified["sim"], whole.verified.similarity)


def bucket_part_as_buckets(d):
    from gpu_dedup.stages.buckets import from_dict

    return from_dict(d)


def clusters(seed: int, m: int, rank_seed: int, n: int = 300) -> tuple:
    """(src, dst, labels, ranks, rep) of a random graph's connected components: the input of chain splitting."""
    src, dst = graph(seed, n=n, m=m)
    comp = C.local_components({"src": src, "dst": dst}, "cpu")
    labels = np.arange(n, dtype=np.int64)
    labels[comp["node"]] = comp["label"]
    ranks = np.random.default_rng(rank_seed).permutation(n).astype(np.int64)
    return src, dst, labels, ranks, np.arange(n, dtype=np.int64)


@pytest.mark.parametrize("parts", [1, 4])
def test_chain_splitting_over_label_partitions_equals_the_whole_graph(parts):
    n = 300
    src, dst, labels, ranks, rep = clusters(7, 320, 2, n)
    sim_of = np.random.default_rng(3).random((n, n))

    def similarity(a, b):
        return sim_of[np.minimum(a, b), np.maximum(a, b)]

    def components(s, d, k):
        return get_backend_components(s, d, k)

    want_labels, want_surv, _, _ = split_chains(labels, rep, ranks, src, dst, similarity, 0.6, components)
    members = {"node": np.arange(n, dtype=np.int64), "label": labels, "rank": ranks, "rep_node": rep}
    edges = {"src": src, "dst": dst, "label": labels[src]}
    m_parts = route(split(members, parts), frames.hash_dest, parts, on="label")
    e_parts = route(split(edges, parts), frames.hash_dest, parts, on="label")
    states = [ClusterPart(m, e, 0.6, True, components, 0) for m, e in zip(m_parts, e_parts)]
    while not all(s.done for s in states):
        for s in states:
            p = s.propose()
            if p["src"].shape[0]:
                # the survivor first: a cluster executor moves the first ends' payloads (once per block)
                assert set(p["src"].tolist()) <= set(s.node[s.chain.survivor].tolist())
                assert not np.isin(p["dst"], s.node[s.chain.survivor]).any()
                s.accept(similarity(p["src"], p["dst"]))
    surv = np.arange(n)
    for s in states:
        near = s.finish()
        surv[s.node] = s.node[s.survivor]
        assert np.array_equal(near["src"], s.node[s.survivor[s.near]])
    assert np.array_equal(surv, want_surv)
    assert sum(s.clusters_before for s in states) == int((np.bincount(labels, minlength=n) > 1).sum())


def get_backend_components(s, d, k):
    from gpu_dedup.backends import get_backend

    return get_backend("cpu").components(s, d, k)


def test_survivors_do_not_depend_on_label_values():
    labels = np.array([5, 5, 9, 9, 9, 2])
    ranks = np.array([3, 1, 0, 4, 2, 5])
    dense = np.unique(labels, return_inverse=True)[1]
    assert np.array_equal(survivors(labels, ranks), survivors(dense, ranks))


def test_chain_split_state_machine_equals_the_function():
    src, dst = graph(11, n=200, m=260)
    comp = C.local_components({"src": src, "dst": dst}, "cpu")
    labels = np.arange(200, dtype=np.int64)
    labels[comp["node"]] = comp["label"]
    ranks = np.arange(200, dtype=np.int64)[::-1].copy()
    sim_of = np.random.default_rng(4).random((200, 200))

    def similarity(a, b):
        return sim_of[np.minimum(a, b), np.maximum(a, b)]

    want = split_chains(labels, np.arange(200), ranks, src, dst, similarity, 0.7, get_backend_components)
    state = ChainSplit(labels, np.arange(200), ranks, src, dst, 0.7, get_backend_components)
    while not state.done:
        a, b = state.propose()
        if a.shape[0]:
            state.accept(similarity(a, b))
    got = state.result()
    assert all(np.array_equal(x, y) for x, y in zip(got[:3], want[:3])) and got[3] == want[3]


@pytest.mark.parametrize("parts", [1, 3])
def test_clusters_given_their_edges_similarities_score_no_pair_twice(parts):
    """The verified edges' similarities (NaN: unknown, as an index's joining edges) are not computed again, a
    pair scored by one chain-splitting round is not scored again by the next or by the survivors' pairs, and
    the outcome is the one that scores every pair."""
    n = 300
    src, dst, labels, ranks, rep = clusters(9, 340, 5, n)
    sim_of = np.random.default_rng(6).random((n, n)) * 0.5 + 0.45

    def similarity(a, b):
        return sim_of[np.minimum(a, b), np.maximum(a, b)]

    sim = similarity(src, dst)
    sim[::7] = np.nan  # unknown
    members = {"node": np.arange(n, dtype=np.int64), "label": labels, "rank": ranks, "rep_node": rep}

    def run(edges):
        m_parts = route(split(members, parts), frames.hash_dest, parts, on="label")
        e_parts = route(split(edges, parts), frames.hash_dest, parts, on="label")
        scored = []

        def score(p):
            scored.extend(zip(np.minimum(p["src"], p["dst"]).tolist(), np.maximum(p["src"], p["dst"]).tolist()))
            return similarity(p["src"], p["dst"])

        states = [cluster_start(m, e, 0.6, True, "cpu", 0, reuse=True) for m, e in zip(m_parts, e_parts)]
        while not all(s.done for s in states):
            for s in states:
                p = s.propose()
                if p["src"].shape[0]:
                    s.accept(score(p))
        rows = [s.outputs(score(s.finish()))[0] for s in states]
        return frames.concat(rows), scored

    edges = {"src": src, "dst": dst, "label": labels[src]}
    want, everything = run(edges)
    got, scored = run({**edges, "sim": sim})
    order, want_order = np.argsort(got["node"]), np.argsort(want["node"])
    assert all(np.array_equal(got[k][order], want[k][want_order]) for k in want)
    known = set(zip(np.minimum(src, dst)[~np.isnan(sim)].tolist(), np.maximum(src, dst)[~np.isnan(sim)].tolist()))
    assert len(scored) == len(set(scored)) and not known & set(scored)
    assert len(scored) < len(everything) and known & set(everything)  # the reuse had something to save
