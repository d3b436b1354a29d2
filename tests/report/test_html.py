"""report.html: self-contained, real figures, written before _SUCCESS; the report.json data it shows."""

import json
import re
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import gpu_dedup
from gpu_dedup import storage
from gpu_dedup.config import Config
from gpu_dedup.demo import make_sample
from gpu_dedup.report import page as report_html
from gpu_dedup.report.page import diff_words, render
from gpu_dedup.run.entry import run_dedup

CFG = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo's corpus (3,000 documents, 4 shards) through the file pipeline."""
    d = tmp_path_factory.mktemp("html")
    sample = make_sample(d)
    return run_dedup(d / "input", d / "output", CFG), sample


def _svgs(page: str) -> list[tuple[int, int]]:
    """(width, height) of every inline SVG figure, each checked to be well-formed XML with drawn shapes."""
    import xml.etree.ElementTree as ET

    sizes = []
    for svg in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        root = ET.fromstring(svg)
        assert root.tag == "svg"  # inline in HTML: the parser gives it the SVG namespace
        shapes = [e for e in root.iter() if e.tag in ("polygon", "polyline", "rect", "circle")]
        assert len(shapes) >= 3
        sizes.append((int(root.get("width")), int(root.get("height"))))
    return sizes


def test_report_html_is_self_contained_with_real_figures(demo_run):
    result, _ = demo_run
    page = (result.output_dir / "report.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    # self-contained: no external resource, no script
    assert not re.search(r"(src|href)=\"(?!data:)", page)
    assert "http://" not in page and "https://" not in page and "<script" not in page and "<link" not in page
    sizes = _svgs(page)
    assert len(sizes) == 5  # stages, S-curve, bucket sizes, cluster sizes, chaining
    assert all(w >= 400 and h >= 200 for w, h in sizes)
    rep = result.report
    for stage in rep["stages"]:
        assert f"<td>{stage}</td>" in page
    assert f"{rep['lsh']['bands']} bands x {rep['lsh']['rows']} rows" in page
    assert f"{rep['counts']['removed']:,}" in page and "threshold 0.8" in page
    assert "shingle: word" in page and "num_perm: 128" in page  # the parameters, as YAML
    # the largest clusters with sample texts, members highlighted against the survivor
    top = rep["largest_clusters"][0]
    assert f"cluster_id {top['cluster_id']}: {top['size']} documents" in page
    assert top["survivor"]["text"][:60].replace("&", "&amp;") in page
    assert "<ins>" in page and "<del>" in page
    assert len(page) < 600_000


def test_report_json_holds_what_the_page_shows(demo_run):
    result, sample = demo_run
    rep = json.loads((result.output_dir / "report.json").read_text())
    c, h = rep["counts"], rep["histograms"]
    assert sum(h["bucket_size_counts"]["counts"]) == c["candidate_buckets"]
    assert sum(s * k for s, k in zip(*h["bucket_size_counts"].values())) == c["bucket_memberships"]
    assert sum(h["cluster_size_counts"]["counts"]) == c["clusters"]
    assert sum(s * k for s, k in zip(*h["cluster_size_counts"].values())) == result.duplicates.num_rows
    hist = rep["chaining"]["similarity_to_survivor_histogram"]
    assert sum(hist["counts"]) == c["near_duplicates"] and len(hist["edges"]) == len(hist["counts"]) + 1
    clusters = rep["largest_clusters"]
    assert len(clusters) == 8
    sizes = [x["size"] for x in clusters]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] == max(h["cluster_size_counts"]["sizes"])
    texts = dict(zip(sample.table.column("id").to_pylist(), sample.table.column("text").to_pylist()))
    dup = result.duplicates.to_pandas()
    for x in clusters:
        s = x["survivor"]
        assert s["match"] == "kept" and s["row"] == x["cluster_id"] and s["text"] == texts[s["id"]][:1000]
        assert s["truncated"] == (len(texts[s["id"]]) > 1000) and s["characters"] == len(texts[s["id"]])
        members = dup[(dup["cluster_id"] == x["cluster_id"])]
        assert len(members) == x["size"] and x["exact_copies"] == int((members["match"] == "exact").sum())
        shown = x["members"]
        assert 1 <= len(shown) <= 3 and all(m["match"] in ("near", "exact") for m in shown)
        near = [m["similarity"] for m in shown if m["match"] == "near"]
        assert near == sorted(near)  # least similar first
        assert [m["match"] for m in shown] == sorted((m["match"] for m in shown), key=lambda v: v != "near")
        for m in shown:
            row = members[members["id"] == m["id"]].iloc[0]
            assert m["similarity"] == pytest.approx(float(row["similarity"]), abs=1e-4)


