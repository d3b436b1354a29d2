"""The Arrow memory pool of the processes gpu_dedup starts."""

import pyarrow as pa
import pytest

from gpu_dedup.storage import pool


@pytest.fixture
def jemalloc():
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    before = pa.default_memory_pool()
    yield
    pa.set_memory_pool(before)


def test_the_command_and_its_workers_take_jemalloc_where_no_pool_was_chosen(jemalloc, monkeypatch):
    monkeypatch.delenv(pool.POOL_VARIABLE, raising=False)
    assert pool.preferred_pool() == "jemalloc"
    assert pool.worker_environment({"NUMBA_NUM_THREADS": "1"}) == {"NUMBA_NUM_THREADS": "1",
                                                                    pool.POOL_VARIABLE: "jemalloc"}
    assert pool.use_preferred_pool() == "jemalloc" and pa.default_memory_pool().backend_name == "jemalloc"


def test_a_pool_the_user_chose_is_kept(jemalloc, monkeypatch):
    monkeypatch.setenv(pool.POOL_VARIABLE, "system")
    pa.set_memory_pool(pa.system_memory_pool())  # what pyarrow made of the variable at its start
    assert pool.preferred_pool() is None
    assert pool.worker_environment({"A": "1"}) == {"A": "1"}
    assert pool.use_preferred_pool() == "system"


def test_a_pyarrow_without_jemalloc_keeps_its_default(monkeypatch):
    monkeypatch.delenv(pool.POOL_VARIABLE, raising=False)

    def missing():
        raise NotImplementedError("This Arrow build does not enable jemalloc")

    monkeypatch.setattr(pa, "jemalloc_memory_pool", missing)
    before = pa.default_memory_pool().backend_name
    assert pool.preferred_pool() is None and pool.worker_environment({}) == {}
    assert pool.use_preferred_pool() == before
