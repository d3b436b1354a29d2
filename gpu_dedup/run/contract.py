"""The executor contract: everything the stage sequence may ask of an executor, in one place.

The sequence (:mod:`gpu_dedup.run.sequence`) is the dedup algorithm of the
seeds, map -> shuffle -> reduce, written once.  Its per-document state never
lives in the sequence: it lives in **parts**, a list of per-partition objects
that the executor keeps where it computes,

- one process (:class:`gpu_dedup.run.local.LocalExecutor`): one part, the whole
  corpus, its arrays in host memory (NumPy) or device memory (CuPy);
- Dask / Dask-CUDA (:class:`gpu_dedup.run.cluster.DaskExecutor`): one part per
  block or shuffle partition, a future on a worker; the client holds the list
  of futures and a few numbers per block, never a value per document.

A part is usually a **frame**: a dict of equal-length 1-D arrays (columns) of the
executor's array module.  Parts of other objects (a block's signatures, the
star rounds of one partition of buckets) are opaque to the executor: it only
hands them to functions.  Functions the sequence passes (``fn``) are plain
module-level functions of :mod:`gpu_dedup.stages` or the sequence module, so a
Dask worker can run them; they see one part at a time.

What an executor decides is only where parts live and how rows move between
them (:meth:`Executor.route`); what it adds of its own are the operations whose
best implementation depends on where the data is: reading and writing shards,
scoring pairs (the texts must meet), ranking by the keep policy (a sort),
connected components (union-find in one process, large-star/small-star over
shuffles on a cluster) and checkpoints.  It holds no dedup logic: every
decision (exact groups, buckets, star edges, survivors, chain splitting, the
duplicates table) is a function of :mod:`gpu_dedup.stages` that the sequence
maps over parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from gpu_dedup.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from gpu_dedup.run.stagelog import StageLog
    from gpu_dedup.stages.families import Family

Parts = list  # one object per partition, kept where the executor computes (a future on a Dask worker)
Frame = dict  # column name -> 1-D array (NumPy or CuPy), equal lengths


class Corpus(Protocol):
    """What the sequence sees of the corpus after :meth:`Executor.read`: counts, never documents."""

    shards: list  # the input shards with their row counts
    n: int  # documents read
    null_count: int  # documents without text (or vector)
    duplicate_ids: int  # rows whose id another row also has
    id_column: str | None  # None: ids are generated (the row numbers)

    @property
    def id_generated(self) -> bool: ...


class Executor(Protocol):
    """The operations the stage sequence asks for; see the module docstring."""

    backend: Any  # the kernels of the partition functions (:mod:`gpu_dedup.backends`)
    family: Family  # the similarity family, sized for this run by :meth:`read`
    partitions: int  # partitions of a routed table (1 in one process)
    blocks_count: int  # blocks of the corpus (1 in one process)

    # ---- set-up and teardown
    def prepare(self, st: StageLog) -> None:
        """Start (a cluster) and load or compile the kernels the config uses."""

    def close(self) -> None: ...

    def report_extras(self) -> dict:
        """This executor's section of report.json (kernel load time, GPU transfers, workers, shuffle bytes)."""

    # ---- the corpus: texts and vectors stay in their blocks
    def read(self, progress: Callable | None = None) -> Corpus:
        """Read every shard into blocks; per-block frames ``row`` (global row), ``null``."""

    def normalize(self) -> dict:
        """Normalize the texts where they live; its counts (``invalid_utf8``)."""

    def docs(self) -> Parts:
        """Per block: the frame ``row``, ``null`` that :meth:`read` made."""

    def exact_keys(self) -> Parts:
        """Per block: frames ``k0``, ``k1``, ``k2`` (uint64) of the family's exact keys, in row order."""

    def ranks(self) -> Parts:
        """Per block: frames ``rank`` (int64), every row's place in the keep policy's order (0 = best;
        ties go to the lower row), a permutation of the corpus' rows."""

    def signatures(self, rows: Parts, progress: Callable | None = None) -> Parts:
        """Per block: the family's signatures of the rows in frame ``row`` of each part (global rows,
        ascending), as parts :func:`gpu_dedup.stages.bands.signature_part` and :meth:`band_hashes` read."""

    def band_hashes(self, sigs: Parts) -> Parts:
        """Per block: frame ``lsh_row`` (rows with a signature) and ``band_hashes`` (rows x bands, uint64),
        with ``signatures`` where verification or an index reads them."""

    # ---- moving rows
    def map(self, fn: Callable, *parts: Parts, outputs: int = 1, **kw) -> Parts | tuple:
        """``fn(*objects, **kw)`` on each partition (aligned ``parts``); ``outputs`` > 1: ``fn`` returns a tuple
        and so does this."""

    def route(self, parts: Parts, dest: Callable, n: int, explode: Callable | None = None, **kw) -> Parts:
        """Rows to partitions: ``dest(frame, n, **kw)`` gives each row's partition in [0, n); the result has
        ``n`` parts, each holding its rows in their original order within each source part, sources in
        order.  ``explode(obj)`` turns a part that is not a frame into one (only where rows move)."""

    def total(self, fn: Callable, parts: Parts, **kw) -> dict:
        """``fn(object, **kw)`` -> dict of numbers for each partition, summed (on the client)."""

    def collect(self, fn: Callable, parts: Parts, **kw) -> list:
        """``fn(object, **kw)`` for each partition, brought to the client: small results only."""

    def score(self, pairs: Parts) -> Parts:
        """Similarity (the family's, by ``verify.method``) of the node pairs ``src``, ``dst`` of each frame,
        aligned with it (frame ``sim``).  Nodes are doc numbers: a prior's documents (below its
        ``first_doc``) and this run's rows (``first_doc + row``)."""

    def components(self, edges: Parts) -> Parts:
        """Connected components of the edges ``src``, ``dst``: frames ``node``, ``label`` (the smallest node
        of its component) for every node of an edge, routed by :func:`gpu_dedup.stages.components.node_part`."""

    # ---- checkpoints (a stage's parts saved where they live)
    def save(self, unit: str, parts: Parts, meta: dict) -> None: ...

    def load(self, unit: str) -> tuple[Parts, dict] | None:
        """The parts and metadata of a finished ``unit``, or None (never saved, or unreadable)."""

    # ---- outputs
    def ids(self, parts: Parts, column: str = "row") -> Parts:
        """Per part: frame ``id`` (an Arrow array) of the input rows in ``column`` (global rows, any block)."""

    def write_shards(self, removed: Parts, out, ckpt, progress: Callable | None = None) -> int:
        """Write every shard's kept rows (``removed``: per block, frame ``row`` of the removed rows); rows
        written."""

    def write_table(self, parts: Parts, path) -> int:
        """The Arrow tables of ``parts`` (in order) as one Parquet file at ``path``; its rows."""

    def take(self, rows: np.ndarray, column: str):
        """A few rows' original ``text`` or ``id`` (host Arrow array, in the order of ``rows``)."""


# ---------------------------------------------------------------------------- shared policy


def shard_starts(shards) -> np.ndarray:
    """Global row of each shard's first row, and the total: ``starts[i]:starts[i+1]`` are shard ``i``'s rows."""
    return np.cumsum([0] + [s.rows for s in shards]).astype(np.int64)


def rank_key_column(keep: str, score_column: str | None = None) -> str | None:
    """The corpus column the keep policy ranks by (None: input order)."""
    return {"first": None, "longest": "text", "lowest_id": "id", "score": "score"}[keep] if keep != "score" \
        else "score"


def one_process_only(what: str) -> ConfigError:
    """The error for something that runs in one process only."""
    return ConfigError(f"{what} runs in one process; drop cluster.workers / cluster.scheduler (--workers / "
                       "--scheduler)")
