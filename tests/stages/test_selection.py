import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.config import SelectConfig
from gpu_dedup.stages.selection import NodePositions, policy_ranks, survivors


def _table(**cols):
    n = len(next(iter(cols.values())))
    base = {"row": pa.array(np.arange(n)), "id": pa.array(list(range(n))), "text": pa.array([""] * n)}
    base.update(cols)
    return pa.table(base)


def test_first_is_input_order():
    assert list(policy_ranks(_table(text=pa.array(["a", "b", "c"])), SelectConfig("first"))) == [0, 1, 2]


def test_longest_counts_code_points_and_breaks_ties_by_row():
    t = _table(text=pa.array(["ab", "ééé", "xyz", None]))
    assert list(policy_ranks(t, SelectConfig("longest"))) == [2, 0, 1, 3]


def test_lowest_id_any_type():
    t = _table(id=pa.array(["b", "a", "c", "a"]))
    assert list(policy_ranks(t, SelectConfig("lowest_id"))) == [2, 0, 3, 1]


def test_score_highest_wins_nulls_last():
    t = _table(score=pa.array([0.5, None, 2.0, 2.0]))
    assert list(policy_ranks(t, SelectConfig("score", "q"))) == [2, 3, 0, 1]


def test_survivor_is_best_ranked_member_of_each_cluster():
    labels = np.array([0, 0, 2, 0, 2, 5])
    ranks = np.array([3, 1, 5, 0, 4, 2])
    assert list(survivors(labels, ranks)) == [3, 3, 4, 3, 4, 5]


# ---------------------------------------------------------------- split_chains (select.split_chains)

import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gpu_dedup.backends import get_backend  # noqa: E402
from gpu_dedup.stages.selection import split_chains  # noqa: E402


def _run_split(n, edges, sim, ranks=None, rep=None, t=0.8):
    src = np.array([a for a, b in edges], np.int64)
    dst = np.array([b for a, b in edges], np.int64)
    labels = get_backend("cpu").components(src, dst, n)
    rep = np.arange(n) if rep is None else np.asarray(rep)
    labels = labels[rep]
    ranks = np.arange(n) if ranks is None else np.asarray(ranks)
    calls = []

    def similarity(a, b):
        calls.append(len(a))
        return sim[a, b]

    return split_chains(labels, rep, ranks, src, dst, similarity, t, get_backend("cpu").components), calls


def test_chain_end_below_threshold_becomes_a_singleton():
    # A~B 0.9, B~C 0.9, but J(A, C) = 0.5: connected components put C with survivor A
    sim = np.array([[1, .9, .5], [.9, 1, .9], [.5, .9, 1]])
    (labels, survivor, ejected, rounds), _ = _run_split(3, [(0, 1), (1, 2)], sim)
    assert survivor.tolist() == [0, 0, 2]
    assert ejected.tolist() == [False, False, True] and rounds == 1
    assert labels[0] == labels[1] != labels[2]


def test_ejected_members_reform_a_cluster_with_a_new_survivor():
    # 0-1 and 2-3 are close pairs bridged by 1-2; 2 and 3 are far from survivor 0 but close to each other
    sim = np.full((5, 5), 0.3)
    np.fill_diagonal(sim, 1)
    for a, b, s in [(0, 1, .9), (1, 2, .82), (2, 3, .95), (3, 4, .85)]:
        sim[a, b] = sim[b, a] = s
    sim[2, 4] = sim[4, 2] = 0.6  # 4 follows 3 but not 2
    (labels, survivor, ejected, rounds), _ = _run_split(5, [(0, 1), (1, 2), (2, 3), (3, 4)], sim)
    assert survivor.tolist() == [0, 0, 2, 2, 4]
    assert ejected.tolist() == [False, False, True, True, True]
    assert rounds == 2  # {2, 3, 4} leave 0; then 4 leaves 2
    assert len(set(labels.tolist())) == 3


def test_an_indexed_document_below_the_threshold_leaves_with_the_new_documents_close_to_it():
    """Nodes 0 and 1 are indexed documents (ranked first), 2 and 3 new ones: 2 bridges 0 and 1, 3 is close to 1
    only.  A full dedup ejects 1 (0.7 to survivor 0) and 3, which re-form {1, 3} with survivor 1: 3 is removed.
    Indexed documents pinned in place (never ejected) left 3 alone and kept it."""
    sim = np.full((4, 4), 0.3)
    np.fill_diagonal(sim, 1)
    for a, b, s in [(0, 2, .9), (1, 2, .85), (0, 1, .7), (1, 3, .9), (0, 3, .75)]:
        sim[a, b] = sim[b, a] = s
    edges = [(0, 2), (1, 2), (1, 3)]
    (labels, survivor, ejected, _), _ = _run_split(4, edges, sim, ranks=[-8, -7, 0, 1])
    full = survivor.tolist()
    assert full == [0, 1, 0, 1] and ejected.tolist() == [False, True, False, True]
    src = np.array([a for a, b in edges], np.int64)
    dst = np.array([b for a, b in edges], np.int64)
    labels = get_backend("cpu").components(src, dst, 4)
    _, survivor, _, _ = split_chains(labels, np.arange(4), np.array([-8, -7, 0, 1]), src, dst,
                                     lambda a, b: sim[a, b], 0.8, get_backend("cpu").components,
                                     fixed=np.array([True, True, False, False]))
    assert survivor.tolist() == full  # the same clusters when the indexed documents are marked


