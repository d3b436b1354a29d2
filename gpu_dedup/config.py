"""One frozen dataclass tree for the whole configuration.

YAML keys equal field names; unknown keys are rejected with the list of valid
ones; derived values (the LSH layout, the fingerprint) are properties.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
import numbers
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from gpu_dedup.curves import cosine_layout, cosine_min_rows, optimal_layout, s_curve
from gpu_dedup.errors import ConfigError

SHINGLE_KINDS = ("word", "char")
UNICODE_FORMS = ("NFKC", "NFC", "NFKD", "NFD", "none")
VERIFY_METHODS = ("exact", "signature", "none")
KEEP_POLICIES = ("first", "longest", "lowest_id", "score")
BACKENDS = ("auto", "cpu", "gpu")
FORMATS = ("auto", "parquet", "jsonl", "arrow")
SIMILARITIES = ("jaccard", "cosine")
TEXT_WEIGHTINGS = ("tf", "tfidf")
BAD_VECTOR_POLICIES = ("error", "keep")
COSINE_MAX_BITS = 4096
# bounds checked before anything is allocated (the layout search alone is O(num_perm log num_perm) x 2001 floats)
MAX_NUM_PERM = 1024
MAX_NGRAM = 1024
MAX_STAR_ROUNDS = 64
COSINE_MAX_ROWS = 64  # a band is at most one 64-bit word: its hash is then exact (injective)


def _choice(section: str, name: str, value, choices) -> None:
    if value not in choices:
        key = f"{section}.{name}" if section else name  # top-level keys (backend, similarity) have no section
        raise ConfigError(f"{key} = {value!r} is not valid; choose one of {', '.join(map(str, choices))}")


@dataclass(frozen=True)
class InputConfig:
    text_column: str = "text"
    id_column: str | None = None  # None: no user ids (documents are named by their row number, column row)
    format: str = "auto"  # auto (by file extension) | parquet | jsonl | arrow (Arrow IPC)
    vector_column: str | None = None  # similarity cosine: list<float> / fixed_size_list<float> column of
    # embeddings (float16/32/64); None: vectors are built from the text (see cosine.text)

    def __post_init__(self):
        _check_fields(self)
        _choice("input", "format", self.format, FORMATS)
        if not self.text_column:
            raise ConfigError("input.text_column is empty; name the column that holds the document text")
        if self.id_column is not None and not self.id_column:
            raise ConfigError("input.id_column is empty; name the column that holds the document ids, or leave it "
                              "unset (--no-id-column: documents are named by row)")
        if self.vector_column is not None and not self.vector_column:
            raise ConfigError("input.vector_column is empty; name the embedding column, or null to build "
                              "vectors from the text")


@dataclass(frozen=True)
class NormalizeConfig:
    unicode: str = "NFKC"  # NFKC | NFC | NFKD | NFD | none
    lowercase: bool = True
    punctuation: bool = True  # remove Unicode punctuation (category P)
    whitespace: bool = True  # collapse whitespace runs to one space and trim

    def __post_init__(self):
        _check_fields(self)
        _choice("normalize", "unicode", self.unicode, UNICODE_FORMS)


@dataclass(frozen=True)
class MinHashConfig:
    num_perm: int = 128
    shingle: str = "word"  # word | char (code points, not bytes)
    ngram: int = 5
    seed: int = 42

    def __post_init__(self):
        _check_fields(self)
        if not 1 <= self.num_perm <= MAX_NUM_PERM:
            raise ConfigError(f"minhash.num_perm = {self.num_perm} must be in [1, {MAX_NUM_PERM}] (typical: 64..512)")
        if not 1 <= self.ngram <= MAX_NGRAM:
            raise ConfigError(f"minhash.ngram = {self.ngram} must be in [1, {MAX_NGRAM}] (typical: word 5, char 5..24)")
        _choice("minhash", "shingle", self.shingle, SHINGLE_KINDS)
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"minhash.seed = {self.seed} must be in [0, 2**64)")

    @property
    def hash_bits(self) -> int:
        """Width of the signature values: always 32 (hash family v2, kernels/hash_scalar.py). Not a setting."""
        return 32


# keys that existed once: a config that still sets one gets this explanation instead of "unknown key"
REMOVED_KEYS = {
    "minhash.hash_bits": "signature values are always 32-bit since hash family v2 (kernels/hash_scalar.py); "
                         "delete the key from the config",
}


@dataclass(frozen=True)
class LSHConfig:
    """Banding and the near-duplicate threshold.

    ``threshold`` is the Jaccard similarity that counts as a near duplicate,
    or, when ``similarity: cosine``, the cosine similarity (then the layout
    is ``cosine.bands`` x ``cosine.rows``, derived by
    :func:`gpu_dedup.curves.cosine_layout`; ``bands``/``rows`` here are the
    MinHash layout only).
    """

    threshold: float = 0.8  # Jaccard similarity (cosine similarity under similarity: cosine) of a near-duplicate
    bands: int | None = None  # both None: derived from threshold and num_perm;
    rows: int | None = None  # one given: the other is num_perm divided by it
    star_rounds: int = 3  # buckets -> edges: a star around the smallest member; members it rejects are
    # re-starred around their own smallest member, up to this many rounds (1: plain star)
    fp_weight: float = 0.05  # weights of the false-positive / false-negative areas
    fn_weight: float = 0.95  # under the S-curve when (bands, rows) are derived (recall first:
    # exact verification removes false candidates, nothing recovers a missed one)

    def __post_init__(self):
        _check_fields(self)
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"lsh.threshold = {self.threshold} must be in (0, 1]; e.g. 0.8")
        if not 1 <= self.star_rounds <= MAX_STAR_ROUNDS:
            raise ConfigError(f"lsh.star_rounds = {self.star_rounds} must be in [1, {MAX_STAR_ROUNDS}] "
                              "(1: plain star edges; typical 3)")
        for name in ("bands", "rows"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= MAX_NUM_PERM:
                raise ConfigError(f"lsh.{name} = {value} must be in [1, {MAX_NUM_PERM}] (and bands * rows <= "
                                  "minhash.num_perm)")
        for name in ("fp_weight", "fn_weight"):  # NaN and infinity made every area NaN: the layout was 1 x 1
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ConfigError(f"lsh.{name} = {value} must be a finite number >= 0 (weights of the false-positive "
                                  "and false-negative areas under the S-curve; defaults 0.05 and 0.95)")
        if self.fp_weight + self.fn_weight <= 0:
            raise ConfigError(
                f"lsh.fp_weight = {self.fp_weight}, lsh.fn_weight = {self.fn_weight}: "
                "weights must be >= 0 and not both 0"
            )


@dataclass(frozen=True)
class VerifyConfig:
    """``method``: ``exact`` (Jaccard of shingle sets; under cosine: the exact
    cosine of the vectors), ``signature`` (the fraction of equal MinHash
    values; under cosine: the Hamming estimate ``cos(pi * (1 - matching_bits / D))``)
    or ``none``."""

    method: str = "exact"  # exact Jaccard of shingle sets | signature estimate | none
    threshold: float | None = None  # None: lsh.threshold

    def __post_init__(self):
        _check_fields(self)
        _choice("verify", "method", self.method, VERIFY_METHODS)
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"verify.threshold = {self.threshold} must be in (0, 1] or null")


@dataclass(frozen=True)
class SelectConfig:
    keep: str = "first"  # first (input order) | longest | lowest_id | score (highest wins)
    score_column: str | None = None
    split_chains: bool = True  # a member below the verify threshold to its survivor leaves the cluster;
    # ejected members re-form clusters among themselves, so every removed document is at or above the
    # threshold to the document kept in its place.  false: plain connected components (chains remove
    # documents down to well below the threshold; what FineWeb and NeMo Curator do)

    def __post_init__(self):
        _check_fields(self)
        _choice("select", "keep", self.keep, KEEP_POLICIES)
        if self.keep == "score" and not self.score_column:
            raise ConfigError("select.keep = 'score' needs select.score_column (the column to maximise)")

    @property
    def score_read(self) -> str | None:
        """The score column a run reads: ``score_column`` under keep = score, else none."""
        return self.score_column if self.keep == "score" else None


@dataclass(frozen=True)
class OutputConfig:
    compression: str = "same"  # Parquet codec of the deduplicated shards: same (each input shard's) or a codec
    duplicates_table: bool = True
    shards: bool = True  # False: no deduplicated shards, only duplicates.parquet (the removed rows) and the report
    # the Parquet shards' columns kept in memory from the read stage to the write stage, which then neither reads
    # nor decompresses them again (one process): true, false, or auto (when their uncompressed size is at most
    # HOLD_SHARE of the memory available when the run starts). Outputs are the same bytes either way.
    hold_inputs: bool | str = "auto"

    def __post_init__(self):
        _check_fields(self)
        _choice("output", "compression", self.compression, ("same", "zstd", "snappy", "gzip", "lz4", "brotli", "none"))
        if self.hold_inputs not in (True, False, "auto"):
            raise ConfigError(f"output.hold_inputs = {self.hold_inputs!r} must be true, false or auto")
        if not self.shards and not self.duplicates_table:
            raise ConfigError("output.shards and output.duplicates_table are both false: the run would write no "
                              "result; keep one of them true")


# what 0 means for the cluster's integer thresholds (their errors say it)
ZERO_MEANS = {"components_gathered_edges": "0: always the distributed large-star / small-star rounds",
              "small_route_rows": "0: a route's pieces always taken out of their cuts by a task first"}

SHUFFLES = (None, "p2p", "tasks", "device")  # cluster.shuffle
MIN_WORKER_MEMORY = 512 * 2**20  # cluster.memory_limit: an idle worker with gpu_dedup loaded uses ~160 MiB


@dataclass(frozen=True)
class ClusterConfig:
    workers: int | None = None  # None: one process; N: a local Dask cluster of N workers (N GPUs on gpu)
    scheduler: str | None = None  # address of a running Dask scheduler to join instead
    memory_limit: str = "auto"  # per local worker, Dask syntax: "2GiB"
    block_rows: int = 250_000  # rows per partition (Parquet row groups, and small shards, are grouped up to this)
    shuffle: str | None = None  # how rows move between workers: null (small: as futures; large: Dask's p2p
    # shuffle), or always one of Dask's: p2p, tasks; device: the band hashes and the edges as cuDF frames through
    # Dask's p2p shuffle on GPU workers (kept on the device from the bands stage; pandas frames on CPU workers),
    # every other route as with null (experimental: measured against the host routes, docs/scale.md)
    # connected components: up to this many verified edges, one worker runs union-find over all of them;
    # above, large-star / small-star rounds over shuffles (no worker ever holds every edge)
    components_gathered_edges: int = 2_000_000
    # after the buckets stage, when its memberships are at most this many: every worker that gathers a route's
    # rows takes each source's whole cut (all its pieces), one scheduler round trip less a route for (workers)
    # times the bytes; 0: never (each piece taken out of its cut by a task first)
    small_route_rows: int = 1_000_000
    # CPU workers: where each block's normalized texts are kept. true: in a file of the worker's local
    # directory, mapped into memory only while a task reads them (the OS keeps them in its page cache while it
    # has room); false: in worker memory; auto: in memory until this run's texts would take more than
    # SPILL_SHARE of the worker's memory limit, in files past it.  GPU workers: true: in host memory (each kernel
    # task copies them to the device); auto: on the device until this run's texts would take more than
    # DEVICE_TEXT_SHARE of the worker's cluster.device_memory_limit, in host memory past it; false: on the device,
    # and a run whose texts do not fit there stops with an error naming the setting.  One process on the CPU: true:
    # in a file of the output directory, mapped (the OS writes its pages out and drops them when memory runs
    # short); false: in memory; auto: in memory unless the texts are more than TEXT_SHARE of the memory
    # available when the run starts
    spill_texts: bool | str = "auto"
    # backend gpu, local cluster: Dask-CUDA workers that share each GPU (cluster.workers of them in all, a
    # multiple of this), each with its share of the device's memory
    workers_per_gpu: int = 1
    # GPU workers: the device memory a worker may fill before Dask-CUDA spills its device objects to host memory
    # (a size per worker, e.g. 20GiB; auto: 80 % of its share of the GPU), and what bounds its normalized texts
    # on the device (DEVICE_TEXT_SHARE of it; cluster.spill_texts says what happens past that)
    device_memory_limit: str = "auto"
    # GPU workers a run starts: RMM's asynchronous allocator (cudaMallocAsync: one pool the driver shares among
    # the workers of a GPU) instead of a pool of each worker's share
    rmm_async: bool = False
    # a cluster of one worker: auto runs the whole run as one task on that worker (the one-process sequence
    # there: no routes, no scheduler round trips between stages) when nothing asks for the cluster's own way
    # (cluster.shuffle, an index) and the corpus fits the worker's memory limit; false: block by block, as on
    # several workers
    whole_on_one_worker: bool | str = "auto"

    def __post_init__(self):
        _check_fields(self)
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"cluster.workers = {self.workers} must be >= 1 (or null for one process)")
        if self.workers is not None and self.scheduler:
            raise ConfigError(f"cluster.workers = {self.workers} starts a local cluster and cluster.scheduler = "
                              f"{self.scheduler!r} joins a running one; give one of them (--workers N or "
                              "--scheduler ADDRESS)")
        if self.block_rows < 1:
            raise ConfigError(f"cluster.block_rows = {self.block_rows} must be >= 1")
        if self.spill_texts not in (True, False, "auto"):
            raise ConfigError(f"cluster.spill_texts = {self.spill_texts!r} must be true, false or auto")
        if self.shuffle not in SHUFFLES:
            raise ConfigError(f"cluster.shuffle = {self.shuffle!r} must be null (automatic), p2p, tasks or device")
        per = self.workers_per_gpu
        if isinstance(per, bool) or not isinstance(per, int) or per < 1:
            raise ConfigError(f"cluster.workers_per_gpu = {per!r} must be an integer >= 1 (Dask-CUDA workers sharing "
                              "each GPU; 1: one worker per GPU)")
        if per > 1 and self.scheduler:
            raise ConfigError(f"cluster.workers_per_gpu = {per} shares the GPUs among the workers of a local cluster, "
                              f"but cluster.scheduler = {self.scheduler!r} joins a running one, whose workers are "
                              "started by whoever started it (e.g. CUDA_VISIBLE_DEVICES=0,0 dask cuda worker ADDRESS: "
                              "two workers on GPU 0); drop one of the two settings")
        if per > 1 and self.workers is not None and self.workers % per:
            raise ConfigError(f"cluster.workers = {self.workers} is not a multiple of cluster.workers_per_gpu = {per}: "
                              f"every GPU is shared by {per} workers; use --workers {max(per, self.workers // per * per)} "
                              f"(or a cluster.workers_per_gpu that divides {self.workers})")
        if self.device_memory_limit != "auto":
            try:
                size = parse_size(self.device_memory_limit)
            except ValueError:
                size = None
            if not size:
                raise ConfigError(f"cluster.device_memory_limit = {self.device_memory_limit!r} is not a size above 0; "
                                  "write e.g. 20GiB (per GPU worker), or auto (80 % of its share of the GPU)")
        if self.whole_on_one_worker not in ("auto", False):
            raise ConfigError(f"cluster.whole_on_one_worker = {self.whole_on_one_worker!r} must be auto or false")
        for key in ("components_gathered_edges", "small_route_rows"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"cluster.{key} = {value!r} must be an integer >= 0 ({ZERO_MEANS[key]})")
        if self.memory_limit != "auto":
            try:
                size = parse_size(self.memory_limit)
            except ValueError:
                raise ConfigError(f"cluster.memory_limit = {self.memory_limit!r} is not a size; write e.g. 4GiB or "
                                  "2000MB (per worker), or auto (Dask's share of the machine's memory)") from None
            if size < MIN_WORKER_MEMORY:
                raise ConfigError(
                    f"cluster.memory_limit = {self.memory_limit!r} is below {MIN_WORKER_MEMORY // 2**20} MiB: a worker "
                    "process uses about 160 MiB before it holds any data, and Dask pauses a worker at 80 % of its "
                    "limit and restarts it at 95 %, so it would restart forever; give e.g. 2GiB, or auto")

    @property
    def enabled(self) -> bool:
        return self.workers is not None or bool(self.scheduler)


_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(text) -> int:
    """Bytes of a size such as ``"12GiB"``, ``"500MB"`` or ``1000000``; ValueError when it is not one."""
    if isinstance(text, bool):
        raise ValueError(text)
    if isinstance(text, (int, float)):
        if not 0 <= text < math.inf:  # NaN and infinity are no size (int() of them raises another error)
            raise ValueError(text)
        return int(text)
    s = str(text).strip().lower().replace(" ", "")
    num = s.rstrip("kmgtib")
    unit = s[len(num):]
    if not num or unit not in _SIZE_UNITS:
        raise ValueError(text)
    value = float(num) * _SIZE_UNITS[unit]
    if not 0 <= value < math.inf:  # "-1GiB", "infGiB", "1e400": no size (int(inf) would be an OverflowError)
        raise ValueError(text)
    return int(value)


@dataclass(frozen=True)
class GPUConfig:
    """Device memory of the GPU backend (single process).

    ``memory_limit``: the most device memory a run plans to hold at once ("auto":
    80 % of the device).  A corpus whose text, signatures and per-document arrays fit
    stays on the device from read to write; a larger one runs in batches: its
    normalized text stays in host memory and each kernel batch (normalize, signatures,
    verify) uploads at most a quarter of the limit.

    ``reader``: ``cudf`` reads the text columns of Parquet shards straight into device
    memory when cuDF is installed, the corpus fits the limit and every text column is a
    UTF-8 string column; otherwise (or with ``pyarrow``) pyarrow reads them on the host
    and the text is copied to the device once.  The report's ``gpu.reader`` says which ran.

    With ``reader: cudf`` and ``output.hold_inputs`` not false, cuDF reads every column of all the
    shards in one call and the run holds them in device memory until the write stage.

    ``writer``: ``pyarrow`` writes the deduplicated Parquet shards on the host, one shard per core
    at once; ``cudf`` writes them on the device: from the held columns, every shard in one call
    (filtered and compressed there, each file with its shard's schema metadata), else each shard
    read, filtered and written there (on a cluster, by the GPU worker that writes the shard); ``auto``
    (the default): cuDF from the held columns, pyarrow otherwise.  A file cuDF wrote is kept when its content is the input's kind (the same logical
    schema: see :mod:`gpu_dedup.storage.content`), else pyarrow writes that shard (the log says
    why, once per reason).  Files of the two writers have the same content, not the same bytes.
    """

    memory_limit: str = "auto"  # a size such as "12GiB", "500MB" or "8000000000" (bytes)
    reader: str = "cudf"  # Parquet text columns: cuDF reads them into device memory; pyarrow: on the host
    writer: str = "auto"  # deduplicated Parquet shards: cudf (on the device), pyarrow (on the host) or auto

    def __post_init__(self):
        _check_fields(self)
        _choice("gpu", "reader", self.reader, ("cudf", "pyarrow"))
        _choice("gpu", "writer", self.writer, ("auto", "cudf", "pyarrow"))
        if self.memory_limit != "auto":
            try:
                size = parse_size(self.memory_limit)
            except ValueError:
                size = 0
            if size < 2**20:
                raise ConfigError(f"gpu.memory_limit = {self.memory_limit!r} is not a size of at least 1 MiB; "
                                  "write e.g. 12GiB or 500MB, or auto (80% of the device's memory)")

    def limit_bytes(self, device_bytes: int) -> int:
        """The bound in bytes on a device with ``device_bytes`` of memory."""
        if self.memory_limit == "auto":
            return int(0.8 * device_bytes)
        return parse_size(self.memory_limit)


@dataclass(frozen=True)
class TextVectorConfig:
    """Term-weight vectors built from the normalized text when ``similarity: cosine`` has no
    ``input.vector_column`` (see :mod:`gpu_dedup.stages.vectors`).

    Features are word or char n-grams hashed to 64 bits (no dimension: the
    signature is SimHash over the hashed features); ``tf`` weights a feature
    by its count in the document, ``tfidf`` by count x idf, with document
    frequencies counted over the corpus in ``2**idf_bits`` hashed buckets.
    """

    shingle: str = "word"  # word | char (code points)
    ngram: int = 3
    weighting: str = "tfidf"  # tf | tfidf
    idf_bits: int = 20  # document-frequency table of 2**idf_bits buckets (8 bytes each)

    def __post_init__(self):
        _check_fields(self)
        _choice("cosine.text", "shingle", self.shingle, SHINGLE_KINDS)
        _choice("cosine.text", "weighting", self.weighting, TEXT_WEIGHTINGS)
        if not 1 <= self.ngram <= 64:
            raise ConfigError(f"cosine.text.ngram = {self.ngram} must be in [1, 64] (typical: word 1..5, char 3..9)")
        if not 8 <= self.idf_bits <= 28:
            raise ConfigError(f"cosine.text.idf_bits = {self.idf_bits} must be in [8, 28] "
                              f"(a table of 2**idf_bits int64 counts; typical 20 = 8 MiB)")


@dataclass(frozen=True)
class CosineConfig:
    """Random-projection signatures for ``similarity: cosine`` (see :mod:`gpu_dedup.stages.projections`).

    ``bits`` hyperplanes drawn from ``seed`` give a ``bits``-bit signature;
    ``bands`` x ``rows`` of its bits are banded (``rows`` <= 64); both None:
    derived from ``lsh.threshold`` by :func:`gpu_dedup.curves.cosine_layout`
    with ``rows >= min_rows``; one given: the other is ``bits // given``.
    ``min_rows`` None: derived from the number of rows of the run
    (:func:`gpu_dedup.curves.cosine_min_rows`: about 0.05 unrelated rows per
    bucket; unrelated vectors agree on half of their bits, so a band of
    ``k`` bits holds ``rows * 2**-k`` of them; narrow bands fill buckets with
    them, which costs time and, with star edges, recall).  ``bad_vectors`` decides what
    a row with NaN/inf or of another length than the first row does:
    ``error`` stops with the row and shard named, ``keep`` keeps it
    (counted, never bucketed).  Null rows and zero vectors are always kept
    and counted, never bucketed.
    """

    bits: int = 1024
    seed: int = 42
    bands: int | None = None
    rows: int | None = None
    min_rows: int | None = None  # None: cosine_min_rows(rows of the run)
    bad_vectors: str = "error"  # error | keep
    text: TextVectorConfig = field(default_factory=TextVectorConfig)

    def __post_init__(self):
        _check_fields(self)
        if self.bits < 64 or self.bits > COSINE_MAX_BITS or self.bits % 64:
            raise ConfigError(f"cosine.bits = {self.bits} must be a multiple of 64 in [64, {COSINE_MAX_BITS}] "
                              "(typical: 256..1024)")
        if not 0 <= self.seed < 2**64:
            raise ConfigError(f"cosine.seed = {self.seed} must be in [0, 2**64)")
        _choice("cosine", "bad_vectors", self.bad_vectors, BAD_VECTOR_POLICIES)
        if self.bands is not None and self.bands < 1:
            raise ConfigError(f"cosine.bands = {self.bands} must be >= 1")
        if self.rows is not None and not 1 <= self.rows <= COSINE_MAX_ROWS:
            raise ConfigError(f"cosine.rows = {self.rows} must be in [1, {COSINE_MAX_ROWS}] (bits per band)")
        if self.min_rows is not None and not 1 <= self.min_rows <= min(COSINE_MAX_ROWS, self.bits):
            raise ConfigError(f"cosine.min_rows = {self.min_rows} must be in [1, {min(COSINE_MAX_ROWS, self.bits)}] "
                              "or null (derived from the number of rows)")
        b, r = self.bands, self.rows
        if b is not None and r is not None and b * r > self.bits:
            raise ConfigError(f"cosine.bands * cosine.rows = {b} * {r} = {b * r} exceeds cosine.bits = {self.bits}; "
                              "raise bits or lower bands/rows")
        if b is not None and r is None and self.bits // b < 1:
            raise ConfigError(f"cosine.bands = {b} exceeds cosine.bits = {self.bits}: no bit left per band")
        if b is not None and r is None and self.bits // b > COSINE_MAX_ROWS:
            raise ConfigError(f"cosine.bands = {b} leaves cosine.bits // bands = {self.bits // b} bits per band, "
                              f"over {COSINE_MAX_ROWS}; give cosine.rows too or raise bands")

    def layout(self, threshold: float, fp_weight: float = 0.05, fn_weight: float = 0.95,
               rows_in_run: int | None = None) -> tuple[int, int]:
        """(bands, rows): given, completed from ``bits``, or derived from the cosine ``threshold``
        with ``rows >= min_rows`` (``min_rows`` None: ``cosine_min_rows(rows_in_run)``, or 1 when
        the number of rows is not given)."""
        b, r = self.bands, self.rows
        if b is not None and r is not None:
            return b, r
        if r is not None:
            return self.bits // r, r
        if b is not None:
            return b, self.bits // b
        min_rows = self.min_rows
        if min_rows is None:
            min_rows = cosine_min_rows(rows_in_run) if rows_in_run else 1
        return cosine_layout(threshold, self.bits, fp_weight, fn_weight, min_rows=min(min_rows, self.bits))


@dataclass(frozen=True)
class Config:
    backend: str = "auto"  # auto | cpu | gpu
    exact_dedup: bool = True  # collapse identical normalized texts before MinHash
    input: InputConfig = field(default_factory=InputConfig)
    normalize: NormalizeConfig = field(default_factory=NormalizeConfig)
    minhash: MinHashConfig = field(default_factory=MinHashConfig)
    lsh: LSHConfig = field(default_factory=LSHConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    gpu: GPUConfig = field(default_factory=GPUConfig)
    similarity: str = "jaccard"  # jaccard (MinHash) | cosine (random projections; see the cosine section)
    cosine: CosineConfig = field(default_factory=CosineConfig)

    def __post_init__(self):
        _check_fields(self)
        _choice("", "backend", self.backend, BACKENDS)
        # device branch (tools/device_branches.py): a setting only Dask-CUDA workers have, refused on any other
        # backend when the configuration is read; the config sits below the backends and cannot ask their traits
        if self.cluster.workers_per_gpu > 1 and self.backend != "gpu":
            raise ConfigError(f"cluster.workers_per_gpu = {self.cluster.workers_per_gpu} shares each GPU among "
                              f"Dask-CUDA workers, but backend is {self.backend!r}: use --backend gpu, or drop "
                              "cluster.workers_per_gpu (CPU workers: --workers N alone)")
        _choice("", "similarity", self.similarity, SIMILARITIES)
        if self.similarity != "cosine" and self.input.vector_column is not None:
            raise ConfigError(f"input.vector_column = {self.input.vector_column!r} holds embeddings for similarity "
                              f"cosine, but similarity is {self.similarity!r} (MinHash of the text): add --similarity "
                              "cosine (similarity='cosine'), or drop the vector column")
        if self.similarity == "cosine" and not 0.0 < self.lsh.threshold < 1.0:
            raise ConfigError(f"lsh.threshold = {self.lsh.threshold} must be in (0, 1) as a cosine threshold "
                              "(similarity: cosine; 1 would keep only identical directions); e.g. 0.9")
        b, r, n = self.lsh.bands, self.lsh.rows, self.minhash.num_perm
        if b is not None and r is not None and b * r > n:
            raise ConfigError(
                f"lsh.bands * lsh.rows = {b} * {r} = {b * r} exceeds minhash.num_perm = {n}; "
                "raise num_perm or lower bands/rows"
            )
        one = ("rows", r) if b is None else ("bands", b) if r is None else None
        if one is not None and one[1] is not None and n % one[1] != 0:
            other = "bands" if one[0] == "rows" else "rows"
            raise ConfigError(
                f"minhash.num_perm = {n} is not a multiple of lsh.{one[0]} = {one[1]}, so lsh.{other} cannot be "
                f"derived; use num_perm = {(n // one[1] + 1) * one[1]} or give lsh.{other} too"
            )

    # ---- derived values -------------------------------------------------
    @property
    def layout(self) -> tuple[int, int]:
        """(bands, rows): given, completed from num_perm, or derived from the threshold
        (see lsh.optimal_layout)."""
        b, r, n = self.lsh.bands, self.lsh.rows, self.minhash.num_perm
        if b is not None and r is not None:
            return b, r
        if r is not None:
            return n // r, r
        if b is not None:
            return b, n // b

        return optimal_layout(self.lsh.threshold, self.minhash.num_perm, self.lsh.fp_weight, self.lsh.fn_weight)

    @property
    def cosine_layout(self) -> tuple[int, int]:
        """(bands, rows) of the cosine signature when the number of rows is not known
        (see :meth:`cosine_layout_for`)."""
        return self.cosine_layout_for(None)

    def cosine_layout_for(self, rows_in_run: int | None) -> tuple[int, int]:
        """(bands, rows) of the cosine signature for a run over ``rows_in_run`` rows
        (see :meth:`CosineConfig.layout`)."""
        return self.cosine.layout(self.lsh.threshold, self.lsh.fp_weight, self.lsh.fn_weight, rows_in_run)

    @property
    def verify_threshold(self) -> float:
        return self.verify.threshold if self.verify.threshold is not None else self.lsh.threshold

    @property
    def layout_warning(self) -> str | None:
        """What a (bands, rows) that the config fixes (a preset's, or lsh.bands / lsh.rows) misses at this run's
        threshold, where a pair at the threshold becomes a candidate with probability below one half; None where
        the layout is derived from the threshold (or the similarity is cosine, whose layout has its own rule)."""
        if self.similarity != "jaccard" or (self.lsh.bands is None and self.lsh.rows is None):
            return None
        b, r = self.layout
        t = self.verify_threshold
        p = float(s_curve(t, b, r))
        if p >= 0.5:
            return None
        suits = (1.0 - 0.5 ** (1.0 / b)) ** (1.0 / r)  # where this layout finds half the pairs
        return (f"the layout lsh.bands x lsh.rows = {b} x {r} (set by the config) makes a pair at similarity {t} a "
                f"candidate with probability {p:.2g}, so most such pairs are missed (it suits a threshold near "
                f"{suits:.2f}); to derive one for {t}, unset them: --set lsh.bands=null --set lsh.rows=null")

    @property
    def signature_perms(self) -> int:
        """Permutations actually computed: all of them when signatures verify or
        report similarity, else only the b*r the bands use."""
        b, r = self.layout
        return self.minhash.num_perm if self.verify.method == "signature" else b * r

    @property
    def fingerprint(self) -> str:
        """Hash of everything that changes results (not the backend or the cluster: results agree)."""
        d = self.to_dict()
        d.pop("backend")
        d.pop("cluster")
        d.pop("gpu")
        d["output"].pop("hold_inputs")  # where the write stage takes its rows from: the same bytes either way
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    # ---- (de)serialisation ----------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "Config":
        data = data or {}
        if isinstance(data, dict):
            _check_known(cls, data)  # every unknown key of every section at once, before any value is checked
        return _build(cls, data, "")

    @classmethod
    def from_yaml(cls, path: str | Path) -> "Config":
        p = Path(path)
        if not p.exists():
            preset = _presets_dir() / f"{path}.yaml"
            if preset.is_file():
                p = preset
            else:
                raise ConfigError(
                    f"config file {str(path)!r} does not exist; give a YAML path or a preset name "
                    f"({', '.join(preset_names())})"
                )
        elif p.is_dir():
            raise ConfigError(f"config file {str(path)!r} is a directory, not a file; give a YAML file or a "
                              f"preset name ({', '.join(preset_names())})")
        try:  # a regular file, or e.g. /dev/null or a pipe (-c <(...)): read at most MAX_CONFIG_BYTES
            with open(p, "rb") as f:
                raw = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {str(p)!r} ({exc.strerror}); give a readable YAML file") \
                from None
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"config file {str(p)!r} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; a config is a "
                              "short YAML file: give the right file")
        try:
            data = load_yaml(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {str(p)!r} is not UTF-8 text (byte {exc.start}: "
                              f"{exc.object[exc.start:exc.start + 1]!r}); save it as UTF-8") from None
        except DuplicateKeyError as exc:
            raise ConfigError(f"config file {str(p)!r} {exc}; keep one of them") from None
        except yaml_errors() as exc:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(exc)}; fix the file "
                              "(quote values that hold ':', '#', '{' or '[')") from None
        if data is not None and not isinstance(data, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of keys, not {type(data).__name__}")
        return cls.from_dict(data)

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def with_overrides(self, overrides: dict) -> "Config":
        """Return a copy with dotted keys replaced, e.g. {"lsh.threshold": 0.7}."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            node = data
            parts = dotted.split(".")
            for part in parts[:-1]:
                if part not in node:  # an unknown section: from_dict names it with the other unknown keys
                    node[part] = {}
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"unknown config key {dotted!r}: {part!r} is a setting, not a section; "
                                      f"sections: {', '.join(_sections())}")
                node = node[part]
            node[parts[-1]] = value
        return Config.from_dict(data)


