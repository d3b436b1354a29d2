"""Vectors for ``similarity: cosine``: a user's embedding column, or term-weight vectors of the text.

Embedding column (:func:`from_arrow`)
-------------------------------------
Arrow ``list<float>``, ``large_list<float>`` or ``fixed_size_list<float>`` with
float16, float32 or float64 values becomes one float32 ``(n, d)`` matrix:
zero-copy when the values are float32, the column is one chunk and every
row has ``d`` values laid out back to back (always true of a
``fixed_size_list``); otherwise one gather (float16 converts exactly;
float64 rounds to float32, and a value beyond the float32 range becomes
infinity).  ``d`` is the length of the first non-null row (or ``dim``).

Every row gets a status (``projections.STATUS_NAMES``); rows with a nonzero
status are never bucketed, so they survive unchanged, and are counted:

====================  ==========================================================
null row              kept, counted (``null``): no embedding was given
zero vector           kept, counted (``zero_vector``): a cosine needs a direction
NaN / inf / null      ``cosine.bad_vectors: error`` (default): InputError naming
value inside a row    the first such row (its row in the shard, and the shard) and the
                      fix; ``keep``: kept, counted (``non_finite``)
another length        as NaN/inf (``bad_length``)
====================  ==========================================================

Text (:func:`document_frequencies`, :func:`idf_table`, :func:`term_vectors`)
-------------------------------------------------------------------------------
Features are the word or char n-grams of the normalized text hashed to 64
bits (``kernels/cosine_scalar.py``, rule 6); a document's vector has one
coordinate per distinct feature (no dimension: a 2**64 hashed space) with
weight

- ``tf``: the feature's count in the document;
- ``tfidf``: count x ``idf_q``, ``idf_q = rint(256 * (ln((1 + N) / (1 + df)) + 1))``
  (smoothed idf, quantized to 1/256), where ``N`` is the number of
  documents and ``df`` the document frequency of the feature's bucket: the
  top ``idf_bits`` bits of the feature hash index a table of counts, one
  added per (document, distinct feature).  The table has a fixed size, is
  summed across workers and is computed in one pass over the corpus;
  features sharing a bucket share an idf.

Weights are integers, so SimHash bits are exact integer sums and the exact
cosine (sparse dot products of the same weights) is reproducible.  A
document without features (empty after normalization) is ``empty_text``:
kept, counted, never bucketed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import array_module, get_backend, to_device, to_host, to_module
from gpu_dedup.backends.arrow_arrays import numpy_array
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.errors import InputError
from gpu_dedup.kernels import cosine_cpu as cpu
from gpu_dedup.stages.projections import (
    BAD_LENGTH,
    EMPTY_TEXT,
    MAX_DIM,
    NON_FINITE,
    NULL_ROW,
    OK,
    STATUS_NAMES,
    ZERO_VECTOR,
)

IDF_SCALE = 256
FLOAT_TYPES = (pa.float16(), pa.float32(), pa.float64())


@dataclass(frozen=True)
class Vectors:
    """Dense float32 vectors (``matrix``, (n, d)) and a status per row (0: usable)."""

    matrix: np.ndarray
    status: np.ndarray  # int8
    zero_copy: bool = False

    def __len__(self) -> int:
        return self.matrix.shape[0]

    @property
    def dim(self) -> int:
        return self.matrix.shape[1]

    @property
    def counts(self) -> dict:
        return status_counts(self.status)


def status_counts(status) -> dict:
    """{status name: rows} for every status (zeros included)."""
    xp = array_module(status)
    c = to_host(xp.bincount(xp.asarray(status).astype(xp.int64), minlength=len(STATUS_NAMES)))
    return {name: int(c[code]) for code, name in STATUS_NAMES.items()}


def _where(shard, row: int) -> str:
    return f"row {row}" + (f" of shard {shard}" if shard else "")


def from_arrow(column, *, shard: str | None = None, row_offset: int = 0, bad_vectors: str = "error",
               name: str = "vector column", dim: int | None = None, dim_source: str | None = None) -> Vectors:
    """Vectors of an Arrow list/fixed_size_list<float> column (Array or ChunkedArray); see the module doc.

    ``row_offset`` is added to row numbers in messages (the pipeline passes the
    row of the column's first value within its shard); ``dim`` fixes the expected length (default: the first
    non-null row's), ``dim_source`` says where it comes from in messages (default: the first vector).
    """
    if bad_vectors not in ("error", "keep"):
        raise ValueError(f"bad_vectors = {bad_vectors!r}; choose error or keep")
    if pa.types.is_null(column.type):  # no vector at all (a JSON field always null, an all-None column)
        column = pa.chunked_array(column.chunks if isinstance(column, pa.ChunkedArray) else [column])
        column = pa.chunked_array([pa.nulls(len(c), pa.list_(pa.float32())) for c in column.chunks],
                                  pa.list_(pa.float32()))
    elif _is_list(column.type) and pa.types.is_null(column.type.value_type):  # lists of nulls only (or empty)
        column = column.cast(_with_values(column.type, pa.float32()))
    if isinstance(column, pa.ChunkedArray):
        chunks = column.chunks
        typ = column.type
    else:
        chunks = [column]
        typ = column.type
    _check_type(typ, name, shard)
    if dim is None:
        dim = _first_length(chunks)
    _check_dim(dim, name, shard)
    if dim is None or dim < 1:  # no non-null row, or only empty lists
        n = sum(len(c) for c in chunks)
        status = np.full(n, NULL_ROW, np.int8)
        if dim == 0:
            valid = np.concatenate([numpy_array(c.is_valid()) for c in chunks]) if chunks else np.zeros(0, bool)
            status[valid] = BAD_LENGTH
            if bad_vectors == "error" and valid.any():
                row = int(np.flatnonzero(valid)[0])
                raise InputError(f"{name}: {_where(shard, row_offset + row)} is an empty vector (0 values); "
                                 "give every row the embedding's dimension, or set cosine.bad_vectors: keep")
        return Vectors(np.zeros((n, max(dim or 0, 1)), np.float32), status)
    parts, statuses, zero_copy = [], [], len(chunks) == 1
    base = 0
    for chunk in chunks:  # one step per Arrow chunk
        m, s, zc = _chunk(chunk, dim)
        parts.append(m)
        statuses.append(s)
        zero_copy = zero_copy and zc
        base += len(chunk)
    matrix = parts[0] if len(parts) == 1 else (np.concatenate(parts) if parts else np.zeros((0, dim), np.float32))
    status = np.concatenate(statuses) if statuses else np.zeros(0, np.int8)
    found = status == OK
    if found.any():  # NaN / inf / zero among the rows with the right length (one pass, no copy)
        raw = np.empty(status.shape[0], np.int8)
        cpu.check_rows(matrix, raw)
        status[found] = np.where(raw == 2, NON_FINITE, np.where(raw == 1, ZERO_VECTOR, OK))[found]
    if bad_vectors == "error":
        _raise_first_bad(status, matrix, dim, shard, row_offset, name, chunks, dim_source)
    return Vectors(matrix, status, zero_copy)


def _is_list(typ) -> bool:
    return pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)


def _with_values(typ, value_type):
    """The list type ``typ`` (list, large_list or fixed_size_list) with values of ``value_type``."""
    if pa.types.is_fixed_size_list(typ):
        return pa.list_(value_type, typ.list_size)
    return pa.large_list(value_type) if pa.types.is_large_list(typ) else pa.list_(value_type)


def _check_type(typ, name, shard):
    if not _is_list(typ):
        raise InputError(f"{name} has Arrow type {typ}" + (f" in shard {shard}" if shard else "")
                         + "; expected list<float> or fixed_size_list<float> (float16/32/64) of embeddings")
    if typ.value_type not in FLOAT_TYPES:
        raise InputError(f"{name} holds {typ.value_type} values" + (f" in shard {shard}" if shard else "")
                         + "; expected float16, float32 or float64 (cast the embeddings to float32)")


def _check_dim(dim: int | None, name: str, shard) -> None:
    """The vectors' dimension within what signatures support (:data:`projections.MAX_DIM`)."""
    if dim is not None and dim > MAX_DIM:
        raise InputError(f"{name}" + (f" in shard {shard}" if shard else "") + f" has {dim:,} dimensions; at most "
                         f"{MAX_DIM:,} are supported: reduce the embeddings' dimension (e.g. a random projection or "
                         "PCA to 1,024) or leave out input.vector_column to compare tf-idf vectors of the text")


def _first_length(chunks) -> int | None:
    for chunk in chunks:  # stops at the first chunk with a non-null row
        if pa.types.is_fixed_size_list(chunk.type):
            return chunk.type.list_size
        valid = numpy_array(chunk.is_valid())
        if valid.any():
            i = int(np.argmax(valid))
            off = np.asarray(chunk.offsets)
            return int(off[i + 1] - off[i])
    return None


def _values_f32(values: pa.Array):
    """Child values as float32 NumPy (zero-copy for float32 without nulls) and a per-value null mask."""
    nulls = numpy_array(values.is_null()) if values.null_count else None
    if values.type == pa.float32() and nulls is None:
        return values.to_numpy(zero_copy_only=True), None, True
    if nulls is not None:
        values = values.fill_null(0)
    with np.errstate(over="ignore"):  # float64 beyond the float32 range -> inf (then non_finite)
        return values.to_numpy(zero_copy_only=False).astype(np.float32), nulls, False


def _chunk(chunk, dim):
    n = len(chunk)
    valid = numpy_array(chunk.is_valid()) if chunk.null_count else np.ones(n, bool)
    status = np.where(valid, OK, NULL_ROW).astype(np.int8)
    if pa.types.is_fixed_size_list(chunk.type):
        size = chunk.type.list_size
        child = chunk.values.slice(chunk.offset * size, n * size)
        vals, nulls, zc = _values_f32(child)
        if size != dim:
            status[valid] = BAD_LENGTH
            return np.zeros((n, dim), np.float32), status, False
        matrix = vals.reshape(n, dim)
        if nulls is not None:
            status[valid & nulls.reshape(n, dim).any(axis=1)] = NON_FINITE
        return matrix, status, zc
    off = np.asarray(chunk.offsets).astype(np.int64)  # n + 1, slice-aware
    lengths = np.diff(off)
    status[valid & (lengths != dim)] = BAD_LENGTH
    child = chunk.values
    lo, hi = int(off[0]), int(off[-1])
    vals, nulls, zc = _values_f32(child.slice(lo, hi - lo))
    off = off - lo
    if (np.all(off == np.arange(n + 1, dtype=np.int64) * dim)):  # every row back to back: a view
        matrix = vals.reshape(n, dim)
    else:
        zc = False
        matrix = np.zeros((n, dim), np.float32)
        good = np.flatnonzero(status == OK)
        if good.shape[0]:
            matrix[good] = vals[off[good][:, None] + np.arange(dim)[None, :]]
    if nulls is not None:
        rows_with_null = np.zeros(n, bool)
        pos = np.flatnonzero(nulls)
        rows_with_null[np.searchsorted(off, pos, side="right") - 1] = True
        status[(status == OK) & rows_with_null] = NON_FINITE
    return matrix, status, zc


def _raise_first_bad(status, matrix, dim, shard, row_offset, name, chunks, dim_source=None):
    bad = np.flatnonzero((status == NON_FINITE) | (status == BAD_LENGTH))
    if bad.shape[0] == 0:
        return
    i = int(bad[0])
    more = f" ({bad.shape[0]:,} such rows in all)" if bad.shape[0] > 1 else ""
    fix = "fix or drop those rows, or set cosine.bad_vectors: keep to keep them unbucketed (counted in the report)"
    if status[i] == BAD_LENGTH:
        length = _row_length(chunks, i)
        raise InputError(f"{name}: {_where(shard, row_offset + i)} has {length} values, expected {dim} "
                         f"({dim_source or 'the dimension of the first vector'}){more}; {fix}")
    raise InputError(f"{name}: {_where(shard, row_offset + i)} holds NaN, infinity, a null value or a value beyond "
                     f"the float32 range{more}; {fix}")


def _row_length(chunks, i: int) -> int:
    for chunk in chunks:  # a few chunks
        if i < len(chunk):
            if pa.types.is_fixed_size_list(chunk.type):
                return chunk.type.list_size
            off = np.asarray(chunk.offsets)
            return int(off[i + 1] - off[i])
        i -= len(chunk)
    return -1


def from_numpy(matrix, *, shard: str | None = None, row_offset: int = 0, bad_vectors: str = "error",
               name: str = "vectors") -> Vectors:
    """Vectors of an in-memory (n, d) float array (the DataFrame API): statuses as in :func:`from_arrow`."""
    try:
        m = np.asarray(matrix)
    except ValueError:  # rows of different lengths (NumPy refuses a ragged array)
        lengths = [len(r) if hasattr(r, "__len__") else 1 for r in matrix]
        row = next((i for i, n in enumerate(lengths) if n != lengths[0]), 0)
        if not row:
            raise InputError(f"{name} must be a 2-d (rows, dimensions) array of numbers; convert the vectors, e.g. "
                             "np.asarray(vectors, np.float32)") from None
        raise InputError(f"{name} must be rows of numbers of one length: row 0 has {lengths[0]} values, row {row} "
                         f"has {lengths[row]}; give every row the embedding's dimension") from None
    if m.ndim != 2:
        raise InputError(f"{name} must be a 2-d (rows, dimensions) array, got shape {m.shape}")
    _check_dim(m.shape[1], name, shard)
    try:
        m = np.ascontiguousarray(m, dtype=np.float32)
    except (TypeError, ValueError):
        bad = next((v for v in m.ravel() if not isinstance(v, (int, float, np.number))), m.ravel()[0])
        raise InputError(f"{name} must hold numbers; found {bad!r:.40} ({type(bad).__name__}): convert the "
                         "vectors to floats, e.g. np.asarray(vectors, np.float32)") from None
    raw = np.empty(m.shape[0], np.int8)
    cpu.check_rows(m, raw)
    status = np.where(raw == 2, NON_FINITE, np.where(raw == 1, ZERO_VECTOR, OK)).astype(np.int8)
    if bad_vectors == "error":
        _raise_first_bad(status, m, m.shape[1], shard, row_offset, name, [])
    return Vectors(m, status, m is matrix)


# ---------------------------------------------------------------- text: hashed term-weight vectors


@dataclass(frozen=True)
class IdfTable:
    """Quantized smoothed idf per hashed bucket: ``weights[f >> (64 - bits)]`` (int64, 1/256 units)."""

    bits: int
    documents: int
    df: np.ndarray = field(repr=False)  # int64, 2**bits
    weights: np.ndarray = field(repr=False)  # int64, 2**bits
    _copies: dict = field(default_factory=dict, repr=False, compare=False)  # array module name -> weights there

    def weights_on(self, xp):
        """``weights`` as an array of ``xp``: copied to a device once (counted), then reused."""
        if xp.__name__ not in self._copies:  # NumPy: the weights themselves
            self._copies[xp.__name__] = to_device(self.weights, xp)
        return self._copies[xp.__name__]

    def __getstate__(self):  # a table sent to workers leaves its device copies behind
        return {k: v for k, v in self.__dict__.items() if k != "_copies"}

    def __setstate__(self, state):
        self.__dict__.update(state, _copies={})


@dataclass(frozen=True)
class TermVectors:
    """Sparse term-weight vectors (CSR): row ``i`` has features ``features[offsets[i]:offsets[i+1]]``
    (ascending, distinct) with integer ``weights`` (float64) and L2 norm ``norms[i]``; arrays of the
    texts' array module (device arrays for device texts on the GPU backend)."""

    offsets: np.ndarray  # int64, n + 1
    features: np.ndarray  # uint64
    weights: np.ndarray  # float64 (integer values)
    norms: np.ndarray  # float64

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1


def _buffers(texts):
    return texts if hasattr(texts, "offsets") else string_buffers(texts)


def feature_sets(texts, shingle: str = "word", ngram: int = 3, docs=None, backend="cpu"):
    """(offsets, features, tf): sorted distinct feature hashes of each document (rule 6) and their counts,
    computed by ``backend`` where it computes (on the device for device texts on the GPU backend)."""
    buf = _buffers(texts)
    xp = array_module(buf.offsets)
    docs = xp.arange(len(buf), dtype=xp.int64) if docs is None else docs
    return get_backend(backend).text_features(buf, docs, shingle == "word", int(ngram))


def _like(a, ref):
    """``a`` moved to the array module of ``ref`` (a counted copy when they differ)."""
    return to_module(a, array_module(ref))


def document_frequencies(texts, shingle: str = "word", ngram: int = 3, bits: int = 20,
                         chunk_bytes: int = 64 << 20, df=None, backend="cpu"):
    """Counts per hashed bucket (top ``bits`` bits of the feature hash), one per (document, distinct
    feature), over every document of ``texts``; adds to ``df`` when given (a running total over shards).

    Documents are processed in chunks of about ``chunk_bytes`` of text, so the
    memory is the table plus one chunk's features.  Array code of the texts'
    module: device texts on the GPU backend are counted on the device (the
    features never leave it).  Returns (df, documents), ``df`` where the texts
    are (or where the given ``df`` is).
    """
    buf = _buffers(texts)
    xp = array_module(buf.offsets)
    total = xp.zeros(1 << bits, dtype=xp.int64)
    shift = xp.uint64(64 - bits)
    n = len(buf)
    if n:
        cum = xp.cumsum(buf.lengths + 16)
        cuts = to_host(xp.searchsorted(cum, xp.arange(chunk_bytes, int(cum[-1]), chunk_bytes, dtype=xp.int64)))
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n]):  # a few chunks of documents
            if hi <= lo:
                continue
            _, feat, _ = feature_sets(buf, shingle, ngram, xp.arange(int(lo), int(hi), dtype=xp.int64), backend)
            total += xp.bincount((feat >> shift).astype(xp.int64), minlength=1 << bits)
    if df is None:
        return total, n
    df += _like(total, df)
    return df, n


