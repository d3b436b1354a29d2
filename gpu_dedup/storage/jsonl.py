"""JSON Lines shards (optionally .gz/.bz2/.zst): bytes, line scanning, parsing, bad-line reports, writing
kept lines back byte for byte in the input's compression."""

from __future__ import annotations

import json
import logging
import os
import re

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from gpu_dedup.backends.arrow_arrays import numpy_array
from gpu_dedup.errors import InputError, read_error
from gpu_dedup.kernels.lines_cpu import first_nonblank, gather_lines, nonblank_lines
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import is_url, read_buffer
from gpu_dedup.storage.filesystems import open_stream as remote_stream

log = logging.getLogger("gpu_dedup")


CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}


def codec_of(path: str) -> str | None:
    """The compression of a JSON Lines shard, by its extension in any case (``.GZ`` too); None: plain."""
    return CODECS.get(os.path.splitext(str(path).lower())[1])


def open_stream(path: str):
    """An Arrow input stream of the shard's decompressed bytes (an object in a store through its filesystem)."""
    if is_url(path):
        return remote_stream(path)
    return pa.input_stream(path, compression=codec_of(path))


def read_bytes(path: str):
    """The shard's (decompressed) bytes as an Arrow buffer: memory-mapped when uncompressed."""
    if is_url(path):  # an object in a store: downloaded whole
        return read_buffer(path)
    try:
        if codec_of(path) is None:
            with pa.memory_map(path) as f:
                return f.read_buffer()
        with open_stream(path) as f:
            return f.read_buffer()
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(path, exc, _unreadable(path, exc)) from None


def _unreadable(path: str, exc: BaseException) -> str:
    """The message for a shard that cannot be read: what failed and what to do about it."""
    codec = codec_of(path)
    if codec is None or getattr(exc, "errno", None) is not None:  # e.g. permission denied
        return f"cannot read shard {path!r}: {exc}; fix its permissions, or replace or remove it"
    tool = {"gzip": "gzip", "bz2": "bzip2", "zstd": "zstd"}[codec]
    return (f"cannot read shard {path!r}: {exc}; it is not valid {codec} data as its name says (truncated, padded, "
            f"or compressed another way): test it with {tool} -t, then replace or remove it")


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
    try:
        return pajson.read_json(pa.BufferReader(body), read_options=pajson.ReadOptions(block_size=JSON_BLOCK),
                                parse_options=parse_options)
    except pa.ArrowInvalid as exc:
        if "straddl" not in str(exc):
            raise
    # a line longer than a block (pyarrow refuses an object across more than two blocks): the body as one block,
    # parsed on one thread (a valid 50 MB document is a document, not an error)
    size = pa.py_buffer(body).size
    return pajson.read_json(pa.BufferReader(body), read_options=pajson.ReadOptions(block_size=min(size + 1, 2**31 - 1)),
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
    _check_objects(shard, data, starts, ends)
    _check_depth(shard, data, starts, ends)
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
        cr_only = starts.shape[0] == 1 and table.num_rows > 1 and b"\r" in bytes(data[starts[0]:ends[0]])
        fix = ("its lines end with a carriage return alone (classic Mac OS line ends): convert them to \\n, e.g. "
               f"tr '\\r' '\\n' < {os.path.basename(shard.path)} > NEW.jsonl") if cr_only else \
            "each line must hold exactly one JSON object"
        raise InputError(
            f"shard {shard.path!r}: {starts.shape[0]} non-blank lines but {table.num_rows} JSON records; {fix}"
        )
    if wanted and wanted.get("id") in table.column_names and pa.types.is_floating(table.column(wanted["id"]).type):
        check_json_float_ids(shard, wanted["id"], table.column(wanted["id"]), data)
    if wanted and wanted.get("text") in table.column_names:
        _warn_missing_field(shard, wanted["text"], table.column(wanted["text"]), data, starts, ends)
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
        with open_stream(path) as f:
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
        raise read_error(path, exc, _unreadable(path, exc)) from None


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
        first = first_nonblank(data, starts, ends)
        if deep_lines(data, starts, ends)[0].shape[0]:  # nesting the parser cannot take: the whole read names it
            raise ReadWhole(shard.path)
        if schema is None:  # the first lines: the sample read_jsonl takes, whole in this block
            if not wanted or (ahead is not None and
                              np.searchsorted(starts, starts[0] + SAMPLE_BYTES) >= starts.shape[0]):
                raise ReadWhole(shard.path)
            if starts[0] == 0 and ends[0] > 3 and bytes(data[:3]) == b"\xef\xbb\xbf":  # a UTF-8 byte order mark
                first[0] = first_nonblank(data, starts[:1] + 3, ends[:1])[0]
            try:
                schema = _wanted_schema(data, starts, ends, wanted)
            except pa.ArrowException:
                schema = None
            if schema is None or (wanted.get("id") in schema.names
                                  and pa.types.is_floating(schema.field(wanted["id"]).type)):
                raise ReadWhole(shard.path)  # floating ids: checked against the whole file's integers
        if np.any(first != ord("{")):  # a line that is no JSON object: reported (by line) by the whole read
            raise ReadWhole(shard.path)
        try:
            table = _parse_json(pa.py_buffer(block), pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=False))
        except pa.ArrowException:
            raise ReadWhole(shard.path) from None
        if table.num_rows != starts.shape[0]:
            raise ReadWhole(shard.path)
        text = wanted.get("text")
        if text in table.column_names and table.column(text).null_count and \
                _missing_field(text, table.column(text), data, starts, ends)[1]:
            raise ReadWhole(shard.path)  # lines without the text field: the whole read tells which (a warning)
        yield table


