import io
import logging

from gpu_dedup.run.progress import Progress, chunks


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_terminal_line_redrawn_with_counts_and_rate(caplog):
    caplog.set_level(logging.INFO, logger="gpu_dedup")
    out = _Tty()
    with Progress("signatures", 200, stream=out) as p:
        p.interval = 0
        p.update(50)
        p.update(150)
    text = out.getvalue()
    assert text.startswith("\r[signatures]") and "100% 200/200 docs" in text and "docs/s" in text
    assert text.endswith("\n")


def test_plain_log_lines_when_not_a_terminal(caplog):
    caplog.set_level(logging.INFO, logger="gpu_dedup")
    out = io.StringIO()
    with Progress("write", 3, "shards", interval=0, stream=out) as p:
        p.update(1)
    assert out.getvalue() == ""
    assert "[write]" in caplog.text and "1/3 shards" in caplog.text


def test_quiet_shows_nothing(caplog):
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    out = _Tty()
    with Progress("read", 10, stream=out) as p:
        p.update(10)
    assert out.getvalue() == "" and "[read]" not in caplog.text


def test_chunks_cover_the_range():
    assert list(chunks(10, 4)) == [(0, 4), (4, 8), (8, 10)]
    assert list(chunks(0, 4)) == []


STAGES = ("read", "normalize", "exact", "signatures", "bands", "buckets", "verify", "components", "select", "write")


def test_every_pipeline_stage_draws_a_progress_line_on_a_terminal(tmp_path, monkeypatch, caplog):
    import re
    import sys

    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    words = [f"w{k}" for k in range(40)]
    texts = [" ".join(words[:39] + [f"x{i % 7}"]) for i in range(40)] + [None, ""]  # exact and near copies
    pq.write_table(pa.table({"id": list(range(42)), "text": pa.array(texts, pa.string())}), tmp_path / "a.parquet")
    caplog.set_level(logging.INFO, logger="gpu_dedup")
    term = _Tty()
    monkeypatch.setattr(sys, "stderr", term)
    run_dedup(tmp_path / "a.parquet", tmp_path / "out", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}))
    shown = term.getvalue()
    for stage in STAGES:
        last = re.search(rf"\r\[{stage}\] 100% ([0-9,]+)/([0-9,]+) [a-z ]+ [0-9,]+ [a-z ]+/s in [0-9.]+s +\n", shown)
        assert last and last.group(1) == last.group(2), (stage, shown)
    assert "stage select done" not in caplog.text  # the terminal line replaces the plain log line (-v shows it)


def test_log_record_wipes_a_live_terminal_line():
    from gpu_dedup.run.progress import ClearLine

    out = _Tty()
    handler = logging.StreamHandler(out)
    handler.addFilter(ClearLine(out))
    logger = logging.getLogger("gpu_dedup.test_progress")
    logger.addHandler(handler)
    try:
        p = Progress("verify", 10, "pairs", stream=out)
        p.enabled = p.tty = True
        p.start()
        logger.warning("a warning")
        p.close()
    finally:
        logger.removeHandler(handler)
    text = out.getvalue()
    assert "\r" + " " * 79 + "\ra warning\n" in text and text.endswith("\n")


def test_failed_stage_ends_its_terminal_line():
    import pytest

    out = _Tty()
    p = Progress("read", 3, "shards", stream=out)
    p.enabled = p.tty = True
    with pytest.raises(RuntimeError), p:
        p.start()
        raise RuntimeError("corrupt shard")
    assert out.getvalue().endswith("\n") and "in " not in out.getvalue()


def test_terminal_line_fits_a_narrow_terminal(caplog, monkeypatch):
    """Issue: redraws wrapped on a 60-column terminal (the line was padded to 79 characters)."""
    caplog.set_level(logging.INFO, logger="gpu_dedup")
    for columns, shown in ((60, "12,345,678/98,765,432"), (30, "[signatures]"), (200, "docs/s")):
        monkeypatch.setenv("COLUMNS", str(columns))
        out = _Tty()
        with Progress("signatures", 98_765_432, stream=out) as p:
            p.interval = 0
            p.update(12_345_678)
            logging.getLogger("gpu_dedup").info("a log line between redraws")
        drawn = [seg for seg in out.getvalue().replace("\n", "\r").split("\r") if seg]
        assert drawn and all(len(seg) <= columns - 1 for seg in drawn), (columns, drawn)
        assert any(shown in seg for seg in drawn) and "%" in drawn[-1]
    assert Progress("x", 10, stream=_Tty())._line(width=None).startswith("[x]")


def test_a_batch_log_gets_a_stage_line_only_for_a_stage_longer_than_the_interval(caplog):
    """Off a terminal the run's summary gives every stage's seconds: a short stage logs nothing at INFO, a long
    one its end (counts and rate; its details at DEBUG)."""
    from gpu_dedup.run.stagelog import StageLog

    caplog.set_level(logging.INFO, logger="gpu_dedup")
    stages = StageLog(stream=io.StringIO())
    with stages.stage("verify", 10, "pairs") as info:
        info["method"] = "exact"
    assert "verify" not in caplog.text
    with stages.stage("select", 4) as info:
        info.progress.interval = 0  # as if it had run for longer than the interval
        info["kept"] = 3
    assert "stage select done in" in caplog.text and "4/4 docs" in caplog.text and "kept=3" not in caplog.text
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="gpu_dedup")
    with stages.stage("write", 2, "shards") as info:
        info["rows_written"] = 7
    assert "stage write done in" in caplog.text and "rows_written=7" in caplog.text  # -v: every stage, in full
