"""Footer reads of Parquet files, counted: what the footer cache (gpu_dedup/storage/parquet.py) saves."""

import collections
import os

import pyarrow.parquet as pq
import pyarrow.parquet.core as pq_core

from gpu_dedup.storage import parquet


class FooterReads:
    """Footer reads of the Parquet files under ``root`` (a directory, or a URL prefix of objects): every
    ``pq.ParquetFile`` made without ``metadata`` (pyarrow reads the footer then), and every
    ``pq.read_schema`` / ``pq.read_metadata``, by file path (an object's: bucket/key)."""

    def __init__(self, monkeypatch, root):
        root = str(root)
        self.remote = "://" in root
        self.root = root.split("://", 1)[1].rstrip("/") if self.remote else os.path.realpath(root)
        self.by_path = collections.Counter()
        reads = self

        class Counting(pq.ParquetFile):
            def __init__(self, source, *args, metadata=None, **kwargs):
                if metadata is None:
                    reads._count(source)
                super().__init__(source, *args, metadata=metadata, **kwargs)

        def counted(fn):
            def wrapper(where, *args, **kwargs):
                reads._count(where)
                return fn(where, *args, **kwargs)
            return wrapper

        for module in (pq, pq_core):  # pq.read_schema and pq.read_metadata build pq_core.ParquetFile
            monkeypatch.setattr(module, "ParquetFile", Counting)
            monkeypatch.setattr(module, "read_schema", counted(pq_core.read_schema))
            monkeypatch.setattr(module, "read_metadata", counted(pq_core.read_metadata))

    def _count(self, source):
        if self.remote:  # an fsspec file of the object
            path = getattr(source, "path", None)
            if isinstance(path, str) and path.startswith(self.root + "/"):
                self.by_path[path] += 1
            return
        path = source if isinstance(source, (str, os.PathLike)) else getattr(source, "name", None)
        if isinstance(path, (str, os.PathLike)) and os.path.realpath(path).startswith(self.root + os.sep):
            self.by_path[os.path.realpath(path)] += 1

    @property
    def total(self) -> int:
        return sum(self.by_path.values())


def fresh_footers(monkeypatch) -> parquet.FooterCache:
    """A new, empty footer cache for this test (the process's is shared by every test)."""
    cache = parquet.FooterCache()
    monkeypatch.setattr(parquet, "FOOTERS", cache)
    return cache
