"""A persisted index for incremental dedup and online queries (see :mod:`gpu_dedup.index.store`)."""

from gpu_dedup.index.store import (
    AddResult,
    Index,
    IndexBuilder,
    IndexMismatchError,
    index_fingerprint,
)

__all__ = ["Index", "IndexBuilder", "IndexMismatchError", "AddResult", "index_fingerprint"]
