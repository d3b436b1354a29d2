"""DataFrame kinds (pyarrow, pandas, cuDF, Hugging Face datasets), registered in one place, as dask's
``dispatch`` does.

Wherever gpu_dedup meets a user's frame (the DataFrame API) or builds one to
move rows between Dask workers, it asks :func:`kind_of` (or :data:`KINDS`) for
the kind and calls its methods; no other module branches on frame types.  A
kind is recognised by its type's module name, so pandas, cuDF and datasets are
imported only when a frame of theirs is there.
"""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import on_device
from gpu_dedup.backends.arrow_arrays import filter_rows
from gpu_dedup.errors import InputError


class ArrowKind:
    name = "arrow"
    device = False  # its columns are in host memory

    def matches(self, obj) -> bool:
        return isinstance(obj, pa.Table)

    def columns(self, frame) -> list:
        return list(frame.column_names)

    def to_arrow(self, frame, cols: list) -> pa.Table:
        return frame.select(cols)

    def take(self, frame, kept: np.ndarray):
        return filter_rows(frame, pa.array(kept, pa.bool_()))  # view columns too

    def from_arrow(self, table: pa.Table):
        return table


class PandasKind:
    name = "pandas"
    device = False

    def matches(self, obj) -> bool:
        pd = sys.modules.get("pandas")  # a pandas frame exists only where pandas is imported
        return pd is not None and isinstance(obj, pd.DataFrame)

    def columns(self, frame) -> list:
        return list(frame.columns)

    def to_arrow(self, frame, cols: list) -> pa.Table:
        arrays = {}
        for c in cols:
            try:
                arrays[c] = pa.array(frame[c], from_pandas=True)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise InputError(f"column {c!r} cannot be converted to Arrow ({exc}); give it one type, e.g. "
                                 f"df[{c!r}].astype(str)") from None
            except UnicodeEncodeError as exc:  # a str holding a lone surrogate (text decoded with surrogateescape)
                raise _surrogate_error(frame[c], c, exc) from None
        return pa.table(arrays)

    def take(self, frame, kept: np.ndarray):
        return frame.iloc[np.flatnonzero(kept)]  # keeps its index and dtypes

    def from_arrow(self, table: pa.Table):
        return table.to_pandas()

    def from_columns(self, columns: dict):
        """A frame of NumPy and Arrow columns (Arrow ones as pandas' Arrow-backed arrays)."""
        import pandas as pd  # noqa: PLC0415  imported only where pandas frames are built

        cols = {}
        for k, v in columns.items():
            if isinstance(v, pa.ChunkedArray):
                v = v.combine_chunks()
            cols[k] = pd.arrays.ArrowExtensionArray(v) if isinstance(v, pa.Array) else v
        return pd.DataFrame(cols) if cols else pd.DataFrame()

    def to_columns(self, frame) -> dict:
        import pandas as pd  # noqa: PLC0415

        out = {}
        for c in frame.columns:
            col = frame[c]
            if isinstance(col.dtype, pd.ArrowDtype):
                arr = pa.array(col.array)
                out[c] = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
            else:
                out[c] = col.to_numpy()
        return out


def _surrogate_error(col, name, exc: UnicodeEncodeError) -> InputError:
    """The error for a pandas column of Python strings that UTF-8 cannot encode: the first such row, named by its
    position and index label, the character, and how to pass the text on."""
    where = ""
    for pos, value in enumerate(col.array):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as bad:
                where = (f" row {pos} (index {col.index[pos]!r}) holds {bad.object[bad.start:bad.end]!r} at "
                         f"character {bad.start}:")
                break
    return InputError(f"column {name!r}{where} a lone surrogate ({exc.reason}), which is not Unicode text (bytes decoded "
                      "with errors='surrogateescape', e.g. by os.fsdecode); pass the bytes instead, read as UTF-8 with "
                      f"invalid bytes replaced: df[{name!r}] = df[{name!r}].str.encode('utf-8', 'surrogateescape'), "
                      f"or replace the surrogates: .str.encode('utf-8', 'replace').str.decode('utf-8')")


