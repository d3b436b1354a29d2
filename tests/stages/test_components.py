import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.stages.components import components
from gpu_dedup.stages.edges import Edges
from tests import reference as ref


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 60).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))))
def test_components_equal_brute_force_oracle(case):
    n, pairs = case
    src = np.array([a for a, b in pairs], np.int64)
    dst = np.array([b for a, b in pairs], np.int64)
    labels = components(Edges(src, dst), n)
    assert list(labels) == ref.connected_components(n, pairs)


def test_isolated_nodes_label_themselves():
    labels = components(Edges(np.array([3]), np.array([7])), 10)
    assert list(labels) == [0, 1, 2, 3, 4, 5, 6, 3, 8, 9]
    assert components(Edges(np.zeros(0, np.int64), np.zeros(0, np.int64)), 0).shape == (0,)
