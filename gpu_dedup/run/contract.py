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

from typing import TYPE_CHECKING, Any, Callable, Literal, Protocol, overload

import numpy as np
import pyarrow as pa

from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array
from gpu_dedup.errors import ConfigError
from gpu_dedup.pending import Ready as Ready, Soon as Soon  # their old home: still importable from here

if TYPE_CHECKING:  # pragma: no cover - annotations only
    from gpu_dedup.run.stagelog import StageLog
    from gpu_dedup.stages.families import Family

Parts = list  # one object per partition, kept where the executor computes (a future on a Dask worker)
Frame = dict  # column name -> 1-D array (NumPy or CuPy), equal lengths


class Corpus(Protocol):
    """What the sequence sees of the corpus after :meth:`Executor.read`: counts, never documents."""

    @property
    def shards(self) -> list:
        """The input shards with their row counts."""

    @property
    def n(self) -> int:
        """Documents read."""

    @property
    def null_count(self) -> int:
        """Documents without text (or vector)."""

    @property
    def duplicate_ids(self) -> int:
        """Rows whose id another row also has."""

    @property
    def id_column(self) -> str | None:
        """The id column (None: ids are generated, the row numbers)."""

    @property
    def id_generated(self) -> bool: ...


class Prior(Protocol):
    """The documents a run is deduplicated against (:mod:`gpu_dedup.run.prior`): none
    (:class:`~gpu_dedup.run.prior.NoPrior`) or an index's (:class:`~gpu_dedup.run.prior.IndexPrior`).  Its
    documents are the doc numbers ``0 .. first_doc - 1``; each query takes doc numbers (or keys) of them, and
    a prior without documents answers every query of no documents with nothing.  Stage functions receive it
    (a Dask worker gets it pickled)."""

    @property
    def active(self) -> bool:
        """It has documents (an index): stage functions skip the index's work without one."""

    @property
    def first_doc(self) -> int:
        """Its documents' count: this run's row ``r`` is doc number ``first_doc + r``."""

    @property
    def path(self) -> str | None:
        """Where the index is (None: no index)."""

    @property
    def min_bucket_size(self) -> int:
        """A bucket of this run's band hashes takes part from this many members on."""

    def is_index(self, sink: object) -> bool:
        """Whether ``sink`` is this very index (a run that updates the index it is deduplicated against)."""

    def exact_matches(self, keys: np.ndarray) -> np.ndarray:
        """The indexed document with each exact key ((n, 3) uint64), or -1."""

    def bucket_centres(self, band: np.ndarray, hashes: np.ndarray) -> tuple:
        """Its centre sequence of each (band, hash) bucket: (bucket position, round, doc)."""

    def home(self, docs: np.ndarray) -> np.ndarray:
        """The survivor of each indexed document's index cluster."""

    def ranks(self, docs: np.ndarray) -> np.ndarray:
        """Ranks of indexed documents, all before this run's rows (which rank from 0)."""

    def ids(self, docs: np.ndarray) -> pa.Array:
        """The ids of indexed documents."""

    def texts(self, docs: np.ndarray) -> pa.Array:
        """The normalized texts of indexed documents."""

    def signatures(self, docs: np.ndarray) -> np.ndarray:
        """The signatures of indexed documents (rows x width)."""

    def vectors(self, docs: np.ndarray) -> Any:
        """The vectors of indexed documents (:class:`gpu_dedup.stages.vectors.Vectors`)."""


class Sink(Protocol):
    """What receives every document of a run (:meth:`Executor.append_index`): an index being built
    (:class:`gpu_dedup.index.store.IndexBuilder`) or updated (:class:`gpu_dedup.index.store.Index`)."""

    @property
    def path(self) -> object:
        """Where the index is (a path or a URL)."""

    @property
    def documents(self) -> int:
        """Its documents so far (after the append: this run's included)."""

    @property
    def id_type(self) -> pa.DataType | None:
        """The Arrow type of its ids (None: a new index, whose first append names it)."""

    def append(self, *, ids: Any, kept: Any, survivor: Any, keys: Any, texts: Any, band_docs: Any,
               band_hashes: Any, centres: Any, signatures: Any = None, vectors: Any = None,
               layout: Any = None) -> int:
        """One process's documents as one segment (see :meth:`gpu_dedup.index.store.Index.append`); the
        first doc number of the segment."""

    def append_segments(self, counts: list, write: Callable, layout: tuple | None = None) -> int:
        """A cluster's blocks as one segment each, written by ``write(plan, writer)`` on the workers and
        published with one manifest write; the first doc number."""

    # an append in two steps: the segments before the run's outputs are published, the manifest after
    def hold(self) -> None:
        """The next append writes its segments but not the manifest that adds them to the index."""

    def publish_staged(self) -> None:
        """The held append's manifest: its segments become part of the index."""

    def discard_staged(self) -> None:
        """Drop the held append's segments (the run publishes nothing)."""


