"""notebooks/exploration.ipynb runs top to bottom (CPU in CI; ``--backend gpu`` on a GPU machine).

nbformat and nbclient are test extras; a machine without them (the GPU image) skips this file instead of
stopping the collection of the whole suite."""

import re
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "exploration.ipynb"
SWITCH = 'BACKEND = "cpu"'


def test_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert sum(SWITCH in c.source for c in code) == 1 and SWITCH in code[0].source  # one switch, at the top


@pytest.mark.timeout(300)
def test_notebook_executes_top_to_bottom(tmp_path, request):
    backend = request.config.getoption("--backend")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    first.source = first.source.replace(SWITCH, f'BACKEND = "{backend}"')  # the only change for the GPU
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    t0 = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, if any cell fails
    seconds = time.perf_counter() - t0
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "step by step == dedup(): True" in text and f"backend {backend}" in text
    figures = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 5  # estimate vs exact, S-curve, buckets, clusters, trade-off
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert "<ins>" in html and "srcdoc=" in html  # highlighted clusters and the report page
    assert list(tmp_path.iterdir()) == []  # in memory: the notebook writes no files
    assert seconds < 120, f"notebook took {seconds:.0f}s"


MAX_RSS = 2 << 30  # the kernel's peak resident memory on the large-cluster corpus
DATA_LIMIT = 6 << 30  # the kernel's address-space limit for data: a notebook that enumerates every pair fails fast


def _large_cluster_corpus(directory: Path) -> None:
    """6,000 documents in 3 Parquet shards: one planted cluster of 5,000 near copies (4,883 of them in one
    reference cluster at Jaccard >= 0.5: 11.9 million pairs) and 1,000 documents with 60 small clusters."""
    import pyarrow as pa

    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    big = planted_corpus(n_docs=5000, n_clusters=1, cluster_size=(5000, 5000), words=(60, 160),
                         edit_rate=(0.01, 0.05), seed=11)
    rest = planted_corpus(n_docs=1000, n_clusters=60, cluster_size=(2, 5), words=(40, 160), edit_rate=(0.0, 0.05),
                          seed=12)
    write_shards(pa.concat_tables([big.table.select(["text"]), rest.table.select(["text"])]), directory, shards=3)


@pytest.mark.timeout(300)
def test_notebook_on_own_shards_with_a_5000_document_cluster(tmp_path):
    """The own-shards cell pointed at a corpus whose reference has a 5,000-document cluster: the notebook runs
    top to bottom within its bounds (pairs sampled, memory, time)."""
    _large_cluster_corpus(tmp_path / "corpus")
    work = tmp_path / "work"
    work.mkdir()
    nb = nbformat.read(NOTEBOOK, as_version=4)
    own = next(c for c in nb.cells if c.cell_type == "code" and c.source.startswith("SHARDS = None"))
    own.source = own.source.replace("SHARDS = None", f"SHARDS = {str(tmp_path / 'corpus')!r}", 1)
    limit = nbformat.v4.new_code_cell(
        f"import resource\nresource.setrlimit(resource.RLIMIT_DATA, ({DATA_LIMIT}, resource.getrlimit("
        "resource.RLIMIT_DATA)[1]))")
    # VmHWM: the kernel's own peak (ru_maxrss would report the peak of the process that started it, pytest's)
    peak = nbformat.v4.new_code_cell("print('peak rss', next(int(line.split()[1]) * 1024 for line in open("
                                     "'/proc/self/status') if line.startswith('VmHWM:')))")
    nb.cells = [limit] + nb.cells + [peak]
    client = NotebookClient(nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(work)}})
    t0 = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - t0
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")
    rss = int(re.search(r"peak rss (\d+)", text).group(1))
    assert rss < MAX_RSS, f"the notebook's kernel peaked at {rss / 2**30:.2f} GiB"
    assert seconds < 120, f"notebook took {seconds:.0f}s"
    assert "6,000 documents of" in text and "step by step == dedup(): True" in text
    sampled = re.search(r"([\d,]+) planted pairs \(a sample of ([\d,]+)\)", text)
    assert sampled, text
    shown, total = (int(g.replace(",", "")) for g in sampled.groups())
    assert 10_000 <= shown <= 20_000 and total > 11_000_000  # MAX_PAIRS of the large cluster's pairs
    assert list(work.iterdir()) == []