def test_report_html_written_after_report_json_and_before_success(demo_run, tmp_path, monkeypatch):
    written = []
    real = storage.atomic_write_bytes

    def record(path, payload, **kw):
        written.append(Path(path).name)
        return real(path, payload, **kw)

    from gpu_dedup.report import build, page
    from gpu_dedup.run import outdir
    from gpu_dedup.storage import atomic

    for module in (atomic, build, page, outdir):  # every writer of the three files
        monkeypatch.setattr(module, "atomic_write_bytes", record)
    run_dedup(demo_run[0].output_dir.parent / "input", tmp_path / "out", CFG)
    assert [w for w in written if w in ("report.json", "report.html", "_SUCCESS")] == \
        ["report.json", "report.html", "_SUCCESS"] and written[-1] == "_SUCCESS"


def test_figures_need_no_plotting_library(demo_run, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    page = render(demo_run[0].report)
    assert len(_svgs(page)) == 5 and "<td>signatures</td>" in page


def test_figures_show_the_report_data(demo_run):
    rep = demo_run[0].report
    figs = report_html.figures(rep)
    assert set(figs) == {"stages", "s_curve", "buckets", "clusters", "chaining"}
    for stage, v in rep["stages"].items():  # one labelled bar per stage
        assert f">{stage}</text>" in figs["stages"] and f">{v['seconds']:.2f}s</text>" in figs["stages"]
    lsh = rep["lsh"]
    assert f"{lsh['bands']} bands x {lsh['rows']} rows" in figs["s_curve"]
    assert f"false-positive area {lsh['false_positive_area']:.4f}" in figs["s_curve"]
    sizes = rep["histograms"]["cluster_size_counts"]
    assert f"{sum(sizes['counts']):,} clusters, largest {max(sizes['sizes']):,}" in figs["clusters"]
    ids = re.findall(r'clipPath id="([^"]+)"', "".join(figs.values()))
    assert len(ids) == len(set(ids)) == 5  # ids are page-wide


def test_cli_report_redraws_the_page(demo_run, tmp_path, capsys):
    from gpu_dedup.cli import main

    out = demo_run[0].output_dir
    original = (out / "report.html").read_bytes()
    assert main(["report", str(out), "-o", str(tmp_path / "again.html")]) == 0
    assert (tmp_path / "again.html").read_bytes() == original  # the page is a function of report.json
    (tmp_path / "r.json").write_bytes((out / "report.json").read_bytes())
    assert main(["report", str(tmp_path / "r.json")]) == 0 and (tmp_path / "r.html").read_bytes() == original
    assert main(["report", str(tmp_path / "missing")]) == 3
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["report", str(tmp_path / "bad.json")]) == 3
    assert "is not valid JSON" in capsys.readouterr().err
    (tmp_path / "other.json").write_text('{"a": 1}')
    assert main(["report", str(tmp_path / "other.json")]) == 3
    assert "not a report.json gpu_dedup can draw: field counts is missing" in capsys.readouterr().err


def test_render_is_fast_enough(demo_run):
    t0 = time.perf_counter()
    render(demo_run[0].report)
    assert time.perf_counter() - t0 < 2.0  # ~0.07 s on the CI machine; the bound allows for a loaded host