class Step:
    """A function a route runs in its own work: ``before`` on each source part, ahead of cutting it; ``after``
    on each destination's rows, once gathered.  The part's call is ``fn(part, *(o[k] for o in others),
    **kw)`` (``others``: parts aligned with the route's sources for ``before``, its destinations for
    ``after``; ``index``: also ``part_index=k``), the same as mapping ``fn`` over the parts before or after
    the route, without a task per part in between on a cluster."""

    def __init__(self, fn: Callable, *others: Parts | list | None, index: bool = False, **kw: Any):
        self.fn, self.others, self.index, self.kw = fn, others, index, kw

    def at(self, k: int) -> tuple:
        """(fn, args, kw) of part ``k``: what its call is made of."""
        args = tuple(o[k] if o is not None else None for o in self.others)
        return self.fn, args, ({**self.kw, "part_index": k} if self.index else self.kw)

    def __call__(self, part: Any, k: int) -> Any:
        fn, args, kw = self.at(k)
        return fn(part, *args, **kw)


class Executor(Protocol):
    """Everything the stage sequence asks of an executor (and nothing more); see the module docstring.

    Parts are lists (one object per partition).  Block-aligned parts have one object per corpus block,
    holding its rows in row order; routed parts have :attr:`partitions` objects.
    """

    @property
    def backend(self) -> Any:
        """What the report says of the kernels (``mode``)."""

    @property
    def part_backend(self) -> Any:
        """The backend the partition functions run on (an object, or a name a worker resolves)."""

    @property
    def family(self) -> Family:
        """The similarity family, sized for this run by :meth:`read`."""

    @property
    def shards(self) -> list:
        """The input shards."""

    @property
    def partitions(self) -> int:
        """Partitions of a routed table (1 in one process)."""

    @property
    def blocks_count(self) -> int:
        """Blocks of the corpus (1 in one process)."""

    @property
    def workers(self) -> int:
        """Processes the blocks are spread over (1 in one process; after :meth:`read`)."""

    @property
    def block_starts(self) -> np.ndarray:
        """Global row of each block's first row, and the row count (after :meth:`read`)."""

    @property
    def holds_corpus(self) -> bool:
        """Every per-row array is in this process (the RunResult then carries them)."""

    # ---- set-up and teardown
    def prepare(self, st: StageLog) -> None:
        """Start (or join) the executor's workers and load or compile the kernels the config uses (or start
        loading them beside the read stage: :meth:`kernels_loaded` then waits for them)."""

    def kernels_loaded(self) -> None:
        """After the read stage: the kernels :meth:`prepare` started loading beside it are loaded (their error,
        if any, raised here); at once where it loaded them itself."""

    def close(self) -> None: ...

    def report_extras(self) -> dict:
        """This executor's section of report.json (kernel load time, GPU transfers, workers, shuffle volume)."""

    # ---- the corpus: texts and vectors stay in their blocks
    def read(self, progress: Callable | None = None) -> Corpus:
        """Read every shard into blocks; count rows, null rows and repeated ids."""

    def normalize(self) -> dict:
        """Normalize the texts where they live; its counts (``invalid_utf8``)."""

    def docs(self) -> Parts:
        """Block-aligned frames ``row`` (global row), ``null``."""

    def exact_keys(self) -> Parts:
        """Block-aligned frames ``k0``, ``k1``, ``k2`` (uint64): the family's exact keys."""

    def ranks(self) -> Parts:
        """Block-aligned frames ``rank``: every row's place in the keep policy's order (0 = best, ties to the
        lower row), a permutation of the rows (a sort: where the keys are decides how it runs)."""

    def signatures(self, rows: Parts, progress: Callable | None = None) -> Parts:
        """Per block, the family's signatures of the rows in frame ``row`` (ascending): frames ``row``,
        ``values`` (rows x width), ``features``, ``usable``; where the family keeps no signature values, an
        executor may hand over their band hashes instead of ``values`` (made chunk by chunk) for
        :meth:`band_hashes` to pass on."""

    def band_hashes(self, sigs: Parts) -> Parts:
        """Per block: ``lsh_row`` (rows with a signature), ``band_hashes`` (rows x bands, uint64) and, where
        the family keeps them, ``signatures``."""

    def keep_bands(self, bands: Parts) -> None:
        """The band parts that verification by signature reads (fresh or loaded from a checkpoint)."""

    # ---- moving rows
    @overload
    def map(self, fn: Callable, *parts: Parts | None, outputs: Literal[1] = 1, with_index: bool = False,
            **kw: Any) -> Parts: ...

    @overload
    def map(self, fn: Callable, *parts: Parts | None, outputs: Literal[2, 3], with_index: bool = False,
            **kw: Any) -> tuple[Parts, ...]: ...

    def map(self, fn: Callable, *parts: Parts | None, outputs: int = 1, with_index: bool = False,
            **kw: Any) -> Parts | tuple[Parts, ...]:
        """``fn(*objects, **kw)`` on each partition of the aligned ``parts`` (None: ``fn`` gets None there);
        ``with_index``: also ``part_index=k``; ``outputs`` > 1: ``fn`` returns that many objects, and so
        does this, each a list of parts."""

    def route(self, parts: Parts, dest: Callable, n: int, explode: Callable | None = None,
              explode_kw: dict | None = None, before: Step | None = None, after: Step | None = None,
              **kw: Any) -> Parts:
        """Rows to ``n`` partitions: ``dest(frame, n, **kw)`` gives each row's partition in [0, n) (see
        :mod:`gpu_dedup.stages.frames`); each destination holds its rows in source-part order, positions in
        order, so a route is deterministic.  ``explode(obj, **explode_kw)`` turns an object that is not a frame
        into one, where rows move.  ``before`` / ``after`` (:class:`Step`): run on each source part before it
        is cut (ahead of ``explode``), and on each destination's rows once gathered."""

    def expect_rows(self, rows: int) -> None:
        """The routes from here on move about ``rows`` rows at most (after the buckets stage: its memberships),
        so an executor may move few rows in fewer round trips (a cluster: ``cluster.small_route_rows``)."""

    def total(self, fn: Callable, *parts: Parts | None, **kw: Any) -> dict:
        """``fn(*objects, **kw)`` -> dict of numbers on each partition, summed where the sequence runs."""

    def collect(self, fn: Callable, parts: Parts, **kw: Any) -> list:
        """``fn(object, **kw)`` of each partition, brought to where the sequence runs: small results only."""

    def score(self, pairs: Parts, progress: Callable | None = None, clock: dict | None = None) -> Parts:
        """Similarity (the family's, by ``verify.method``) of the node pairs ``src``, ``dst`` of each frame,
        aligned with it (frames ``sim``).  Nodes are doc numbers: a prior's documents below its
        ``first_doc``, this run's row ``r`` as ``first_doc + r``; the texts, signatures or vectors are brought
        together where they live.  Similarities are symmetric; an executor may move the ``src`` ends' payloads
        to the ``dst`` ends (once per receiving block), so callers put first the end that many pairs share (a
        star's centre, a cluster's survivor).  ``clock``: a dict that one process gives the seconds of the
        scoring's steps (exact similarity in chunks: ``sets``, ``pairs``, ``chunks``; see
        :func:`gpu_dedup.stages.verify._by_chunks`); a cluster, whose tasks score on its workers, leaves it empty."""

    def components(self, edges: Parts, count: int | None = None) -> Parts:
        """Connected components of the edges ``src``, ``dst``: frames ``node``, ``label`` (the smallest node
        of its component) for every node of an edge, routed by ``hash_dest(node)``.  ``count``: how many
        edges there are, where the caller knows (None: the executor counts them if it needs to)."""

    # ---- checkpoints (a finished stage unit's parts, saved where they live)
    def save(self, ckpt: Any, unit: str, parts: dict, meta: dict) -> dict:
        """Persist a finished unit's parts (by name) and ``meta``; the parts the sequence goes on with (the
        same frames; a cluster hands back futures without the tasks that computed them)."""

    def load(self, ckpt: Any, unit: str) -> tuple[dict, dict]:
        """The parts and metadata :meth:`save` wrote; CheckpointUnreadable when they cannot be read."""

    # ---- outputs
    def soon(self, fn: Callable, *args: Any, **kw: Any) -> Any:
        """``fn(*args, **kw)``, a step of the sequence that asks this executor for a few small results (the
        report's sample documents), started now and taken later with ``.result()`` (its value, or its error
        raised): a cluster runs it in a thread of the client, its tasks beside those of the stages that follow
        on workers that would otherwise wait; one process runs it at once (:class:`Ready`, its error raised
        then)."""

    def ids(self, parts: Parts, column: str = "row") -> Parts:
        """Per part: frame ``id`` (an Arrow array) of the input rows in ``column``, whatever block holds them."""

    def take(self, rows: np.ndarray, column: str) -> pa.Array:
        """A few rows' original ``text`` or ``id`` (a host Arrow array in the order of ``rows``)."""

    def take_soon(self, rows: np.ndarray, column: str) -> Any:
        """:meth:`take`, started now and taken later with ``.result()``: one process reading the texts again from
        the shards (host I/O and decoding, nothing on the device) does it on a thread of its own, beside the
        write stage; otherwise at once (:class:`Ready`)."""

    def release_texts(self) -> None:
        """No later step scores pairs or hands texts to an index: the normalized texts may be freed (the write
        stage then streams the shards without them)."""

    def write_shards(self, removed: Parts, out: Any, ckpt: Any, progress: Callable | None = None) -> int:
        """Every shard's kept rows under its name (``removed``: block-aligned frames ``row`` of the rows it
        removes), each marked in ``ckpt`` once written; the rows written."""

    def write_details(self) -> dict:
        """Where the last :meth:`write_shards` spent its seconds (the write stage's report adds them): named
        parts in seconds, and ``*_thread_seconds`` summed over the threads that did them."""

    def write_table(self, parts: Parts, path: Any) -> int:
        """The Arrow tables of ``parts`` (in order) as one Parquet file at ``path`` (the duplicates table, with
        :func:`~gpu_dedup.stages.write.duplicates_parquet_options`), the same file one process writes; its rows."""

    def append_index(self, sink: Sink, docs: Parts, keys: Parts | None, bands: Parts, centres: Parts, dup: Parts,
                     first_doc: int, layout: tuple[int, int]) -> None:
        """Every document of this run into ``sink`` (an index being built or updated; its documents are
        ``first_doc + row``): one process hands :meth:`gpu_dedup.index.Index.append` the whole corpus as one
        segment; a cluster's workers write one segment per block, which
        :meth:`gpu_dedup.index.Index.append_segments` publishes with one manifest write."""


