"""The accounting check every end-to-end test makes: each input row is in the
outputs exactly once, kept in a deduplicated shard or removed in duplicates.parquet."""

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MARKERS = {"duplicates.parquet", "report.json", "report.html", "_SUCCESS"}


def _shard_ids(path: Path, id_col: str) -> list:
    if path.name.endswith(".parquet"):
        return pq.read_table(path).column(id_col).to_pylist()
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    return [json.loads(line)[id_col] for line in raw.decode().splitlines() if line.strip()]


def assert_accounted(result, in_dir_tables, id_col="id"):
    """Every input id is either in an output shard or a removed row of the duplicates table, once.

    ``result``: a RunResult, or the output directory of a finished run (a CLI
    run); then the shards, ``duplicates.parquet`` and ``report.json`` are read
    from it.  A RunResult with an output directory is checked against the
    ``duplicates.parquet`` written there, not only its in-memory table.
    """
    if isinstance(result, (str, Path)):
        out = Path(result)
        assert (out / "_SUCCESS").exists(), f"{out} holds no complete run"
        names = sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in MARKERS
                       and not p.name.startswith("."))
        dup = pq.read_table(out / "duplicates.parquet")
        report = json.loads((out / "report.json").read_text())
    else:
        out = result.output_dir
        names = [shard.name for shard in result.shards]
        dup = result.duplicates
        if out is not None and (out / "duplicates.parquet").exists():
            on_disk = pq.read_table(out / "duplicates.parquet")
            assert on_disk.column(id_col).to_pylist() == dup.column(id_col).to_pylist()
            assert on_disk.column("kept").to_pylist() == dup.column("kept").to_pylist()
            dup = on_disk
        report = result.report
    kept_ids = [i for name in names for i in _shard_ids(out / name, id_col)]
    removed = dup.filter(pa.compute.invert(dup.column("kept"))).column(id_col).to_pylist()
    all_ids = [i for t in in_dir_tables for i in t.column(id_col).to_pylist()]
    assert sorted(kept_ids + removed) == sorted(all_ids)
    if len(set(all_ids)) == len(all_ids):  # (a repeated user id may be kept in one row and removed in another)
        assert len(set(kept_ids) & set(removed)) == 0
    c = report["counts"]
    assert c["kept"] + c["removed"] == c["documents_read"] == len(all_ids)
    assert c["kept"] == len(kept_ids) and c["removed"] == len(removed)
    assert c["exact_duplicates"] + c["near_duplicates"] == c["removed"]
    assert c["accounted"] is True