MAX_CONFIG_BYTES = 16 * 2**20  # a config file larger than this is the wrong file (e.g. -c /dev/zero)


class DuplicateKeyError(ValueError):
    """A YAML mapping that names one key twice (YAML itself would silently keep the last value)."""


def _strict_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses a mapping holding one key twice."""

    def mapping(loader, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # << merges (explicit keys override what they merge)
                continue
            key = loader.construct_object(key_node, deep=deep)
            if key in seen:
                line = key_node.start_mark.line + 1
                where = f"line {line}" if line == seen[key] else f"lines {seen[key]} and {line}"
                raise DuplicateKeyError(f"sets {key!r} twice ({where})")
            seen[key] = key_node.start_mark.line + 1
        return loader.construct_mapping(node, deep=deep)

    StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return StrictLoader


def load_yaml(text: str):
    """``yaml.safe_load`` that refuses a key given twice in one mapping (:class:`DuplicateKeyError`)."""
    import yaml

    return yaml.load(text, Loader=_strict_loader())  # noqa: S506 - a SafeLoader subclass


def yaml_errors() -> type:
    import yaml

    return yaml.YAMLError


def _yaml_problem(exc) -> str:
    """A YAML parser error on one line: what is wrong and where (line and column, 1-based)."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def _presets_dir() -> Path:
    """The presets shipped as gpu_dedup.configs (the repository's top-level configs/)."""
    from importlib.resources import files

    return Path(str(files("gpu_dedup.configs")))


