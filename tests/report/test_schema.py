"""report.json's shape as the page reads it: ``gpu-dedup report`` names the field that is wrong."""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_dedup.cli import main
from gpu_dedup.config import Config
from gpu_dedup.demo import make_sample
from gpu_dedup.report import schema
from gpu_dedup.report.page import render
from gpu_dedup.run.entry import run_dedup


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A real report.json with every section: sample clusters, pairs closest to the threshold, histograms."""
    d = tmp_path_factory.mktemp("schema")
    make_sample(d, docs=600, shards=1)
    run_dedup(d / "input", d / "out", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}))
    rep = json.loads((d / "out" / "report.json").read_text())
    assert rep["largest_clusters"] and rep["closest_to_threshold"]
    return rep


@pytest.mark.parametrize("edit, field", [
    (lambda r: r.update(counts="x"), "counts"),
    (lambda r: r["lsh"].update(bands="x"), "lsh.bands"),
    (lambda r: r.update(largest_clusters=[{"x": 1}]), "largest_clusters[0].cluster_id"),
    (lambda r: r["largest_clusters"][0]["members"][0].update(text=5), "largest_clusters[0].members[0].text"),
    (lambda r: r["stages"]["read"].update(seconds=None), "stages.read.seconds"),
    (lambda r: r["chaining"]["similarity_to_survivor_histogram"]["edges"].pop(),
     "chaining.similarity_to_survivor_histogram.edges"),
    (lambda r: r["closest_to_threshold"][0]["member"].pop("similarity"), "closest_to_threshold[0].member.similarity"),
    (lambda r: r["lsh"].update(rows=0), "lsh.rows"),
    (lambda r: r["inputs"][0].update(rows="many"), "inputs[0].rows"),
    (lambda r: r["fixed_seconds"].update(startup=""), "fixed_seconds.startup"),
    (lambda r: r["fixed_seconds"].update(commit=None), "fixed_seconds.commit"),
    (lambda r: r.update(fixed_seconds="x"), "fixed_seconds"),
    (lambda r: r.update(fixed_seconds=None), "fixed_seconds"),
    (lambda r: r.update(unbooked_seconds=[1]), "unbooked_seconds"),
])
def test_report_names_the_wrong_field(report, tmp_path, capsys, edit, field):
    """Wrong-typed fields of report.json were "internal error" and a traceback (counts: "x", lsh.bands: "x",
    largest_clusters: [{"x": 1}]): now exit 3 naming the field, its value and the fix, nothing written."""
    bad = copy.deepcopy(report)
    edit(bad)
    (tmp_path / "r.json").write_text(json.dumps(bad))
    assert main(["report", str(tmp_path / "r.json")]) == 3
    err = capsys.readouterr().err
    assert f"field {field} " in err and "rerun the run" in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r.html").exists()


def _paths(value, where=()):
    """Every (path, value) of a JSON tree."""
    yield where, value
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from _paths(v, (*where, k))


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 10**6) | st.floats(allow_nan=False) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                 max_size=3), max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), value=JSON)
def test_any_field_replaced_is_drawn_or_named(report, data, value):
    """Whatever one field of a real report.json is replaced by (or whether it is dropped), the page is drawn or
    the check names a field: the page never fails on a report the check let through."""
    bad = copy.deepcopy(report)
    paths = [p for p, _ in _paths(bad) if p]
    where = data.draw(st.sampled_from(paths))
    parent = bad
    for k in where[:-1]:
        parent = parent[k]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    try:
        schema.check(bad)
    except schema.ReportShapeError as exc:
        assert exc.field and str(exc).startswith("field ")
        return
    assert render(bad).startswith("<!DOCTYPE html>")
