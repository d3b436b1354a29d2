"""JSON Lines shards (optionally .gz/.bz2/.zst): bytes, line scanning, parsing, bad-line reports, writing
kept lines back byte for byte in the input's compression."""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from gpu_dedup.errors import InputError, read_error
from gpu_dedup.kernels.lines_cpu import gather_lines, nonblank_lines
from gpu_dedup.storage.discovery import COMPRESSED_EXT, Shard


def read_bytes(path: str):
    """The shard's (decompressed) bytes as an Arrow buffer: memory-mapped when uncompressed."""
    try:
        if not path.lower().endswith(COMPRESSED_EXT):
            with pa.memory_map(path) as f:
                return f.read_buffer()
        with pa.input_stream(path, compression="detect") as f:
            return f.read_buffer()
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(path, exc, f"cannot read shard {path!r}: {exc}") from None


def jsonl_lines(raw):
    """(data, starts, ends) of the non-blank lines of a JSON Lines buffer (one Numba pass)."""
    data = np.frombuffer(raw, np.uint8)
    starts, ends = nonblank_lines(data)
    return data, starts, ends


def gather_lines_of(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, newline=True) -> np.ndarray:
    """Concatenate data[starts[i]:ends[i]] (+ b'\\n') into one uint8 array (one Numba pass)."""
    return gather_lines(data, starts, ends, newline)


JSON_BLOCK = 1 << 24  # bytes per parse block (pyarrow parses blocks on its thread pool)
SAMPLE_BYTES = 1 << 20  # lines read first to learn the wanted fields' types


def _parse_json(body, parse_options=None) -> pa.Table:
    return pajson.read_json(pa.BufferReader(body), read_options=pajson.ReadOptions(block_size=JSON_BLOCK),
                            parse_options=parse_options)


def _wanted_schema(data, starts, ends, wanted: dict) -> pa.Schema | None:
    """Types of the ``wanted`` fields ({"text": name, "id": name, "score": name}) from the
    first lines, or None when a sample cannot fix them (a field absent or all null there,
    or a text that is not a string)."""
    stop = int(np.searchsorted(starts, starts[0] + SAMPLE_BYTES)) + 1
    lines = gather_lines_of(data, starts[:stop], ends[:stop])
    try:
        sample = _parse_json(lines).schema
    except pa.ArrowInvalid:  # e.g. an unwanted field of mixed types: infer the wanted ones alone
        sample = _sample_schema(lines, list(wanted.values()))
    types = {}
    for role, name in wanted.items():
        if name not in sample.names:
            return None
        t = sample.field(name).type
        if role == "text":
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                return None
            t = pa.large_string()
        elif pa.types.is_null(t):
            return None
        elif role == "score" and (pa.types.is_integer(t) or pa.types.is_floating(t)):
            t = pa.float64()  # read_columns casts the score to float64 anyway
        types.setdefault(name, t)
    return pa.schema(list(types.items()))


def _sample_schema(lines, names) -> pa.Schema:
    """Arrow types of ``names`` over a sample of JSON lines, by Python's json (the sample only:
    at most SAMPLE_BYTES); a name no line has is left out."""
    import json

    values = {name: [] for name in names}
    for line in bytes(lines).decode("utf-8", "replace").splitlines():  # the sample's lines, bounded
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:  # the full parse reports it
                continue
            for name in names:
                if isinstance(record, dict) and name in record:
                    values[name].append(record[name])
    fields = []
    for name, vals in values.items():
        if vals:
            try:
                fields.append(pa.field(name, pa.array(vals).type))
            except (pa.ArrowException, TypeError, ValueError):
                pass
    return pa.schema(fields)


def read_jsonl(shard: Shard, wanted: dict | None = None) -> pa.Table | None:
    """Parse the non-blank lines of a JSONL shard (None when it has none).

    ``wanted`` ({"text": name, "id": name, "score": name}): only those fields are
    built, with their types learned from the first lines; the other fields are
    parsed (the JSON must be valid) but not kept.  A shard whose sample cannot fix
    the types, or whose later lines disagree with them, is read with full type
    inference instead (every field, more memory).  The buffer is parsed where it
    lies: pyarrow skips the blank (whitespace-only) lines as this reader does.
    """
    raw = read_bytes(shard.path)
    data, starts, ends = jsonl_lines(raw)
    if starts.shape[0] == 0:
        return None
    body = raw
    table = None
    if wanted:
        try:
            schema = _wanted_schema(data, starts, ends, wanted)
            if schema is not None:
                table = _parse_json(body, pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                                                              newlines_in_values=False))
        except pa.ArrowException:
            table = None
    if table is None:
        try:
            table = _parse_json(body)
        except pa.ArrowException as exc:
            raise InputError(f"shard {shard.path!r} is not valid JSON Lines: {_bad_line(data, starts, ends, exc)}") \
                from None
    if table.num_rows != starts.shape[0]:
        raise InputError(
            f"shard {shard.path!r}: {starts.shape[0]} non-blank lines but {table.num_rows} JSON records; "
            "each line must hold exactly one JSON object"
        )
    return table


