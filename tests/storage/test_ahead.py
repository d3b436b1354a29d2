"""Reader threads ahead of their consumer: items in order, errors where they were, memory bounded, threads
stopped when the consumer stops."""

import threading
import time

import pytest

from gpu_dedup.storage.ahead import ahead_each


def _source(k: int, n: int, log=None):
    def make():
        for j in range(n):
            if log is not None:
                log.append((k, j))
            yield k, j
    return make


@pytest.mark.parametrize("readers", [1, 2, 3, 7, 20])
def test_items_come_in_source_order(readers):
    sizes = [5, 0, 3, 9, 1, 4, 0, 2]
    got = list(ahead_each([_source(k, n) for k, n in enumerate(sizes)], readers))
    assert got == [(k, j) for k, n in enumerate(sizes) for j in range(n)]


def test_readers_wait_for_the_consumer():
    made = []
    it = ahead_each([_source(k, 50, made) for k in range(6)], readers=3, depth=2)
    assert next(it) == (0, 0)
    time.sleep(0.3)  # each reader has filled its queue and waits
    assert len(made) <= 3 * (2 + 1) + 1  # per reader: its queue, the item it holds; the one consumed
    assert {k for k, _ in made} <= {0, 1, 2}  # no reader is past its first source
    it.close()


def test_an_error_is_raised_where_its_item_was():
    def broken():
        yield 2, 0
        raise ValueError("source 2 is corrupt")

    got = []
    with pytest.raises(ValueError, match="source 2 is corrupt"):
        for item in ahead_each([_source(0, 3), _source(1, 2), broken, _source(3, 4)], readers=2):
            got.append(item)
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0)]  # everything before it, in order


def test_threads_stop_when_the_consumer_stops():
    it = ahead_each([_source(k, 1000) for k in range(8)], readers=4)
    next(it)
    it.close()
    time.sleep(0.05)
    assert not [t for t in threading.enumerate() if t.name.startswith("gpu_dedup-read")]