class CudfKind:
    name = "cudf"
    device = True  # its columns are in device memory: a text column may stay there for a device reader

    def matches(self, obj) -> bool:
        return (type(obj).__module__ or "").split(".")[0] == "cudf" and hasattr(obj, "to_arrow")

    def columns(self, frame) -> list:
        return list(frame.columns)

    def to_arrow(self, frame, cols: list) -> pa.Table:
        return frame[cols].to_arrow(preserve_index=False)  # device -> host copy of these columns only

    def take(self, frame, kept: np.ndarray):
        return frame.iloc[np.flatnonzero(kept)]  # gathers on the device

    def from_arrow(self, table: pa.Table):
        import cudf  # noqa: PLC0415  a cuDF frame was given, so cuDF is installed

        return cudf.DataFrame.from_arrow(table)

    def from_columns(self, columns: dict):
        """A cuDF frame of CuPy and Arrow columns (the device arrays are not copied)."""
        import cudf  # noqa: PLC0415  GPU workers only
        import dask_cudf  # noqa: F401,PLC0415  registers cuDF with Dask's dispatch in this process

        return cudf.DataFrame({k: cudf.Series.from_arrow(v) if isinstance(v, (pa.Array, pa.ChunkedArray))
                               else cudf.Series(v) for k, v in columns.items()})

    def to_columns(self, frame) -> dict:
        return {c: (frame[c].to_arrow() if frame[c].dtype == "object" else frame[c].values) for c in frame.columns}


class DatasetsKind:
    """A Hugging Face ``datasets.Dataset``: an Arrow table (memory-mapped when the dataset is on disk), read in
    place.  Its columns are the table's own buffers, not a copy of the text; a dataset with an indices mapping
    (after ``select``, ``shuffle``, ``filter``) gathers those rows of the columns read.  The kept rows come back
    as ``dataset.select(kept rows)``: an indices mapping over the same table, kept in memory (nothing is
    written into the dataset's cache directory)."""

    name = "datasets"
    device = False  # an Arrow table in host memory (or mapped from disk)

    def matches(self, obj) -> bool:
        ds = sys.modules.get("datasets")  # a Dataset exists only where datasets is imported
        cls = getattr(ds, "Dataset", None)  # (a module of that name that is not Hugging Face's has none)
        return isinstance(cls, type) and isinstance(obj, cls)

    def columns(self, frame) -> list:
        return list(frame.column_names)

    def to_arrow(self, frame, cols: list) -> pa.Table:
        return frame.with_format("arrow", columns=cols)[:]

    def take(self, frame, kept: np.ndarray):
        return frame.select(np.flatnonzero(kept), keep_in_memory=True)

    def from_arrow(self, table: pa.Table):
        import datasets  # noqa: PLC0415  a Dataset was given, so datasets is installed

        return datasets.Dataset(table)


KINDS = {k.name: k for k in (ArrowKind(), PandasKind(), CudfKind(), DatasetsKind())}

# what other objects of the datasets library are, and what to give instead
_DATASETS_HINTS = {
    "DatasetDict": "a DatasetDict holds splits: deduplicate one, e.g. {call}(ds['train']), or concatenate them "
                   "first (datasets.concatenate_datasets)",
    "IterableDatasetDict": "a streaming DatasetDict has no Arrow table to read in place: load it without "
                           "streaming=True and pass one split, e.g. {call}(ds['train'])",
    "IterableDataset": "a streaming dataset has no Arrow table to read in place: load it without streaming=True, "
                       "or run gpu-dedup run on its files (hf://datasets/... paths are read as shards)",
}


def kind_of(frame, call: str = "dedup"):
    """The registered kind of a user's frame; one clear error for anything else, naming ``call``, the function
    the user called (``dedup``, ``Index.add``)."""
    for kind in KINDS.values():
        if kind.matches(frame):
            return kind
    name = type(frame).__name__
    if (type(frame).__module__ or "").split(".")[0] == "datasets" and name in _DATASETS_HINTS:
        raise InputError(f"{call}() got a datasets.{name}; {_DATASETS_HINTS[name].format(call=call)}")
    raise InputError(
        f"{call}() takes a pandas DataFrame, a pyarrow Table, a cuDF DataFrame or a Hugging Face datasets.Dataset, "
        f"not {type(frame).__module__}.{name}; convert it first (e.g. .to_pandas() or pyarrow.table(...))")


def for_columns(columns: dict):
    """The kind to build a frame of these columns in: cuDF when any array lives on the device, else pandas."""
    device = any(on_device(v) for v in columns.values() if not isinstance(v, (pa.Array, pa.ChunkedArray)))
    return KINDS["cudf" if device else "pandas"]


def columns_of(frame) -> dict:
    """A pandas or cuDF frame's columns as arrays (NumPy / CuPy; Arrow for Arrow-backed columns)."""
    return KINDS["cudf" if CudfKind().matches(frame) else "pandas"].to_columns(frame)
