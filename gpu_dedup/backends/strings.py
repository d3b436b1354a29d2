"""Zero-copy views of Arrow string arrays as (offsets, bytes) for the kernels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class StringBuffers:
    """``offsets`` (int64, n + 1, absolute positions into ``data``) and ``data`` (uint8)."""

    offsets: np.ndarray
    data: np.ndarray

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])


def as_arrow_strings(texts) -> pa.Array:
    """Coerce a pyarrow (chunked) array, pandas Series, NumPy array or list of str to one Arrow array."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    elif not isinstance(texts, pa.Array):
        texts = pa.array(texts, type=pa.large_string())
    if not (
        pa.types.is_string(texts.type)
        or pa.types.is_large_string(texts.type)
        or pa.types.is_binary(texts.type)
        or pa.types.is_large_binary(texts.type)
    ):
        raise TypeError(f"expected a string column, got Arrow type {texts.type}")
    return texts


def string_buffers(texts) -> StringBuffers:
    """Offsets and bytes of an Arrow string/binary array (nulls read as empty)."""
    arr = as_arrow_strings(texts)
    if arr.null_count:  # Arrow lets a null slot span bytes: make every null read as empty
        arr = arr.fill_null(pa.scalar(b"" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) else "", arr.type))
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, off_buf, data_buf = arr.buffers()
    if off_buf is None:  # zero-length array
        return StringBuffers(np.zeros(1, np.int64), np.zeros(0, np.uint8))
    offsets = np.frombuffer(off_buf, dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return StringBuffers(offsets, data)
