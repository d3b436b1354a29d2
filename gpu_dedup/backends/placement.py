"""Where a one-process run keeps its corpus, decided by the backend: :class:`Placement` (of the backend's
memory plan, ``Backend.plan_memory``).

On the host (the CPU backend) every array is NumPy, the texts are read by pyarrow and normalized batch by
batch as they are read, and the kernels take the whole corpus at once.  On a device (the GPU backend) the
corpus lives in device memory when its estimate fits ``gpu.memory_limit`` (the texts read there by the
backend's reader, the shards written from there by its writer); a larger corpus keeps its arrays on the
host and the kernels take slices of at most ``batch_bytes`` of text.  Every question a one-process executor
asks about that is a method here, so the executor itself never asks which backend runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import to_host, transfer_totals
from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array
from gpu_dedup.backends.strings import (
    RawText,
    StringBuffers,
    arrow_strings,
    code_point_lengths,
    raw_text,
    string_buffers,
)
from gpu_dedup.errors import InputError

log = logging.getLogger("gpu_dedup")


class Readers:
    """How the read stage reads the texts (:meth:`Placement.readers`): ``text(shard, column)`` reads a Parquet
    shard's text column into device memory (None: pyarrow reads it on the host with the other columns),
    ``table(shards)`` every column of all the shards into device memory in one call (None: not), and
    ``stream_normalize``: the host normalizes each batch of text as it is read.  One object per read: it
    collects the device's columns as the shards are read."""

    def __init__(self, text: Callable | None = None, table: Callable | None = None, stream_normalize: bool = False):
        self.text, self.table, self.stream_normalize = text, table, stream_normalize
        self._columns: list = []  # the device's text column of each shard read so far

    @property
    def name(self) -> str:
        """What the report calls the text reader."""
        return "cudf" if self.text is not None else "pyarrow"

    @property
    def on_host(self) -> bool:
        """pyarrow reads the texts (with the other columns): the shards' batches may be held for the write."""
        return self.text is None

    def shard_read(self, shard: Any, column: str, rows: int) -> None:
        """Shard ``shard`` was read on the host (its ``rows`` rows): its text column read into device memory now,
        where a text reader reads each shard's (and no table reader all of them at the end)."""
        if self.text is not None and self.table is None:
            self._columns.append(self._column(shard, column, rows))

    def _column(self, shard: Any, column: str, rows: int) -> Any:
        got = shard.text if shard.format == "memory" else self.text(shard, column)  # type: ignore[misc]
        if len(got) != rows:
            raise InputError(f"shard {shard.path!r} gave {rows} rows to pyarrow but {len(got)} text rows to cuDF; "
                             "it changed while being read or is corrupt: rerun, or set gpu.reader: pyarrow")
        return got

    def finish(self, shards: list, rows: int, column: str) -> tuple[list | None, Any]:
        """After every shard (``rows`` rows read on the host): the text columns in device memory (None: the
        texts are the host table's) and the device table of every column (or None), read now where a table
        reader reads them all at once (each shard's text column where it cannot)."""
        if self.text is None:
            return None, None
        if self.table is None:
            return self._columns, None
        # a table reader reads files: shards given in memory (a cuDF frame to ``dedup``) have their column
        device_table = self.table(shards) if shards and not any(s.format == "memory" for s in shards) else None
        if device_table is None:
            return [self._column(s, column, s.rows) for s in shards], None
        if device_table.num_rows != rows:
            raise InputError(f"the shards gave {rows} rows to pyarrow but {device_table.num_rows} to cuDF; one "
                             "changed while being read or is corrupt: rerun, or set gpu.reader: pyarrow")
        return [device_table.column(column)], device_table

    @staticmethod
    def texts(device_text: list | None, xp: Any) -> HostTexts | DeviceTexts:
        """Where the read texts are until normalized: the device's columns (as one buffer set), or the host
        table's text column."""
        return HostTexts() if device_text is None else DeviceTexts(raw_text(device_text, xp), xp)


class HostTexts:
    """The read texts in the host table's ``text`` column."""

    def null(self, rows: Callable[[], Any]) -> Any:
        return rows()  # the family's null rows of the table

    def lengths(self, host: Callable[[], Any]) -> Any:
        return host()  # the column's code points

    def column(self, table: pa.Table) -> Any:
        return table.column("text")


class DeviceTexts:
    """The read texts in device memory (:class:`~gpu_dedup.backends.strings.RawText`)."""

    def __init__(self, raw: RawText, xp: Any):
        self.raw, self.xp = raw, xp

    def null(self, rows: Callable[[], Any]) -> Any:
        return self.raw.null(self.xp)

    def lengths(self, host: Callable[[], Any]) -> Any:
        return arrow_array(to_host(code_point_lengths(self.raw, self.xp)))

    def column(self, table: pa.Table) -> Any:
        return self.raw