class ReadWhole(Exception):
    """A JSONL shard that cannot be read a block at a time: its later lines do not fit the types its first
    lines fixed (or those lines fix none); :func:`read_jsonl` reads it whole, inferring every type."""


def jsonl_blocks(path: str, block_bytes: int | None = None, first_bytes: int = 0):
    """The shard's (decompressed) bytes as buffers of whole lines, about ``block_bytes`` (default
    STREAM_BLOCK; the first at least ``first_bytes``) each, in order (the last one may lack a final
    newline).  Memory: about a block."""
    block_bytes = block_bytes or STREAM_BLOCK
    try:
        with pa.input_stream(path, compression="detect") as f:
            carry = b""
            size = max(block_bytes, first_bytes)
            while True:  # one step per block read
                chunk = f.read(size)
                size = block_bytes
                buf = carry + chunk if carry else chunk
                if not chunk:
                    if buf:
                        yield buf
                    return
                cut = buf.rfind(b"\n") + 1
                if cut == 0:  # no line ends in it yet
                    carry = buf
                    continue
                yield memoryview(buf)[:cut]
                carry = buf[cut:]
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(path, exc, f"cannot read shard {path!r}: {exc}") from None


STREAM_BLOCK = 1 << 25  # bytes of whole lines per streamed block (32 MiB)


def iter_jsonl(shard: Shard, wanted: dict, block_bytes: int | None = None):
    """:func:`read_jsonl`'s table of ``wanted`` fields a block of lines at a time: the types are learned
    from the first lines as there, each block parsed with them.  Raises :class:`ReadWhole` (maybe after
    some tables) where :func:`read_jsonl` would infer the types from the whole file or a block does not
    parse (it then reports the line); a shard without records yields nothing."""
    schema = None
    blocks = jsonl_blocks(shard.path, block_bytes, 2 * SAMPLE_BYTES)  # the first block holds the sample
    ahead = next(blocks, None)
    while ahead is not None:  # one step per block, with the next one read ahead
        block, ahead = ahead, next(blocks, None)
        data = np.frombuffer(block, np.uint8)
        starts, ends = nonblank_lines(data)
        if starts.shape[0] == 0:
            continue
        if schema is None:  # the first lines: the sample read_jsonl takes, whole in this block
            if not wanted or (ahead is not None and
                              np.searchsorted(starts, starts[0] + SAMPLE_BYTES) >= starts.shape[0]):
                raise ReadWhole(shard.path)
            try:
                schema = _wanted_schema(data, starts, ends, wanted)
            except pa.ArrowException:
                schema = None
            if schema is None:
                raise ReadWhole(shard.path)
        try:
            table = _parse_json(pa.py_buffer(block), pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False))
        except pa.ArrowException:
            raise ReadWhole(shard.path) from None
        if table.num_rows != starts.shape[0]:
            raise ReadWhole(shard.path)
        yield table


def _bad_line(data, starts, ends, exc) -> str:
    """Where a JSON Lines buffer fails to parse: ``line N: <the parser's reason>; fix or remove that line``.
    Found by halving the non-blank lines (pyarrow's own row number counts records of its parse block);
    when no single line fails (fields whose types disagree across lines) the parser's message as it is."""
    def fails(lo, hi):
        try:
            _parse_json(pa.py_buffer(gather_lines_of(data, starts[lo:hi], ends[lo:hi])))
            return None
        except pa.ArrowException as e:
            return e

    lo, hi = 0, starts.shape[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(lo, mid) is not None:
            hi = mid
        elif fails(mid, hi) is not None:
            lo = mid
        else:
            return f"{exc}; fields must keep one type across lines"
    err = fails(lo, hi)  # the one line left (a shard without lines returns before parsing)
    if err is None:
        return str(exc)
    line = int(np.count_nonzero(data[: starts[lo]] == 0x0A)) + 1
    reason = re.sub(r"\.? in row \d+$", "", str(err).strip())
    return f"line {line}: {reason}; fix or remove that line"


def check_json_float_ids(shard: Shard, column: str, ids) -> None:
    """JSON integers beyond int64 are parsed as doubles, which keep only 53 bits: such ids would not be
    kept verbatim (distinct ids could even collapse into one), so they are refused."""
    big = pc.max(pc.abs(ids)).as_py()
    if big is not None and big >= 2.0**53:
        raise InputError(
            f"id column {column!r} of shard {shard.path!r} holds numbers as large as {big:.6g}, beyond what a JSON "
            "reader keeps exactly (integers beyond 2**63 are read as floating point, losing digits); write the ids "
            "as JSON strings, or use --no-id-column to name documents by row")



def jsonl_codec(path: str) -> str | None:
    """The compression of a JSONL shard, by its extension (None: uncompressed)."""
    return {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(os.path.splitext(path.lower())[1])
