import numpy as np
import pyarrow as pa

from gpu_dedup.config import SelectConfig
from gpu_dedup.select import policy_ranks, survivors


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