# ---------------------------------------------------------------------------- shared policy


def shard_starts(shards: list) -> np.ndarray:
    """Global row of each shard's first row, and the total: ``starts[i]:starts[i+1]`` are shard ``i``'s rows."""
    return np.cumsum([0] + [s.rows for s in shards]).astype(np.int64)


def take_in_order(rows: Any, starts: np.ndarray, fetch: Callable, text: bool) -> pa.Array:
    """Values of ``rows`` (global rows, any order; a report's few dozen) from their owners, the ranges
    ``starts[k]:starts[k+1]`` (shards or blocks), in the order of ``rows``.  ``fetch(groups)``, with
    ``groups`` the (owner ``k``, positions in ``rows`` it holds) of each owner holding a row, returns each
    group's values in that order (read by threads, or by tasks on workers).  Texts are cast to one type: large
    strings, or large binary where a shard holds binary."""
    rows = np.asarray(rows, np.int64)
    owner = np.searchsorted(starts[1:], rows, side="right")
    groups = [(int(k), np.flatnonzero(owner == k)) for k in np.unique(owner)]
    parts = fetch(groups) if groups else []
    if not parts:
        return empty_array(pa.large_string() if text else pa.int64())
    if text:
        binary = any(pa.types.is_binary(p.type) or pa.types.is_large_binary(p.type) for p in parts)
        parts = [p.cast(pa.large_binary() if binary else pa.large_string()) for p in parts]
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[np.concatenate([sel for _, sel in groups])] = np.arange(rows.shape[0])
    return pa.concat_arrays(parts).take(arrow_array(inverse))


def one_process_only(what: str, instead: str = "") -> ConfigError:
    """The error for something that runs in one process only (``instead``: what to do for a cluster)."""
    return ConfigError(f"{what} runs in one process; drop cluster.workers / cluster.scheduler (--workers / "
                       f"--scheduler){'; ' + instead if instead else ''}")
