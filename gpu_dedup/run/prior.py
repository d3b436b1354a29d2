"""The documents a run is deduplicated against (an index), behind one object.

A plain run has no prior: :class:`NoPrior` answers every question with
"nothing" and the stage sequence reads as the algorithm of the seeds.  A run
against an index (``--against``) gets an :class:`IndexPrior`: its documents
take part in matching and always survive, exactly as in a full dedup of the
index's documents and the new ones together.

**Nodes are doc numbers.**  The index's documents keep their numbers
``0 .. first_doc - 1``; this run's input row ``r`` is document ``first_doc + r``.
Every node of the run (bucket members, edge ends, labels, survivors) is such a
number, so indexed documents order before every new one and nothing is
renumbered.  An indexed document stands for its index cluster through its
*home*, the cluster's survivor: edges to it join the home's component, and
survivors are chosen among the kept indexed documents (homes) first, then among
this run's rows by the keep policy; an indexed document the index holds as
removed comes last, so it never survives a cluster with a new document in it.
When chains are split, an indexed document and its home are joined as they
were in the index (an edge between them), so an index cluster ejected together
re-forms together, around its home.

The object is what Dask workers receive: it pickles as the index's path and
reopens the index on the worker (memory-mapped, once per process).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup.backends.arrow_arrays import empty_array
from gpu_dedup.stages.vectors import Vectors

REMOVED_RANK = 1 << 50  # above every row's rank: an indexed document the index holds as removed
_OPEN: dict = {}  # (path, documents) -> opened index, per process (a Dask worker reopens once)


class NoPrior:
    """A run without an index: no indexed document takes part; every query is of no documents (a doc number
    below ``first_doc`` = 0 does not exist, and asking for one is a bug)."""

    active = False
    first_doc = 0
    path: str | None = None
    min_bucket_size = 2  # a bucket of one document has no pair

    def is_index(self, sink: object) -> bool:
        return False

    def exact_matches(self, keys: Any) -> np.ndarray:
        return np.full(np.asarray(keys).shape[0], -1, np.int64)

    def bucket_centres(self, band: Any, hashes: Any) -> tuple:
        z = np.zeros(0, np.int64)
        return z, z, z

    def home(self, docs: Any) -> np.ndarray:
        return _none(docs)

    def ranks(self, docs: Any) -> np.ndarray:
        return _none(docs)

    def ids(self, docs: Any) -> pa.Array:
        _none(docs)
        return empty_array(pa.int64())

    def texts(self, docs: Any) -> pa.Array:
        _none(docs)
        return empty_array(pa.large_string())

    def signatures(self, docs: Any) -> np.ndarray:
        _none(docs)
        return np.zeros((0, 0), np.uint64)

    def vectors(self, docs: Any) -> Vectors:
        _none(docs)
        return Vectors(np.zeros((0, 0), np.float32), np.zeros(0, np.int8))

    def vector_dim(self) -> int | None:
        """The dimension the indexed vectors fix for the run's: none without an index."""
        return None


def _none(docs: Any) -> np.ndarray:
    """``docs`` as doc numbers of a run without a prior: there are none."""
    docs = np.asarray(docs, np.int64)
    if docs.shape[0]:  # pragma: no cover - a node below first_doc = 0 never exists
        raise IndexError(f"a run without an index has no indexed documents, but {docs.shape[0]} were asked for")
    return docs


class IndexPrior:
    """An opened :class:`gpu_dedup.index.Index` as the run's prior (see the module docstring)."""

    active = True
    min_bucket_size = 1  # a lone new document still meets the index's documents of its bucket

    def __init__(self, index: Any):
        self._index = index
        self._open = type(index).open  # pickled by reference: how a worker reopens the index
        self.path = str(index.path)
        self.first_doc = int(index.documents)
        self.segments = len(index.manifest["segments"])  # a prefix of the index (Index.before) reopens as one

    def __getstate__(self) -> dict:
        return {"path": self.path, "first_doc": self.first_doc, "open": self._open, "segments": self.segments}

    def __setstate__(self, state: dict) -> None:
        self.path, self.first_doc, self._open = state["path"], state["first_doc"], state["open"]
        self.segments = state["segments"]
        self._index = None

    @property
    def index(self) -> Any:
        if self._index is None:  # on a worker: the same index, opened once per process
            key = (self.path, self.first_doc)
            if key not in _OPEN:
                index = self._open(self.path)
                names = index.manifest["segments"]
                if len(names) > self.segments:  # the index as it was before a later append (a rerun's prior)
                    index = index.before(names[self.segments])
                _OPEN[key] = index
            self._index = _OPEN[key]
        return self._index

    def is_index(self, sink: object) -> bool:
        """Whether ``sink`` is this very index (a run that updates the index it is deduplicated against)."""
        return sink is not None and sink is self._index

    def exact_matches(self, keys: Any) -> np.ndarray:
        """Indexed document with each exact key (host (n, 3) uint64), or -1."""
        return self.index.exact_matches(np.asarray(keys))

    def bucket_centres(self, band: Any, hashes: Any) -> tuple:
        """The index's centre sequence of each (band, hash) bucket: (bucket position, round, doc)."""
        return self.index.bucket_centres(np.asarray(band), np.asarray(hashes))

    def home(self, docs: Any) -> np.ndarray:
        """The survivor of each indexed document's index cluster (doc numbers)."""
        docs = np.asarray(docs, np.int64)
        if docs.shape[0] == 0:
            return docs
        return np.asarray(self.index.survivors(docs), np.int64)

    def ranks(self, docs: Any) -> np.ndarray:
        """Ranks of indexed documents: the kept ones (homes) before this run's rows (which rank from 0), the
        removed ones after every row, each group in doc order.  A removed indexed document is gone from the
        published outputs, so it never survives a cluster holding a document of this run: a new document
        removed against it would be removed against nothing that is kept."""
        docs = np.asarray(docs, np.int64)
        f = self.first_doc
        return np.where(self.home(docs) == docs, docs - f, REMOVED_RANK + docs).astype(np.int64)

    def ids(self, docs: Any) -> pa.Array:
        return self.index.ids(np.asarray(docs, np.int64))

    def texts(self, docs: Any) -> pa.Array:
        return self.index.texts(np.asarray(docs, np.int64))

    def signatures(self, docs: Any) -> np.ndarray:
        return self.index.signatures(np.asarray(docs, np.int64))

    def vectors(self, docs: Any) -> Vectors:
        return self.index.vectors(np.asarray(docs, np.int64))

    def vector_dim(self) -> int | None:
        """The indexed vectors' dimension (None: an index of texts, or of no documents yet): the run's vectors
        must have it, whatever the length of the run's first vector."""
        if self.index.similarity != "cosine" or self.index.manifest["config"].get("source") != "vectors":
            return None
        return self.index._vector_dim()