def test_texts_are_escaped():
    words = " ".join(f"w{i}" for i in range(60))
    evil = "<script>alert(1)</script>"
    frame = pa.table({"text": [f"{evil} {words}", f"{evil} {words} extra", "unrelated text"]})
    res = gpu_dedup.dedup(frame, backend="cpu", threshold=0.5)
    assert res.kept.tolist() == [True, False, True]
    page = res.html()
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<ins>extra</ins>" in page


@pytest.mark.parametrize("base,other,want", [
    ("a b c d e", "a x c d e f", "a <del>b</del> <ins>x</ins> c d e <ins>f</ins>"),
    ("a b c", "a c", "a <del>b</del> c"),
    ("a b", "z a b", "<ins>z</ins> a b"),
    ("The cat, sat.", "the cat sat", "the cat sat"),  # case and punctuation are not differences
    ("a  b\nc", "a  b\nc", "a  b\nc"),  # whitespace kept verbatim
    ("x <y>", "x & <y>", "x <ins>&amp;</ins> &lt;y&gt;"),
    (None, "a", "a"),
    ("a", None, "<em>(null text)</em>"),
])
def test_diff_words(base, other, want):
    assert diff_words(base, other) == want


def test_size_histogram_bins_cover_every_size():
    for top in (2, 5, 16, 17, 100, 12345):
        edges = report_html._log_bins(top)
        assert edges[0] == 1.5 and edges[-1] >= top and np.all(np.diff(edges) >= 1)
        sizes = np.arange(2, top + 1)
        assert np.histogram(sizes, bins=edges)[0].sum() == sizes.shape[0]