def idf_table(df, documents: int, bits: int) -> IdfTable:
    """Quantized smoothed idf (module doc), computed on the host so every backend gets the same table."""
    df = np.asarray(to_host(df), np.int64)
    if df.shape[0] != 1 << bits:
        raise ValueError(f"df has {df.shape[0]} buckets; expected 2**{bits}")
    idf = np.log((1.0 + documents) / (1.0 + df)) + 1.0
    weights = np.rint(IDF_SCALE * idf).astype(np.int64)
    return IdfTable(bits, int(documents), df, weights)


def term_vectors(texts, shingle: str = "word", ngram: int = 3, idf: IdfTable | None = None,
                 docs=None, backend="cpu") -> TermVectors:
    """Sparse tf or tf-idf vectors (module doc) of ``docs`` (default: all) with their norms, where
    ``backend`` computes them (see :func:`feature_sets`)."""
    be = get_backend(backend)
    offsets, feat, tf = feature_sets(texts, shingle, ngram, docs, be)
    xp = array_module(feat)
    if idf is None:
        w = tf.astype(xp.float64)
    else:
        w = (tf * idf.weights_on(xp)[(feat >> xp.uint64(64 - idf.bits)).astype(xp.int64)]).astype(xp.float64)
    return TermVectors(offsets, feat, w, be.sparse_norms(offsets, feat, w))


def text_status(texts, shingle: str = "word", ngram: int = 3):
    """Per document: ``EMPTY_TEXT`` when it has no feature (no token at all), else 0."""
    buf = _buffers(texts)
    docs = np.arange(len(buf), dtype=np.int64)
    occurrences = np.zeros(docs.shape[0], np.int64)
    cpu.feature_occurrences(buf.offsets, buf.data, docs, cpu.tasks_for(buf.offsets, docs), shingle == "word",
                            int(ngram), occurrences)
    return np.where(occurrences > 0, OK, EMPTY_TEXT).astype(np.int8)
