"""notebooks/exploration.ipynb runs top to bottom (CPU in CI; ``--backend gpu`` on a GPU machine).

nbformat and nbclient are test extras; a machine without them (the GPU image) skips this file instead of
stopping the collection of the whole suite."""

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
