"""The Arrow memory pool of the processes gpu_dedup starts."""

import pyarrow as pa
import pytest

from gpu_dedup.storage import pool


@pytest.fixture
def decays(monkeypatch):
    """The decays set on pyarrow's jemalloc (recorded, not set: this process's arenas are left alone)."""
    calls = []
    monkeypatch.setattr(pa, "jemalloc_set_decay_ms", calls.append)
    monkeypatch.delenv(pool.JEMALLOC_CONF_VARIABLE, raising=False)
    return calls


@pytest.fixture
def jemalloc(decays):
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


def test_jemalloc_keeps_freed_pages_for_reuse_unless_its_settings_were_given(jemalloc, decays, monkeypatch):
    """Freed pages kept for DECAY_MS (pyarrow gives them back at once: each batch's buffers were zeroed by the
    kernel again); a user's JE_ARROW_MALLOC_CONF is theirs; other pools are not touched."""
    monkeypatch.delenv(pool.POOL_VARIABLE, raising=False)
    assert pool.use_preferred_pool() == "jemalloc" and decays == [pool.DECAY_MS] and pool.DECAY_MS > 0
    monkeypatch.setenv(pool.JEMALLOC_CONF_VARIABLE, "dirty_decay_ms:0")
    assert not pool.keep_freed_pages() and decays == [pool.DECAY_MS]
    monkeypatch.delenv(pool.JEMALLOC_CONF_VARIABLE)
    pa.set_memory_pool(pa.system_memory_pool())
    assert not pool.keep_freed_pages() and decays == [pool.DECAY_MS]


def test_a_local_clusters_workers_keep_freed_pages_as_they_start(jemalloc, decays, monkeypatch):
    from gpu_dedup.run.cluster import worker_setup

    monkeypatch.setattr(worker_setup, "own_process_group", lambda: None)
    pa.set_memory_pool(pa.jemalloc_memory_pool())  # what ARROW_DEFAULT_MEMORY_POOL=jemalloc gives a worker
    worker_setup.dask_setup(None)
    assert decays == [pool.DECAY_MS]


def test_a_pool_the_user_chose_is_kept(jemalloc, decays, monkeypatch):
    monkeypatch.setenv(pool.POOL_VARIABLE, "system")
    pa.set_memory_pool(pa.system_memory_pool())  # what pyarrow made of the variable at its start
    assert pool.preferred_pool() is None
    assert pool.worker_environment({"A": "1"}) == {"A": "1"}
    assert pool.use_preferred_pool() == "system" and decays == []


def test_a_pyarrow_without_jemalloc_keeps_its_default(decays, monkeypatch):
    monkeypatch.delenv(pool.POOL_VARIABLE, raising=False)

    def missing():
        raise NotImplementedError("This Arrow build does not enable jemalloc")

    monkeypatch.setattr(pa, "jemalloc_memory_pool", missing)
    before = pa.default_memory_pool().backend_name
    assert pool.preferred_pool() is None and pool.worker_environment({}) == {}
    assert pool.use_preferred_pool() == before
