"""Fixtures shared by the run's tests."""

import pytest

from gpu_dedup.evaluation.sample import planted_corpus, write_shards


@pytest.fixture(scope="session")
def planted_shards(tmp_path_factory):
    """A factory for module fixtures: ``planted_shards(name, shards=2, **corpus)`` writes the ``id`` and ``text``
    of ``planted_corpus(**corpus)`` as ``shards`` Parquet shards in a new folder named after ``name`` and hands
    back that folder."""

    def make(name: str, shards: int = 2, **corpus):
        d = tmp_path_factory.mktemp(name)
        sample = planted_corpus(**corpus)
        write_shards(sample.table.select(["id", "text"]), d / "in", shards=shards)
        return d / "in"

    return make
