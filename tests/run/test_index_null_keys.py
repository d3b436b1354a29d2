"""An index never matches an empty text with a null document (run/local.py and run/cluster/blocks.py hand the
index its documents' exact keys; a null document's is the empty text's, so a null was stored as "").

Found by comparing a run against an index with the full dedup of both parts (tests/reference.py's contract:
a run against an index of A removes from B exactly what one dedup of A + B removes from B): an empty (or
whitespace- or punctuation-only) document of B was removed as an exact copy of a null document of A, which a
full dedup never does (nulls are never deduplicated).
"""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.index.remote import open_index
from gpu_dedup.run.entry import run_dedup

CFG = {"backend": "cpu", "input": {"id_column": "id"}}
A = [None, "some words of a first document", "  ", None]
B = ["", "!!", "some words of a first document", None, " \t"]


def _write(d, name, ids, texts):
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array(texts, pa.string())}),
                   d / f"{name}.parquet")


def _removed(result):
    return {r["id"]: (r["survivor_id"], r["match"]) for r in result.duplicates.to_pylist() if not r["kept"]}


@pytest.mark.parametrize("a_has_empty", [False, True])
def test_an_empty_text_is_not_an_exact_copy_of_an_indexed_null(tmp_path, a_has_empty):
    a_texts = A if a_has_empty else [t if t is None or t.strip() else "other words" for t in A]
    a_ids, b_ids = list(range(len(A))), list(range(len(A), len(A) + len(B)))
    _write(tmp_path / "a", "a", a_ids, a_texts)
    _write(tmp_path / "b", "b", b_ids, B)
    _write(tmp_path / "ab", "a", a_ids, a_texts)
    _write(tmp_path / "ab", "b", b_ids, B)
    cfg = Config.from_dict(CFG)
    full = _removed(run_dedup(tmp_path / "ab", None, cfg))
    run_dedup(tmp_path / "a", tmp_path / "a-out", cfg, index_out=tmp_path / "ix")
    against = _removed(run_dedup(tmp_path / "b", None, cfg, against=tmp_path / "ix"))
    assert against == {i: v for i, v in full.items() if i in b_ids}
    # a query of the empty text finds no null document either
    ix = open_index(tmp_path / "ix")
    from gpu_dedup.stages.exact import exact_keys

    keys = exact_keys(pa.array([""], pa.large_string()), cfg.minhash.seed)
    nulls = [i for i, t in enumerate(a_texts) if t is None]
    assert int(ix.exact_matches(keys)[0]) not in nulls


def test_an_index_built_on_workers_stores_no_key_for_a_null(tmp_path):
    """The cluster's index segments (run/cluster/blocks.py), one block a row."""
    distributed = pytest.importorskip("distributed")
    a_ids, b_ids = list(range(len(A))), list(range(len(A), len(A) + len(B)))
    _write(tmp_path / "a", "a", a_ids, A)
    _write(tmp_path / "b", "b", b_ids, B)
    cfg = Config.from_dict(CFG)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                                  env={"NUMBA_NUM_THREADS": "1"}) as cluster:
        run_dedup(tmp_path / "a", tmp_path / "a-out", cfg.with_overrides(
            {"cluster.scheduler": cluster.scheduler_address, "cluster.block_rows": 1}), index_out=tmp_path / "ix")
    _write(tmp_path / "a1", "a", a_ids, A)  # the same index built in one process
    run_dedup(tmp_path / "a1", tmp_path / "a1-out", cfg, index_out=tmp_path / "ix1")
    against = _removed(run_dedup(tmp_path / "b", None, cfg, against=tmp_path / "ix"))
    assert against == _removed(run_dedup(tmp_path / "b", None, cfg, against=tmp_path / "ix1"))
    assert all(survivor not in (0, 3) for survivor, _ in against.values())  # A's nulls
