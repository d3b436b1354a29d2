import io
import logging

from gpu_dedup.progress import Progress, chunks


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