def preset_names() -> list[str]:
    return sorted(p.stem for p in _presets_dir().glob("*.yaml"))


def _sections() -> list[str]:
    return [f.name for f in dataclasses.fields(Config) if f.default_factory is not dataclasses.MISSING]



@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _check_fields(obj) -> None:
    """Every field of a config section built directly (``Config(lsh={"threshold": 0.7})``,
    ``MinHashConfig(num_perm="128")``) checked as a YAML value is: the wrong type is a ConfigError naming the key
    (was a TypeError / AttributeError from the range checks, or a truthy string such as exact_dedup="no" taken
    as true), a dict for a section is built into it, NumPy numbers are stored as Python numbers."""
    prefix = SECTION_OF[type(obj)]
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        where = f"{prefix}.{f.name}" if prefix else f.name
        hint = _hints(type(obj))[f.name]
        if dataclasses.is_dataclass(hint):
            if isinstance(value, hint):
                continue
            if value is not None and not isinstance(value, dict):
                raise ConfigError(f"{where} = {value!r} must be a {hint.__name__} or a dict of its keys")
            checked = _build_section(hint, value or {}, where)
        else:
            checked = _check_type(where, value, hint)
        if checked is not value:
            object.__setattr__(obj, f.name, checked)


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _check_type(where: str, value, hint):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return value
        options = [o for o in options if o is not type(None)]
        if len(options) > 1:  # the first type the value has (bool | str: true, false or a word)
            for option in options:
                try:
                    return _check_type(where, value, option)
                except ConfigError:
                    pass
            raise ConfigError(f"{where} = {value!r} has the wrong type; expected "
                              f"{' or '.join(o.__name__ for o in options)}"
                              + (f" ({VALUE_HINTS[where]})" if where in VALUE_HINTS else ""))
        hint = options[0]
    if hint is bool:
        if isinstance(value, bool):
            return value
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool"):
            return bool(value)  # np.bool_(True), e.g. from a frame's cell; stored as bool
    elif hint is int:  # numbers.Integral: also NumPy integers (np.int64(64)), stored as int
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    elif hint is float:  # numbers.Real: also NumPy floats (np.float32(0.8)), stored as float
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            return float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string
    elif hint is str:
        if isinstance(value, str):
            return value
    else:  # pragma: no cover - all fields are scalars or sections
        return value
    raise ConfigError(f"{where} = {value!r} has the wrong type; expected {hint.__name__}"
                      + (f" ({VALUE_HINTS[where]})" if where in VALUE_HINTS else ""))