def test_near_duplicates_are_shown_when_exact_copies_make_the_largest_clusters(tmp_path):
    """Issue: on real data every one of the largest clusters was an exact-copy cluster (boilerplate),
    so the page never showed a near duplicate; it now also shows the clusters with the most near
    duplicates and the removed documents closest to the threshold, each beside its survivor."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    vocab = [f"w{i}" for i in range(5000)]

    def text(k=80):
        return " ".join(rng.choice(vocab, k))

    texts = []
    for _ in range(10):  # ten boilerplate texts, 30 exact copies each (after normalization)
        t = text()
        texts += [t] * 15 + [t.upper() + "!"] * 15
    near_bases = []
    for j in range(6):  # six near-duplicate clusters: a base and 1..3 edited variants
        base = text(300).split()
        near_bases.append(" ".join(base))
        texts.append(" ".join(base))
        for v in range(1 + j % 3):
            w = list(base)
            for pos in rng.choice(len(w), 1 + v, replace=False):
                w[pos] = f"edit{j}{v}{pos}"
            texts.append(" ".join(w))
    texts += [text() for _ in range(200)]
    order = rng.permutation(len(texts))
    table = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": [texts[i] for i in order]})
    pq.write_table(table, tmp_path / "corpus.parquet")
    result = run_dedup(tmp_path / "corpus.parquet", tmp_path / "out", CFG)
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    t = rep["lsh"]["verify_threshold"]
    assert rep["counts"]["near_duplicates"] >= 10
    # the largest clusters are the 30-copy ones: not one near duplicate among them
    assert [c["size"] for c in rep["largest_clusters"]] == [30] * 8
    assert all(c["near_duplicates"] == 0 and all(m["match"] == "exact" for m in c["members"])
               for c in rep["largest_clusters"])
    # the clusters with the most near duplicates, each with up to three of them, least similar first
    near = rep["largest_near_duplicate_clusters"]
    dup = result.duplicates.to_pandas()
    assert len(near) == 4 and [c["near_duplicates"] for c in near] == sorted((c["near_duplicates"] for c in near),
                                                                           reverse=True)
    assert near[0]["near_duplicates"] == 3
    for c in near:
        members = dup[dup["cluster_id"] == c["cluster_id"]]
        assert c["near_duplicates"] == int((members["match"] == "near").sum()) and c["survivor"]["match"] == "kept"
        shown = [m["similarity"] for m in c["members"]]
        assert all(m["match"] == "near" for m in c["members"]) and shown == sorted(shown)
        assert 1 <= len(shown) <= 3
    # the removed documents nearest the threshold, each with its survivor
    closest = rep["closest_to_threshold"]
    gaps = [abs(p["member"]["similarity"] - t) for p in closest]
    assert len(closest) == 6 and gaps == sorted(gaps)
    removed_near = dup[dup["match"] == "near"]
    assert min(gaps) == pytest.approx(float(np.abs(removed_near["similarity"] - t).min()), abs=1e-4)
    for p in closest:
        row = dup[dup["id"] == p["member"]["id"]].iloc[0]
        assert p["member"]["match"] == "near" and p["survivor"]["match"] == "kept"
        assert p["survivor"]["row"] == row["cluster_id"] and p["member"]["similarity"] >= t - 1e-6  # split chains
    # the page shows both, the differences marked, and stays self-contained
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    body = page.split("<h2>Other clusters with the most near duplicates</h2>")[1].split("<h2>Inputs</h2>")[0]
    near_part, closest_part = body.split("<h2>Removed documents closest to the threshold</h2>")
    assert near_part.count('class="cluster"') == 4 and "<ins>edit" in near_part and "<del>" in near_part
    assert closest_part.count('class="cluster"') == 6 and "<ins>edit" in closest_part
    assert f"similarity {closest[0]['member']['similarity']:.3f} (at or above the threshold)" in closest_part
    assert "<ins>edit" not in page.split("<h2>Largest clusters</h2>")[1].split("<h2>Other clusters with")[0]
    assert not re.search(r"(src|href)=\"(?!data:)", page) and "<script" not in page


def test_page_reads_as_a_user_expects(demo_run):
    """Words in the number they need, searchable ids, per-shard counts, no raw Python in the footer, two cluster
    sections that never show one cluster twice, and why copies_collapsed differs from the exact copies."""
    result, _ = demo_run
    rep = json.loads(json.dumps(result.report))
    page = render(rep, figs=None)
    footer = page.split("Machine: ")[1].split("</p>")[0]
    assert "{" not in footer and "'" not in footer and "CPU" in footer and "Python " in footer
    largest = {c["cluster_id"] for c in rep["largest_clusters"]}
    near = {c["cluster_id"] for c in rep["largest_near_duplicate_clusters"]}
    assert largest and not largest & near
    dup = result.duplicates.to_pandas()
    for i in rep["inputs"]:  # kept and removed rows of every shard, as the duplicates table says
        removed = int(((dup["shard"] == i["name"]) & ~dup["kept"]).sum())
        assert i["removed"] == removed and i["kept"] + i["removed"] == i["rows"]
        assert f"<td>{i['name']}</td><td>parquet</td><td class=\"n\">{i['rows']:,}</td><td class=\"n\">" \
               f"{i['kept']:,}</td><td class=\"n\">{i['removed']:,}</td>" in page
    # one cluster of one exact copy, with a cluster id beyond a thousand
    c = dict(rep["largest_clusters"][0], cluster_id=2434, size=2, exact_copies=1, near_duplicates=1)
    rep["largest_clusters"] = [c]
    page = render(rep, figs=None)
    assert "cluster_id 2434: 2 documents (1 exact copy, 1 near duplicate)" in page and "2,434" not in page
    assert "1 exact copies" not in page and "1 near duplicates" not in page
    rep["stages"]["exact"]["copies_collapsed"] = rep["counts"]["exact_duplicates"] + 50
    assert "copies_collapsed</code> (" in render(rep, figs=None)
    rep["stages"]["exact"]["copies_collapsed"] = rep["counts"]["exact_duplicates"]
    assert "copies_collapsed</code> (" not in render(rep, figs=None)


def test_evaluate_figure_names_the_similarity_not_a_run(monkeypatch, tmp_path):
    """The chaining panel's loop over runs named ``split_chains`` must not rename the similarity in the titles."""
    import matplotlib.pyplot as plt

    from gpu_dedup.report.plots import plot_evaluation

    src = Path(__file__).resolve().parents[2] / "results" / "eval" / "debian-copyright" / "evaluation.json"
    report = json.loads(src.read_text())
    assert len(report["runs"]) >= 2  # the default run and the one with split_chains flipped
    closed = []
    monkeypatch.setattr(plt, "close", lambda fig: closed.append(fig))
    plot_evaluation(report, tmp_path / "e.png")
    fig = closed[0]
    texts = [fig._suptitle.get_text()] + [ax.get_xlabel() for ax in fig.axes]
    assert all("split_chains" not in t and "default" not in t for t in texts), texts
    assert "with Jaccard >=" in texts[0] and "exact Jaccard similarity to the cluster's survivor" in texts


