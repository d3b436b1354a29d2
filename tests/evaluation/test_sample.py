import numpy as np
import pyarrow.compute as pc

from gpu_dedup.evaluation.sample import planted_corpus, vocabulary


def test_deterministic_and_sized():
    a = planted_corpus(500, 20, seed=4)
    b = planted_corpus(500, 20, seed=4)
    assert a.table.equals(b.table)
    assert a.table.num_rows == 500
    clusters = a.clusters
    sizes = np.bincount(clusters[clusters >= 0])
    assert len(sizes) == 20 and sizes.min() >= 2 and sizes.max() <= 6
    assert pc.all(pc.utf8_is_printable(a.table.column("text"))).as_py()
    assert not planted_corpus(500, 20, seed=5).table.equals(a.table)


def test_boilerplate_fraction():
    s = planted_corpus(1000, 10, boilerplate_fraction=0.25, seed=1)
    texts = s.table.column("text").to_pylist()
    boiler = [t for t in texts if t.startswith("Subscribe to our newsletter")]
    assert len(boiler) == 250 and len(set(boiler)) == 250


def test_vocabulary_distinct():
    v = vocabulary(5000, 3)
    assert len(v) == len(set(v)) == 5000


def test_identical_boilerplate_and_empty_documents():
    s = planted_corpus(1000, 10, boilerplate_fraction=0.1, boilerplate_identical=True, empty_fraction=0.1, seed=2)
    texts = s.table.column("text").to_pylist()
    assert texts.count("") == 100
    assert len({t for t in texts if t.startswith("Subscribe")}) == 1
    assert (s.clusters == 10).sum() == 100 and (s.clusters == 11).sum() == 100