VALUE_HINTS = {"cluster.memory_limit": "a size per worker such as 4GiB, or auto",
               "cluster.spill_texts": "true, false or auto",
               "cluster.device_memory_limit": "a size per GPU worker such as 20GiB, or auto",
               "gpu.memory_limit": "a size such as 12GiB, or auto"}


def _leaf_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted setting of the dataclass tree ``cls`` (``lsh.threshold``, ``cosine.text.ngram``, ...)."""
    hints = typing.get_type_hints(cls)
    keys = []
    for f in dataclasses.fields(cls):
        where = f"{prefix}.{f.name}" if prefix else f.name
        keys += _leaf_keys(hints[f.name], where) if dataclasses.is_dataclass(hints[f.name]) else [where]
    return keys


def _suggestion(name: str, fields, prefix: str) -> str | None:
    """The key an unknown ``name`` in section ``prefix`` most likely meant: a close name in the same section,
    else a setting of that name (or a close one) in another section (``threshold`` -> ``lsh.threshold``)."""
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=0.6)
    if close:
        return f"{prefix}.{close[0]}" if prefix else close[0]
    leaves = _leaf_keys(Config)
    last = {k.rsplit(".", 1)[-1]: k for k in reversed(leaves)}  # the first section's key of each name
    close = difflib.get_close_matches(name, list(last), n=1, cutoff=0.75)
    return last[close[0]] if close else None


def _unknown_keys(cls, data: dict, prefix: str) -> list[tuple[str, str | None, str, list]]:
    """(dotted key, suggestion, section, the section's keys) of every unknown key under ``data``."""
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    found = []
    for name, value in data.items():
        dotted = f"{prefix}.{name}" if prefix else name
        if dotted in REMOVED_KEYS:
            continue  # explained by _build
        if name not in fields:
            close = difflib.get_close_matches(str(name), fields, n=1, cutoff=0.6)
            if close and isinstance(value, dict) and value and dataclasses.is_dataclass(hints[close[0]]):
                base = f"{prefix}.{close[0]}" if prefix else close[0]  # a misspelt section: 'lsj.threshold'
                inner = [f.name for f in dataclasses.fields(hints[close[0]])]
                found += [(f"{dotted}.{k}", f"{base}.{k}" if k in inner else base, prefix, fields) for k in value]
            else:
                found.append((dotted, _suggestion(str(name), fields, prefix), prefix, fields))
        elif dataclasses.is_dataclass(hints[name]) and isinstance(value, dict):
            found += _unknown_keys(hints[name], value, dotted)
    return found


def _check_known(cls, data: dict) -> None:
    """One ConfigError naming every unknown key of ``data`` (all sections), each with the key it most
    likely meant, and the valid keys of the sections they are in."""
    unknown = _unknown_keys(cls, data, "")
    if not unknown:
        return
    names = ", ".join(f"{k!r} (did you mean {s!r}?)" if s else repr(k) for k, s, _, _ in sorted(unknown))
    sections = {}
    for _, _, section, fields in unknown:
        sections.setdefault(section, fields)
    if len(sections) == 1:
        section, fields = next(iter(sections.items()))
        where = f"section {section!r}" if section else "the top level"
        raise ConfigError(f"unknown config key(s) {names} at {where}; valid keys: {', '.join(fields)}")
    valid = "; ".join(f"{'in ' + repr(sec) if sec else 'at the top level'}: {', '.join(fields)}"
                      for sec, fields in sorted(sections.items()))
    raise ConfigError(f"unknown config keys {names}; valid keys {valid}")


def _build(cls, data, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in data:
        fix = REMOVED_KEYS.get(f"{prefix}.{name}" if prefix else name)
        if fix:
            raise ConfigError(f"{prefix}.{name} = {data[name]!r} is no longer a setting: {fix}")
    unknown = sorted(set(data) - set(fields))
    if unknown:  # a section built on its own (not through Config.from_dict)
        where = f"section {prefix!r}" if prefix else "the top level"
        names = ", ".join(repr(f"{prefix}.{k}" if prefix else k) for k in unknown)
        raise ConfigError(f"unknown config key(s) {names} at {where}; valid keys: {', '.join(fields)}")
    kwargs = {}
    for name, value in data.items():
        where = f"{prefix}.{name}" if prefix else name
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            kwargs[name] = _build(hint, value if value is not None else {}, where)
        else:
            kwargs[name] = _check_type(where, value, hint)
    return cls(**kwargs)


def _build_section(cls, data: dict, prefix: str):
    """A section given as a dict: its unknown keys named with the likely ones, then built like a YAML one."""
    unknown = _unknown_keys(cls, data, prefix)
    if unknown:
        names = ", ".join(f"{k!r} (did you mean {h!r}?)" if h else repr(k) for k, h, _, _ in sorted(unknown))
        valid = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ConfigError(f"unknown config key(s) {names} in section {prefix!r}; valid keys: {valid}")
    return _build(cls, data, prefix)


SECTION_OF = {InputConfig: "input", NormalizeConfig: "normalize", MinHashConfig: "minhash", LSHConfig: "lsh",
              VerifyConfig: "verify", SelectConfig: "select", OutputConfig: "output", ClusterConfig: "cluster",
              GPUConfig: "gpu", TextVectorConfig: "cosine.text", CosineConfig: "cosine", Config: ""}