def test_control_characters_and_direction_overrides_in_texts_and_ids_stay_inside_their_place(tmp_path):
    """Web text and ids hold NUL, other C0 and C1 controls, DEL and noncharacters (binary columns, mojibake):
    they went into the page as they were, which HTML forbids (a parser drops or replaces them).  They are shown
    as control pictures or U+FFFD; a right-to-left override in an id no longer turns the row and shard numbers
    after it around (the id and shard name are isolated in ``<bdi>``)."""
    import pyarrow.parquet as pq

    words = " ".join(f"w{i}" for i in range(60))
    bad = "\x00\x01\x07\x0b\x1b\x7f\x85\x9f\ufdd0\ufffe\uffff\U0010ffff"
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": [f"{bad} {words}", f"{bad} {words} extra"],
                             "id": [f"\u202e{bad}<i>a</i>", "\u202eb\u2067"]}), tmp_path / "in" / "x\u202e.parquet")
    run_dedup(tmp_path / "in", tmp_path / "out", CFG)
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    forbidden = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ufdd0-\ufdef\ufffe\uffff\U0010ffff]")
    assert not forbidden.findall(page)
    assert "\u2400\u2401\u2407\u240b\u241b\u2421\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd w0" in page
    assert "id <bdi>\u202e\u2400" in page and "&lt;i&gt;a&lt;/i&gt;</bdi> · row 0 · <bdi>x\u202e.parquet</bdi>:0" in page
    assert "id <bdi>\u202eb\u2067</bdi> · row 1" in page


def test_stage_details_are_escaped_once():
    """The stage table's details were escaped, then escaped again as a table cell: verify's round_seconds showed
    as ``{&amp;#x27;pairs&amp;#x27;: 13, ...}`` on the page (the text ``{&#x27;pairs&#x27;...``).  Each detail is
    escaped once; lists and objects are shown as JSON."""
    report = {"counts": {"documents_read": 2, "kept": 1, "removed": 1},
              "lsh": {"bands": 2, "rows": 2, "threshold": 0.5, "false_positive_area": 0.1, "false_negative_area": 0.1},
              "stages": {"verify": {"seconds": 0.5, "round_seconds": [{"pairs": 13, "score": 0.09}],
                                    "method": "<exact>", "a&b": 1}}}
    page = render(report, figs=None)
    assert '<td>round_seconds=[{&quot;pairs&quot;: 13, &quot;score&quot;: 0.09}], method=&lt;exact&gt;, a&amp;b=1</td>' \
        in page
    assert "&amp;#x27;" not in page and "&amp;quot;" not in page and "&amp;lt;" not in page


def test_a_cluster_id_of_an_edited_report_is_escaped():
    """``gpu-dedup report`` draws pages of report.json files it did not write; the schema takes a string
    cluster_id, which went into the page unescaped: ``"cluster_id": "<script>alert(1)</script>"`` ran."""
    doc = {"row": 0, "shard": "s", "shard_row": 0, "match": "kept", "text": "a b", "similarity": 1.0}
    report = {"counts": {"documents_read": 2, "kept": 1, "removed": 1},
              "lsh": {"bands": 2, "rows": 2, "threshold": 0.5, "false_positive_area": 0.1, "false_negative_area": 0.1},
              "largest_clusters": [{"cluster_id": "<script>alert(1)</script>", "size": 2, "exact_copies": 1,
                                    "survivor": doc, "members": [{**doc, "row": 1, "match": "exact"}]}]}
    page = render(report, figs=None)
    assert "<script" not in page and "cluster_id &lt;script&gt;alert(1)&lt;/script&gt;: 2 documents" in page