class Placement:
    """The memory plan of one process's corpus on ``backend`` (see the module docstring).

    ``plan``: the backend's memory plan (``Backend.plan_memory``; None where there is no device memory to
    plan), with ``resident`` (the corpus fits the device) and ``batch_bytes``."""

    def __init__(self, backend: Any, plan: dict | None, cfg: Any):
        self.backend, self.plan, self.cfg = backend, plan, cfg
        self.xp = backend.xp  # the array module of the corpus's arrays
        self.batch_bytes: int | None = None  # text bytes per kernel batch; None: the whole corpus at once
        self._transfers0 = transfer_totals()
        if plan is not None and not plan["resident"]:
            self.xp, self.batch_bytes = np, int(plan["batch_bytes"])
            log.info("gpu: the corpus (~%.1f GB on the device) exceeds gpu.memory_limit (%.1f GB): batches "
                     "of %.1f GB of text", plan["estimate_bytes"] / 1e9, plan["memory_limit_bytes"] / 1e9,
                     self.batch_bytes / 1e9)

    # ---- reading
    def readers(self, device_readable: Callable[[], bool]) -> Readers:
        """The read stage's readers: the backend's device readers where the whole corpus lives on the device
        and ``device_readable()`` (every shard a Parquet file with a UTF-8 text column: asked only then), else
        pyarrow's, with each batch normalized as it is read where the backend normalizes on the host."""
        text = self.backend.text_reader(self.cfg) if self.batch_bytes is None else None
        text = text if text is not None and device_readable() else None
        if text is not None:
            return Readers(text, self.backend.table_reader(self.cfg))
        return Readers(stream_normalize=self.batch_bytes is None and self.backend.normalizes_while_reading)

    # ---- kernels on the corpus
    def normalize(self, column: Any) -> tuple[StringBuffers, int]:
        """Normalized texts of ``column`` (a host Arrow column, or the device reader's texts) and the count of
        invalid UTF-8 rows: at once where the backend computes, or (above the memory limit) in slices of at
        most ``batch_bytes`` of text, kept on the host."""
        cfg = self.cfg.normalize
        if self.batch_bytes is None:
            return self.backend.normalize_column(column, cfg)
        parts, invalid = [], 0
        for chunk in column.chunks:
            for a, b in byte_batches(string_buffers(chunk).offsets, self.batch_bytes):
                buf, bad = self.backend.normalize_column(chunk.slice(a, b - a), cfg)
                parts.append(arrow_strings(to_host(buf.offsets), to_host(buf.data)))
                invalid += bad
        norm = pa.concat_arrays(parts) if parts else empty_array(pa.large_string())
        return string_buffers(norm), invalid

    def row_slices(self, m: int, lengths: Callable[[], np.ndarray], max_rows: int) -> list:
        """(lo, hi) slices of ``m`` rows for the kernels, ``max_rows`` each, and (above the memory limit) at
        most ``batch_bytes`` of text each (``lengths()``: the rows' text bytes, asked only then)."""
        if self.batch_bytes is None or m == 0:
            return [(lo, min(lo + max_rows, m)) for lo in range(0, m, max(max_rows, 1))]
        offsets = np.concatenate(([0], np.cumsum(lengths())))
        return byte_batches(offsets, self.batch_bytes, max_rows)

    # ---- writing
    def shard_writers(self, device_table: Any) -> tuple[Callable | None, Callable | None]:
        """(writer of one shard's kept rows on the device, which reads the shard again; writer of every shard
        from the device table the read stage held, where it holds every column): where ``gpu.writer`` asks for
        them, else None."""
        writer = self.cfg.gpu.writer
        whole = device_table is not None and device_table.whole  # not a removal list's text alone
        one = shard_writer(self.backend, writer) if not whole else None
        table = self.backend.write_table if whole and writer != "pyarrow" else None
        return one, table

    def report(self, reader: str, writers: dict | None, device_writer: Callable | None) -> dict:
        """The report's section of the plan (``gpu``: the plan, the reader and writers, the bytes that crossed
        the bus), or nothing where there is no device memory."""
        if self.plan is None:
            return {}
        moved = {k: v - self._transfers0[k] for k, v in transfer_totals().items()}
        return {"gpu": {**self.plan, "reader": reader,
                        "writer": writers or ("pyarrow" if device_writer is None else "cudf"), **moved}}


def shard_writer(backend: Any, setting: str) -> Callable | None:
    """The device's writer of one shard's kept rows, which reads the shard again (``backend.write_parquet``: cuDF's
    on a GPU, None on the CPU), where ``gpu.writer`` (``setting``) asks for it; else None (pyarrow writes)."""
    return backend.write_parquet if setting == "cudf" else None


def byte_batches(offsets: np.ndarray, batch_bytes: int, max_rows: int | None = None) -> list:
    """(a, b) row slices, in order, of rows whose bytes are ``offsets[k]..offsets[k+1]``, each holding at
    most ``batch_bytes`` (a longer row is a slice of its own) and ``max_rows`` rows; one search per
    slice, not a step per row."""
    n = offsets.shape[0] - 1
    out, a = [], 0
    while a < n:
        b = int(np.searchsorted(offsets, offsets[a] + batch_bytes, side="right")) - 1
        b = max(a + 1, min(n, b, a + max_rows if max_rows else n))
        out.append((a, b))
        a = b
    return out
