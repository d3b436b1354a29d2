"""The notebook's own-shards cell: pointed at a user's shards, it gives the cells after it the documents and a
reference clustering in place of the planted sample (the notebook itself runs in tests/test_notebook.py)."""

from pathlib import Path

import numpy as np
import pytest

from gpu_dedup.evaluation.sample import planted_corpus, write_shards

nbformat = pytest.importorskip("nbformat")  # the notebook extra; absent on a bare GPU image

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "exploration.ipynb"


def test_own_shards_cell_reads_the_users_corpus(tmp_path):
    s = planted_corpus(n_docs=300, n_clusters=30, cluster_size=(2, 4), words=(40, 120), edit_rate=(0, 0.05), seed=9)
    write_shards(s.table.select(["id", "text"]).rename_columns(["url", "body"]), tmp_path / "mine", shards=3)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    own = next(c for c in code if c.startswith("SHARDS = None"))
    own = own.replace("SHARDS = None", f"SHARDS = {str(tmp_path / 'mine')!r}", 1)
    own = own.replace('TEXT, ID = "text", None', 'TEXT, ID = "body", "url"', 1).replace("LIMIT = 20_000", "LIMIT = 250")
    ns: dict = {}
    exec(code[0], ns)  # imports and the config
    exec(code[1], ns)  # the planted sample, replaced by the next cell
    exec(own, ns)
    df, truth = ns["df"], ns["truth"]
    assert len(df) == ns["n"] == 250 and list(df.columns) == ["id", "text"]
    assert df["id"].tolist() == s.table.column("id").to_pylist()[:250]
    assert df["text"].tolist() == s.table.column("text").to_pylist()[:250]
    assert truth.shape == (250,) and (truth >= 0).sum() > 20  # a reference with pairs for the cells after it
    planted = s.table.column("cluster").to_numpy()[:250]
    both = (truth >= 0) & (planted >= 0)
    assert both.sum() >= 0.8 * (truth >= 0).sum()  # the reference clusters are mostly the planted ones
    assert np.all(np.isin(truth[truth >= 0], np.flatnonzero(truth >= 0)))  # cluster ids are member rows
