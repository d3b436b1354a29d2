"""The warning of a query below the index's threshold states what the S-curve says (gpu_dedup/index/query.py)."""

import pytest

from gpu_dedup.config import Config
from gpu_dedup.curves import s_curve
from gpu_dedup.index.query import below_index_threshold


class _Index:
    """What below_index_threshold reads of an index: its layout, threshold and similarity family."""

    similarity = "jaccard"
    manifest = {"config": {"bands": 16, "rows": 8}}

    def config(self):
        return Config()


@pytest.mark.parametrize("threshold", [0.79, 0.75, 0.7])
def test_a_threshold_where_most_pairs_are_still_found_does_not_say_most_are_missed(threshold):
    """16 x 8 bands built for 0.8 find a pair at 0.7 with probability 0.61: the warning said "most such pairs
    are missed" whatever the probability; it gives the share missed instead."""
    p = float(s_curve(threshold, 16, 8))
    assert p >= 0.5
    said = below_index_threshold(_Index(), threshold)
    assert f"found with probability {p:.2g}" in said
    assert "most such pairs are missed" not in said
    assert f"so {1 - p:.0%} of such pairs are missed" in said
    assert all(len(line) <= 120 for line in said.splitlines())


def test_a_threshold_where_most_pairs_are_missed_says_so():
    p = float(s_curve(0.5, 16, 8))
    said = below_index_threshold(_Index(), 0.5)
    assert p < 0.5 and f"found with probability {p:.2g}" in said and "so most such pairs are missed" in said
