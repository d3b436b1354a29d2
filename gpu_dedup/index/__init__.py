"""A persisted index for incremental dedup and online queries.

``format`` is the on-disk layout (manifest, segments, fingerprints), ``store``
opens, reads and appends to an index (:class:`Index`, :class:`IndexBuilder`),
``query`` answers online queries, ``add`` deduplicates a DataFrame against an
index and appends it.  A run builds, uses or appends to an index through the
options of :func:`gpu_dedup.run.entry.run_dedup`.
"""

from gpu_dedup.index.add import AddResult
from gpu_dedup.index.format import IndexMismatchError, index_fingerprint
from gpu_dedup.index.store import Index, IndexBuilder

__all__ = ["Index", "IndexBuilder", "IndexMismatchError", "AddResult", "index_fingerprint"]