def test_exact_copies_follow_their_representative():
    sim = np.array([[1, .9, .5, .5], [.9, 1, .9, .9], [.5, .9, 1, 1], [.5, .9, 1, 1]])
    rep = [0, 1, 2, 2]  # 3 is an exact copy of 2: it never enters the similarity computation
    (labels, survivor, ejected, _), calls = _run_split(4, [(0, 1), (1, 2)], sim, rep=rep)
    assert survivor.tolist() == [0, 0, 2, 2] and ejected.tolist() == [False, False, True, True]
    assert labels[2] == labels[3]


def test_no_chain_no_change_and_similarity_checked_once():
    sim = np.full((4, 4), 0.95)
    (labels, survivor, ejected, rounds), calls = _run_split(4, [(0, 1), (1, 2), (2, 3)], sim)
    assert survivor.tolist() == [0, 0, 0, 0] and not ejected.any() and rounds == 0
    assert calls == [3]


def test_split_chains_must_be_a_bool():
    from gpu_dedup.config import Config
    from gpu_dedup.errors import ConfigError

    assert Config.from_dict({"select": {"split_chains": True}}).select.split_chains is True
    with pytest.raises(ConfigError, match="select.split_chains = 'yes' has the wrong type; expected bool"):
        Config.from_dict({"select": {"split_chains": "yes"}})
    with pytest.raises(ConfigError, match="select.split_chains = 1 has the wrong type; expected bool"):
        SelectConfig(split_chains=1)  # built directly: checked as a YAML value is


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 14).flatmap(lambda n: st.tuples(
    st.just(n),
    st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
    st.lists(st.floats(0, 1), min_size=n * n, max_size=n * n),
    st.permutations(list(range(n))),
)))
def test_split_chains_properties(case):
    n, edges, flat, perm = case
    edges = [(min(a, b), max(a, b)) for a, b in edges if a != b]
    sim = np.array(flat).reshape(n, n)
    sim = (sim + sim.T) / 2
    ranks = np.array(perm)
    src = np.array([a for a, b in edges], np.int64)
    dst = np.array([b for a, b in edges], np.int64)
    before = get_backend("cpu").components(src, dst, n)
    (labels, survivor, ejected, _), _ = _run_split(n, edges, sim, ranks=ranks)
    again, _ = _run_split(n, edges, sim, ranks=ranks)
    assert np.array_equal(again[1], survivor)  # deterministic
    idx = np.arange(n)
    member = survivor != idx
    assert np.all(sim[idx[member], survivor[member]] >= 0.8)  # everyone reaches its survivor
    assert np.all(before[survivor] == before)  # clusters only split, never merge
    for s in np.unique(survivor):  # the survivor is the best-ranked member of its final cluster
        assert ranks[s] == ranks[survivor == s].min()
    # a member at >= threshold to its component's original survivor is never ejected; ejected = moved
    first = np.array([idx[before == before[i]][np.argmin(ranks[before == before[i]])] for i in idx])
    stays = (first != idx) & (sim[idx, first] >= 0.8)
    assert np.all(survivor[stays] == first[stays])
    assert np.array_equal(ejected, survivor != first)


@pytest.mark.parametrize("spread", [1, 3, 10**9])  # doc numbers dense, sparse enough for a table, too far apart
def test_node_positions_find_each_node_where_it_is_by_table_or_by_sort(spread):
    rng = np.random.default_rng(spread)
    nodes = rng.permutation(5000).astype(np.int64) * spread + 17
    where = NodePositions(nodes)
    assert (where.table is not None) == (spread < 10**9)
    asked = rng.choice(nodes, 20000)
    want = np.searchsorted(np.sort(nodes), asked)  # positions by sort, mapped back
    assert np.array_equal(nodes[where(asked)], asked)
    assert np.array_equal(where(asked), np.argsort(nodes, kind="stable")[want])
    assert where(np.zeros(0, np.int64)).shape == (0,)
    for missing in (nodes.max() + 1, nodes.min() - 1, 16 + spread * 7 if spread > 1 else -5):
        with pytest.raises(RuntimeError, match="not among its members"):
            where(np.array([nodes[0], missing]))


def test_node_positions_of_a_node_twice_take_the_sort():
    """A node listed twice gets no table (its position would be whichever write came last), the sort's first."""
    where = NodePositions(np.array([5, 9, 5, 7], dtype=np.int64))
    assert where.table is None and where(np.array([5, 7, 9])).tolist() == [0, 3, 1]