# Arrays / objects nested deeper than this in a line are refused (see _check_depth).  pyarrow 26's JSON parser
# crashes from about 16,400 levels with 8 MiB thread stacks, 8,200 with 4 MiB, 4,100 with the 2 MiB glibc gives
# threads under `ulimit -s unlimited`, 2,100 with 1 MiB (about 500 bytes of stack a level); Python's json, which
# reads some lines too, raises RecursionError from about 1,000; nested arrays take time growing as the square of
# the depth (12 s for one line 8,000 deep).  512 stays under all of them with room (a 256 KiB stack would do),
# and far above what documents hold.
DEPTH_LIMIT = 512
_DEPTH_WINDOW = 1 << 16  # bytes per window of the prefilter's bracket counts
_DEPTH_CHUNK = 1 << 20  # bytes compared at a time (in cache)


def _opens_per_window(data: np.ndarray) -> np.ndarray:
    """The number of ``[`` and ``{`` bytes in each _DEPTH_WINDOW bytes of ``data`` (a vectorized pass a MiB at
    a time: about 3 ms for 32 MiB, strings not told apart)."""
    n = data.shape[0]
    counts = np.empty(-(-n // _DEPTH_WINDOW), np.int64)
    scratch = np.empty(min(n, _DEPTH_CHUNK), np.uint8)
    k = 0
    for off in range(0, n, _DEPTH_CHUNK):  # one step per MiB
        part = scratch[:min(_DEPTH_CHUNK, n - off)]
        np.bitwise_or(data[off:off + part.shape[0]], 0x20, out=part)  # [ (0x5B) and { (0x7B) both 0x7B, alone
        hit = part.view(np.bool_)
        np.equal(part, 0x7B, out=hit)
        for w in range(0, part.shape[0], _DEPTH_WINDOW):
            counts[k] = np.count_nonzero(hit[w:w + _DEPTH_WINDOW])
            k += 1
    return counts


@numba.njit(cache=True, nogil=True)
def _depths(data, starts, ends, out):  # pragma: no cover - compiled
    for k in range(starts.shape[0]):
        depth = 0
        most = 0
        in_string = False
        escaped = False
        for i in range(starts[k], ends[k]):
            b = data[i]
            if in_string:
                if escaped:
                    escaped = False
                elif b == 92:  # \\
                    escaped = True
                elif b == 34:  # "
                    in_string = False
            elif b == 34:
                in_string = True
            elif b == 91 or b == 123:  # [ {
                depth += 1
                if depth > most:
                    most = depth
            elif b == 93 or b == 125:  # ] }
                depth -= 1
        out[k] = most


def line_depths(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per line, the greatest nesting of its arrays and objects (brackets in strings not counted; from an
    unterminated string on, nothing is): one compiled pass over the lines' bytes, about 1.4 GB/s."""
    out = np.empty(starts.shape[0], np.int64)
    _depths(data, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(ends, np.int64), out)
    return out


def json_depth(line: bytes) -> int:
    """:func:`line_depths` of one JSON text."""
    data = np.frombuffer(line, np.uint8)
    return int(line_depths(data, np.zeros(1, np.int64), np.full(1, data.shape[0], np.int64))[0])


def deep_lines(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, limit: int = DEPTH_LIMIT) -> tuple:
    """(indices, depths) of the lines whose arrays / objects nest deeper than ``limit``.  Two sieves: the
    ``[``/``{`` bytes counted per 64 KiB window (a line nests no deeper than the brackets of the windows it
    spans: on usual data no line is left, and that is the whole cost, about 3 ms for 32 MiB), then the exact
    depth of the lines left (text holding many brackets of its own: code, LaTeX; about 25 ms for 32 MiB)."""
    none = np.empty(0, np.int64), np.empty(0, np.int64)
    if starts.shape[0] == 0:
        return none
    per_window = np.concatenate(([0], np.cumsum(_opens_per_window(data))))
    if per_window[-1] <= limit:
        return none
    spans = per_window[(ends - 1) // _DEPTH_WINDOW + 1] - per_window[starts // _DEPTH_WINDOW]
    suspects = np.flatnonzero(spans > limit)
    if suspects.shape[0] == 0:
        return none
    depths = line_depths(data, starts[suspects], ends[suspects])
    deep = depths > limit
    return suspects[deep], depths[deep]


def _check_depth(shard: Shard, data, starts, ends) -> None:
    """A line whose arrays / objects nest deeper than DEPTH_LIMIT is refused, naming it: pyarrow's JSON parser
    recurses once per level and overflows its thread's stack (a segmentation fault, no error) at about
    16,000 levels with an 8 MiB stack (fewer with a smaller one), and takes time growing as the square of
    the depth before that."""
    deep, depths = deep_lines(data, starts, ends)
    if deep.shape[0]:
        k = int(deep[0])
        name = os.path.basename(shard.path)
        raise InputError(
            f"line {_line_number(data, starts[k])} of shard {shard.path!r} nests arrays/objects {int(depths[0])} "
            f"levels deep ({deep.shape[0]} such line(s)), beyond the {DEPTH_LIMIT} levels the JSON reader takes "
            f"(deeper nesting overflows its parser's stack); flatten or drop the deep field, e.g. jq -c "
            f"'del(.FIELD)' {name} > NEW.jsonl, or remove the line")


def _line_number(data, pos: int) -> int:
    return int(np.count_nonzero(data[:pos] == 0x0A)) + 1


def _check_objects(shard: Shard, data, starts, ends) -> None:
    """Every non-blank line must hold a JSON object: a line that is ``null`` (read as a document of nulls),
    a number, a string or an array is refused, naming its line."""
    first = first_nonblank(data, starts, ends)
    if starts[0] == 0 and ends[0] > 3 and bytes(data[:3]) == b"\xef\xbb\xbf":  # a UTF-8 byte order mark
        first[0] = first_nonblank(data, starts[:1] + 3, ends[:1])[0]
    bad = np.flatnonzero(first != ord("{"))
    head = bytes(data[starts[0]:min(ends[0], starts[0] + 4)])
    if bad.shape[0] and head[:2] in (b"\xff\xfe", b"\xfe\xff", b"{\x00", b"\x00{"):  # a byte order mark, or none
        raise InputError(f"shard {shard.path!r} is UTF-16 text (it starts with {head!r}), not UTF-8: JSON Lines must be "
                         f"UTF-8; convert it, e.g. iconv -f UTF-16 -t UTF-8 {os.path.basename(shard.path)} > NEW.jsonl")
    if bad.shape[0]:
        k = int(bad[0])
        text = bytes(data[starts[k]:min(ends[k], starts[k] + 40)]).decode("utf-8", "replace").strip()
        name = os.path.basename(shard.path)
        if int(first[0]) == ord("["):  # an exported array of documents (a .json file), not JSON Lines
            fix = f"the file looks like one JSON array, not JSON Lines: convert it, e.g. jq -c '.[]' {name} > NEW.jsonl"
        elif bytes(data[starts[0]:ends[0]]).strip().removeprefix(b"\xef\xbb\xbf") == b"{":  # pretty-printed
            fix = f"the file looks like indented JSON, a document over several lines: write one document a line, " \
                  f"e.g. jq -c . {name} > NEW.jsonl"
        else:
            fix = "each line must hold one document as a JSON object: fix or remove those lines"
        raise InputError(f"line {_line_number(data, starts[k])} of shard {shard.path!r} is {text!r}, not a JSON "
                         f"object ({bad.shape[0]} such line(s)); {fix}")


MISSING_SAMPLE = 10_000  # lines with a null text checked for a missing text field (a warning's evidence)


def _missing_field(name: str, column, data, starts, ends) -> tuple:
    """(the rows whose text is null, those of the first MISSING_SAMPLE of them whose line has no ``name``)."""
    nulls = np.flatnonzero(numpy_array(column.is_null()))
    if nulls.shape[0] == 0:
        return nulls, []
    sample = nulls[:MISSING_SAMPLE]
    lines = bytes(gather_lines_of(data, starts[sample], ends[sample])).decode("utf-8", "replace").splitlines()
    return nulls, [k for k, line in zip(sample, lines) if name not in json.loads(line)]  # a sample of bad lines


def _warn_missing_field(shard: Shard, name: str, column, data, starts, ends) -> None:
    """Lines without the text field are read as documents without text (counted as null_text); say so,
    naming a line, unlike an explicit ``null``.  Only lines whose text is null are looked at (at most
    MISSING_SAMPLE of them)."""
    nulls, missing = _missing_field(name, column, data, starts, ends)
    if missing:
        log.warning("%s%d line(s) of shard %s have no %r field (first: line %d) and are read as documents without "
                    "text (counted as null_text); name the text field with --text-column if it is another one",
                    "at least " if nulls.shape[0] > MISSING_SAMPLE else "", len(missing), shard.path, name,
                    _line_number(data, starts[missing[0]]))


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
        else:  # each half parses, together they do not: the first line whose types disagree with the lines before
            first, last = 1, hi  # pyarrow's row number counts records of its parse block, not lines of the file
            while last > first:
                k = (first + last) // 2
                if fails(0, k) is not None:
                    last = k
                else:
                    first = k + 1
            err = fails(0, last)
            reason = re.sub(r"\.? in row \d+$", "", str(err or exc).strip())
            line = int(np.count_nonzero(data[: starts[last - 1]] == 0x0A)) + 1
            return f"line {line}: {reason} (a field of another type than in the lines before it); " \
                   "fields must keep one type across lines"
    err = fails(lo, hi)  # the one line left (a shard without lines returns before parsing)
    if err is None:
        return str(exc)
    line = int(np.count_nonzero(data[: starts[lo]] == 0x0A)) + 1
    reason = re.sub(r"\.? in row \d+$", "", str(err).strip())
    control = re.search(rb"[\x00-\x1f]", bytes(data[starts[lo]:ends[lo]]).rstrip(b"\r"))
    if control is not None and "Invalid encoding" in reason:  # what the parser says of a raw tab in a string
        reason += (f" (a raw control character, byte {control.group()[0]:#04x} at byte {control.start() + 1} of the "
                   "line: JSON strings must escape them, e.g. \\t for a tab)")
    return f"line {line}: {reason}; fix or remove that line"


def check_json_float_ids(shard: Shard, column: str, ids, data=None) -> None:
    """JSON integers beyond int64 are parsed as doubles, which keep only 53 bits: such ids would not be
    kept verbatim (distinct ids could even collapse into one), so they are refused.  So are integers mixed
    with numbers that have a fraction or exponent (``data``: the shard's bytes): the reader makes every id a
    double, so ``4`` would be kept as ``4.0``."""
    big = pc.max(pc.abs(ids)).as_py()
    if big is not None and big >= 2.0**53:
        raise InputError(
            f"id column {column!r} of shard {shard.path!r} holds numbers as large as {big:.6g}, beyond what a JSON "
            "reader keeps exactly (integers beyond 2**63 are read as floating point, losing digits); write the ids "
            "as JSON strings, or use --no-id-column to name documents by row")
    if data is None:
        return
    key = rb"[{,]\s*" + re.escape(json.dumps(column).encode()) + rb"\s*:\s*"
    integer = re.search(key + rb"(-?\d+)\s*[,}]", data)  # C loops over the buffer; the first of each kind
    real = re.search(key + rb"(-?\d+(?:\.\d*(?:[eE][-+]?\d+)?|[eE][-+]?\d+))\s*[,}]", data)
    if integer is not None and real is not None:
        i, r = integer.group(1).decode(), real.group(1).decode()
        raise InputError(
            f"id column {column!r} of shard {shard.path!r} mixes integers (line {_line_number(data, integer.start(1))}"
            f": {i}) and numbers with a fraction or exponent (line {_line_number(data, real.start(1))}: {r}), so a "
            f"JSON reader makes every id a floating-point number ({i} would be kept as {float(i)}); write the ids as "
            "one type (all integers, or JSON strings), or use --no-id-column to name documents by row")


def compress_like(path: str, body: bytes) -> bytes:
    codec = codec_of(path)
    if codec is None:
        return body
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as out:
        out.write(body)
    return sink.getvalue().to_pybytes()

