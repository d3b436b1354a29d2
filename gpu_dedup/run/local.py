"""One process: the executor that keeps the whole corpus where the backend computes.

:func:`run_local` is the one-process run that :func:`gpu_dedup.run.entry.run_dedup`
chooses without ``cluster.workers`` / ``cluster.scheduler``: the file-based run behind
``gpu-dedup run`` and the in-memory run behind :func:`gpu_dedup.dedup`
(``output_dir=None``: nothing is written).  It prepares the output directory and
checkpoints and hands :class:`LocalExecutor` to the one stage sequence
(:func:`gpu_dedup.run.sequence.execute`).

Stages checkpoint their driver-side results into the output directory (see
:mod:`gpu_dedup.run.checkpoint`); a killed run resumes where it stopped and
recomputes what lives only in memory (the normalized texts) when a later
stage needs it.  The output directory is locked for the run and every output
is staged, verified and then published (see :mod:`gpu_dedup.run.outdir`):
``_SUCCESS`` marks a complete, verified run, and a failing run leaves the
previous complete output as it was.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup import storage
from gpu_dedup.backends import available_memory, distinct, get_backend, host_later, to_device, to_host
from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array
from gpu_dedup.backends.placement import Placement
from gpu_dedup.backends.strings import (
    StringBuffers,
    arrow_strings,
    string_buffers,
)
from gpu_dedup.config import Config
from gpu_dedup.pending import Ready, Soon
from gpu_dedup.run.checkpoint import (
    Checkpoints,
    NoCheckpoints,
    maybe_crash,
    run_fingerprint,
    staged,
)
from gpu_dedup.run.contract import one_process_only, shard_starts, take_in_order
from gpu_dedup.run.prior import NoPrior
from gpu_dedup.run.sequence import (
    CorpusCounts,
    RunResult,
    execute,
    open_output,
    plan_run,
)
from gpu_dedup.run.stagelog import StageLog
from gpu_dedup.stages.exact import stored_keys
from gpu_dedup.stages.families import Family, RowData, family_for
from gpu_dedup.stages.normalize import BatchNormalizer
from gpu_dedup.stages.read import held_texts, hold_inputs, read, read_texts, spill_texts, text_bytes
from gpu_dedup.storage.columns import text_values
from gpu_dedup.storage.filesystems import is_url
from gpu_dedup.stages.selection import ranks_from_keys, text_lengths
from gpu_dedup.stages.write import DUPLICATES_ROW_GROUP, duplicates_parquet_options
from gpu_dedup.stages.vectors import Vectors

log = logging.getLogger("gpu_dedup")

SIGNATURE_CHUNK = 65536  # documents per signature kernel call (progress granularity)
# the device's shard write from the table the read stage held: 1, one libcudf write of every shard (measured on
# one H200, 2026-11-29: 1.21-1.35 s for 10^6 documents' 16 shards, with the files' check and digests); N, a write
# per shard from N threads, each on a CUDA stream of its own (bench/write_probe.py's "streams" variant measures it)
DEVICE_WRITE_STREAMS = 1
# True: libcudf encodes every shard into host memory, and each file's thread writes, syncs and checks it and takes
# its SHA-256 from those bytes (on 2026-11-30 the digests read the files back from the disk: 0.49-0.53 s of the
# stage's 1.22-1.33 s on one H200's host, 0.10 s in tmpfs); False until the write probe's "host-sink" variant
# measures faster on a device
DEVICE_WRITE_HOST_SINK = False


def run_local(inputs, output_dir, cfg: Config = Config(), *, restart: bool = False, prior=None, sink=None,
              write_shards: bool = True, booked: dict | None = None, report_extra: dict | None = None) -> RunResult:
    """Deduplicate the shards ``inputs`` into ``output_dir`` in this process; see the module docstring.

    A run killed at any point resumes from its last checkpoint when called
    again with the same inputs and config; ``restart=True`` starts over.

    ``prior``: an opened :class:`gpu_dedup.index.Index` to deduplicate against
    (its documents always survive); ``sink``: an object whose
    ``append(**payload)`` receives every document of the run (an index being
    built, or ``prior`` itself to update it).  Runs with either keep no
    checkpoints.  ``output_dir=None``: an in-memory run (``inputs`` are usually
    :func:`gpu_dedup.stages.storage.memory_shard` shards): nothing is written.
    A config with ``cluster.workers`` or ``cluster.scheduler`` is refused:
    :func:`gpu_dedup.run.entry.run_dedup` chooses the executor.  ``booked``: named fixed costs (seconds) this
    run already spent before it came here (a cluster client's start-up and connection, for a run it handed
    whole to its only worker): booked, and counted in the wall, as this process's own; ``report_extra``: keys
    added to its report (that worker's ``cluster`` section).
    """
    if cfg.cluster.enabled:
        raise one_process_only("run_local()", "gpu_dedup.run.entry.run_dedup runs on the cluster")
    st = StageLog()  # the run's seconds count from here (from the process's start under the CLI)
    for name, seconds in (booked or {}).items():
        st.fixed[name] = round(st.fixed.get(name, 0.0) + seconds, 4)
        st.started -= seconds
    shards, job = plan_run(inputs, output_dir, cfg, prior=prior, sink=sink, write_shards=write_shards, st=st)
    out = job.out
    if out is None:
        with st.cost("setup"):
            ex = LocalExecutor(shards, cfg, job.prior, report_extra)
        return execute(job, ex, NoCheckpoints(), st)
    resumable = prior is None and sink is None  # against / into an index: nothing to resume
    with st.cost("setup"):
        od = open_output(out, shards, inputs, cfg, shards_written=job.write_shards, fresh=not resumable)
    with od:
        with st.cost("setup"):
            ckpt = Checkpoints(out, run_fingerprint(cfg, shards), restart) if resumable else NoCheckpoints()
            ex = LocalExecutor(shards, cfg, job.prior, report_extra, spill_dir=None if is_url(out) else out)
        return execute(replace(job, outdir=od), ex, ckpt, st)


# ---------------------------------------------------------------------- the executor


@dataclass
class LocalCorpus(CorpusCounts):
    """What the sequence sees of the corpus read in this process."""

    table: pa.Table  # stages.read.Corpus.table: row, shard, shard_row, id, text[, score]
    shards: list
    n: int
    null: np.ndarray  # bool per row (backend array)
    id_column: str | None
    rank_key: object = None
    ids_counted: Any = None  # Ready / Soon: rows whose id another row has (count_duplicate_ids), None: no id column

    @property
    def null_count(self) -> int:
        return int(self.null.sum())

    @property
    def duplicate_ids(self) -> int:
        """Rows whose id another row has (:func:`count_duplicate_ids`, counted on a thread of its own from the
        corpus's making: the run asks for it when it writes its report)."""
        return 0 if self.ids_counted is None else int(self.ids_counted.result())


def count_duplicate_ids(ids) -> int:
    """Rows of ``ids`` (an Arrow column) whose id another row has: Arrow's hash count of every id (nulls one id).
    It grows faster than the rows (0.16 s at 10^6 string ids, 1.5-3.7 s at 10^7 on a 2-core machine), so the
    executor runs it on a thread of its own beside the stages after the read."""
    return len(ids) - pc.count_distinct(ids, mode="all").as_py() if len(ids) else 0


class LocalExecutor:
    """The corpus in this process; stage kernels on the whole of it at once.

    On the CPU backend the corpus is a host Arrow table and the driver arrays
    NumPy.  On the GPU backend the normalized text (``StringBuffers`` of device
    arrays), signatures, band hashes and every driver array live in device memory
    (CuPy) when the corpus fits ``gpu.memory_limit``; a larger corpus keeps them in
    host memory and runs the kernels in batches of at most a quarter of the limit.
    """

    family: Family  # the similarity family (stages/families.py), sized by read()
    corpus: LocalCorpus  # after read()
    block_starts: np.ndarray  # after read()
    partitions = 1  # one part: the whole corpus
    workers = 1
    blocks_count = 1
    holds_corpus = True  # every per-row array is in this process (RunResult carries them)

    def __init__(self, shards, cfg: Config, prior=None, report_extra: dict | None = None, spill_dir=None):
        self.shards = shards
        self.cfg = cfg
        self.spill_dir = spill_dir  # a local directory for the normalized texts' file (cluster.spill_texts)
        self.report_extra = report_extra  # keys the run's report adds (see run_local)
        self.prior = prior if prior is not None else NoPrior()
        self.backend = get_backend(cfg.backend)
        self.part_backend = self.backend  # what partition functions run on
        # where the corpus lives, by the backend's memory plan: its array module, kernel batches, readers, writers
        self.place = Placement(self.backend, self.backend.plan_memory(shards, cfg), cfg)
        self.xp = self.place.xp
        self.st: StageLog | None = None
        self._norm: pa.Array | None = None  # normalized texts (host Arrow), made from the buffers when first asked for
        self._strings: StringBuffers | None = None
        self._invalid = 0  # rows whose text was not valid UTF-8 (counted by normalization)
        self._released = False  # release_texts() freed the normalized texts
        self._texts: Any = None  # where the read texts are until normalized (backends/placement.py)
        self.held: list | None = None  # per shard its batches as read (every column), for the write stage
        self.device_table: Any = None  # every column of every shard in device memory (a GPU read stage's), until written
        self.write_seconds: dict = {}  # where the write stage's seconds went (write_details)
        self.writers: dict | None = None  # Parquet shards each writer wrote ({"cudf": n, "pyarrow": m}) on a device
        self._batches: list | None = None  # normalized batches of the read stage (see BatchNormalizer), until joined
        self._normalizer: BatchNormalizer | None = None  # what normalized them (and holds their bytes)
        self.reader: str | None = None  # "cudf" when a device reader read the text columns, else "pyarrow"
        self._prepared: Family | None = None  # the family with corpus statistics (tf-idf), computed on first use
        self.vectors: Vectors | None = None  # Vectors of the corpus (input.vector_column)
        self._bands: dict | None = None
        self._combined: dict = {}  # node payloads including a prior's documents
        self.startup_seconds = 0.0
        self._loading: Soon | None = None  # the kernels loading beside the read stage (prepare)
        self.loaded_beside_read = False

    # ---- setup ----------------------------------------------------------------
    def prepare(self, st: StageLog) -> None:
        """Load (or, the first time after install, compile) the kernels this config uses: on a thread of its own
        beside the read stage where the backend allows it and the read runs no kernel (the texts' read on the
        GPU; not a cosine run's vectors, which are checked by host kernels as they are read), else now."""
        self.st = st
        if self.backend.loads_beside_read and self.cfg.input.vector_column is None:
            self._loading = Soon(self.backend.prepare, (self.cfg,), name="gpu_dedup-kernels")
        else:
            self.startup_seconds = float(self.backend.prepare(self.cfg) or 0.0)

    def kernels_loaded(self) -> None:
        if self._loading is not None:
            loading, self._loading = self._loading, None
            self.startup_seconds = float(loading.result() or 0.0)
            self.loaded_beside_read = True

    def close(self) -> None:
        pass

    def report_extras(self) -> dict:
        out: dict = {"kernel_prepare_seconds": round(self.startup_seconds, 3)} if self.startup_seconds else {}
        if self.loaded_beside_read:  # kernel_prepare_seconds then overlapped the read stage: the run waited less
            out["kernels_loaded_beside_read"] = True
        out["inputs_skipped"] = list(getattr(self.shards, "skipped", ()))  # what directory walks left out
        out.update(self.place.report(self.reader or "pyarrow", self.writers,
                                     self.place.shard_writers(self.device_table)[0]))
        out.update(self.report_extra or {})
        return out

    # ---- read / normalize -------------------------------------------------------
    def read(self, progress=None) -> LocalCorpus:
        cfg = self.cfg
        score = cfg.select.score_read
        readers = self.place.readers(lambda: storage.device_readable(self.shards, cfg.input, score))
        self.reader = readers.name
        hook = None
        if readers.stream_normalize and family_for(cfg).uses_text:
            # each batch normalized as it is read, its raw text dropped (the memory of the stage: a few batches)
            size = sum(text_bytes(s, cfg.input.text_column) for s in self.shards)
            spill = (self.spill_dir or tempfile.gettempdir()) if spill_texts(cfg.cluster.spill_texts, size) else None
            hook = BatchNormalizer(cfg.normalize, text_lengths if cfg.select.keep == "longest" else None,
                                   capacity=size, spill_dir=spill)
        self._normalizer = hook
        hold = readers.on_host and self.cfg.output.shards and hold_inputs(self.shards, cfg.output.hold_inputs)
        c = read(self.shards, cfg.input, score, progress=progress, readers=readers, text=hook, hold=hold)
        self.held, self.device_table = c.held, c.device_table
        table = c.table
        n = table.num_rows
        self.family = family_for(cfg, n)
        if c.vectors is not None:
            self.vectors = self._load_vectors(c.vectors, c.shards, n)
        self._texts = readers.texts(c.device_text, self.xp)  # the device reader's texts, or the table's column
        c.device_text = None
        batches = c.text_parts or []
        if hook is not None:
            self._batches = batches
            c.text_parts = None
            null = hook.null(batches)
        else:
            null = self._texts.null(lambda: self.family.null_rows(table, self.vectors))
        key = None
        if cfg.select.keep == "longest" and n:
            if hook is not None:
                key = hook.lengths(batches)
            else:
                key = self._texts.lengths(lambda: text_lengths(table.column("text")))
        elif cfg.select.keep == "lowest_id":
            key = table.column("id")
        elif cfg.select.keep == "score":
            key = table.column("score")
        counted = Soon(count_duplicate_ids, (table.column("id"),), name="gpu_dedup-ids") if c.id_column and n else None
        self.corpus = LocalCorpus(table, c.shards, n, to_device(null, self.xp), c.id_column, rank_key=key,
                                  ids_counted=counted)
        self.block_starts = np.array([0, n], np.int64)
        return self.corpus

    def _load_vectors(self, parts, shards, n) -> Vectors:
        """The vector column of every shard (bad rows raise or are kept, per cosine.bad_vectors)."""
        mats, stats = [], []
        dim = self.prior.vector_dim()  # an index's vectors fix the dimension, else the first shard's first vector
        source = "the dimension of the index's vectors" if dim is not None else None
        for i, _, column in parts:  # one step per shard (rows in messages count from the shard's first)
            v = self.family.load_vectors(column, shards[i].path, 0, dim,  # type: ignore[attr-defined]  # cosine
                                         dim_source=source)
            if len(v) and dim is None and (v.status != 3).any():
                dim = v.dim
            mats.append(v.matrix)
            stats.append(v.status)
        if dim is not None:
            mats = [m if m.shape[1] == dim else np.zeros((m.shape[0], dim), np.float32) for m in mats]
        matrix = np.concatenate(mats) if mats else np.zeros((0, 1), np.float32)
        return Vectors(matrix, np.concatenate(stats) if stats else np.zeros(0, np.int8))

    def _data(self) -> RowData:
        return RowData(strings=self.strings if self.family.uses_text else None, vectors=self.vectors)

    def _family(self):
        """The family with its corpus statistics (document frequencies for tf-idf vectors of the text)."""
        if self._prepared is None and not self.family.needs_stats:
            self._prepared = self.family
        if self._prepared is None:
            data = self._data()
            st = self.family.stats(data, self.backend)  # counted where the texts are
            self._prepared = self.family.prepare([st] if st is not None else [])
        return self._prepared

    @property
    def strings(self):
        """Normalized texts as kernel buffers (computed on first use, e.g. again after a resume)."""
        if self._released:
            raise RuntimeError("the normalized texts were released (release_texts) before a step that reads them")
        if self._strings is None:
            assert self.st is not None  # prepared
            with self.st.stage("normalize", self.corpus.n) as info:
                if self._batches is not None:  # normalized batch by batch as the read stage read them
                    assert self._normalizer is not None  # (set with the batches)
                    spilled = self._normalizer.spilled
                    self._strings, invalid, seconds = self._normalizer.join(self._batches)
                    self._batches = self._normalizer = None
                    info.update(normalized_while_reading_seconds=round(seconds, 3))
                    if spilled:
                        info.update(texts_in_file=True)
                else:
                    self._strings, invalid = self._normalize_column()
                info.update(invalid_utf8=invalid, text_mb=round(self._strings.nbytes / 2**20, 1))
            self._invalid = invalid
        return self._strings

    def _normalize_column(self):
        """Normalized texts of the corpus's text read into device memory, or of the table's text column."""
        # the text read into device memory (only for a run that is not batched), or the host column
        column = self._texts.column(self.corpus.table)
        strings, invalid = self.place.normalize(column)  # at once, or in slices above the device's memory
        # the original texts are read again only where needed (written shards, report examples)
        self._texts = None
        if "text" in self.corpus.table.column_names:
            self.corpus.table = self.corpus.table.drop_columns(["text"])
        return strings, invalid

    @property
    def norm(self) -> pa.Array:
        """Normalized texts as a host Arrow array (for an index, or a prior's texts; copied from the
        device once when they live there)."""
        if self._norm is None:
            s = self.strings
            self._norm = arrow_strings(to_host(s.offsets), to_host(s.data))
        return self._norm

    def normalize(self) -> dict:
        if not self.family.uses_text:
            return {}
        self.strings  # noqa: B018
        return {"invalid_utf8": self._invalid}

    # ---- per-document stages (one part: the whole corpus) ----------------------------------------
    def docs(self) -> list:
        xp = self.xp
        return [{"row": xp.arange(self.corpus.n, dtype=xp.int64), "null": self.corpus.null}]

    def exact_keys(self) -> list:
        keys = self.xp.asarray(self.family.exact_keys(self._data(), self.backend))
        return [{"k0": keys[:, 0], "k1": keys[:, 1], "k2": keys[:, 2]}]

    def ranks(self) -> list:
        c, keep = self.corpus, self.cfg.select.keep
        ranks = ranks_from_keys(keep, c.n, length=c.rank_key, ids=c.rank_key, score=c.rank_key)
        return [{"rank": to_device(ranks, self.xp)}]

    def signatures(self, rows, progress=None) -> list:
        """Signatures of ``rows`` (the family's), in chunks of SIGNATURE_CHUNK documents (and, under a GPU
        memory bound, of at most ``batch_bytes`` of text): per row its values, features and usability.

        When nothing after the bands reads the signature values (``family.keep_signatures`` false: MinHash
        verified exactly), each chunk's values become its band hashes at once (``band_hashes`` below only
        picks the rows) and the (rows, permutations) matrix never exists: at 10^6 documents and 128
        permutations, 0.5 GB less at the run's memory peak."""
        xp = self.xp
        rows = rows[0]["row"]  # the part's frame: its rows
        fam, data = self._family(), self._data()
        m = rows.shape[0]
        out = None  # the values, or their band hashes
        features = xp.empty(m, dtype=xp.int64)
        usable = xp.empty(m, dtype=bool)
        banded = not fam.keep_signatures
        slices = self.place.row_slices(m, lambda: self.strings.lengths[to_host(rows)], SIGNATURE_CHUNK)
        for lo, hi in slices:  # a few dozen kernel calls, for progress
            sig = fam.signatures(data, rows[lo:hi], backend=self.backend)
            chunk = xp.asarray(fam.band_hashes(sig.values, self.backend) if banded else sig.values)
            if out is None:
                out = xp.empty((m, chunk.shape[1]), dtype=chunk.dtype)
            out[lo:hi] = chunk
            features[lo:hi], usable[lo:hi] = xp.asarray(sig.features), xp.asarray(sig.usable)
            if progress is not None:
                progress(hi - lo)
        if out is None:
            out = xp.empty((0, fam.layout[0]), dtype=xp.uint64) if banded else fam.empty_values(xp)
        return [{"row": rows, "band_hashes" if banded else "values": out, "features": features, "usable": usable}]

    def band_hashes(self, sigs: list) -> list:
        sig = sigs[0]
        fam = self.family
        rows, values = sig["row"], sig.pop("values", None)
        # band hashes of every signed row (made chunk by chunk by ``signatures`` when the values are not kept),
        # then the rows with features picked: a pick of the (n, bands) hashes, not a copy of the
        # (n, permutations) signatures at the run's memory peak (no pick when all have features)
        bh = sig.pop("band_hashes") if values is None else self.xp.asarray(fam.band_hashes(values, self.backend))
        usable = sig["usable"]
        whole = bool(usable.all())
        pick = None if whole else self.xp.flatnonzero(usable)
        if pick is not None:
            bh = bh[pick]
        part = {"lsh_row": rows if pick is None else rows[pick], "band_hashes": bh}
        if fam.keep_signatures:
            part["signatures"] = values if pick is None else values[pick]
        del values
        return [part]

    def keep_bands(self, bands: list) -> None:
        self._bands = bands[0]

    # ---- moving rows: one partition, nothing moves ------------------------------------------------
    def map(self, fn, *parts, outputs: int = 1, with_index: bool = False, **kw):
        args = [p[0] if p is not None else None for p in parts]
        if with_index:
            kw["part_index"] = 0
        out = fn(*args, **kw)
        return tuple([o] for o in out) if outputs > 1 else [out]

    def route(self, parts: list, dest, n: int, explode=None, explode_kw=None, before=None, after=None,
              **kw) -> list:
        if n != 1 or len(parts) != 1:  # pragma: no cover - one process has one partition
            raise RuntimeError(f"one process routes one partition, not {len(parts)} to {n}")
        part = parts[0] if before is None else before(parts[0], 0)
        return [part if after is None else after(part, 0)]

    def total(self, fn, *parts, **kw) -> dict:
        return dict(self.map(fn, *parts, **kw)[0])

    def collect(self, fn, parts: list, **kw) -> list:
        return [fn(parts[0], **kw)]

    # ---- pairs ---------------------------------------------------------------------
    def score(self, pairs: list, progress=None, clock: dict | None = None) -> list:
        """Similarity of node pairs: doc numbers below the prior's ``first_doc`` are its documents, the others
        this run's rows (``first_doc + row``)."""
        p = pairs[0]
        return [{"sim": self.similarity(p["src"], p["dst"], progress=progress, clock=clock)}]

    def similarity(self, left, right, progress=None, clock: dict | None = None):
        cfg, xp = self.cfg, self.xp
        fam = self._family()
        left, right = xp.asarray(left, dtype=xp.int64), xp.asarray(right, dtype=xp.int64)
        if left.shape[0] == 0:
            return xp.zeros(0, dtype=xp.float64)
        f = self.prior.first_doc
        docs = distinct(xp.concatenate((left[left < f], right[right < f]))) if f else xp.zeros(0, dtype=xp.int64)
        m = int(docs.shape[0])

        def position(nodes):  # a prior's documents first, then this run's rows
            return xp.where(nodes < f, xp.searchsorted(docs, nodes), m + nodes - f) if m else nodes - f

        if cfg.verify.method == "exact":
            data = self._data()
            if m:
                key = ("rows", to_host(docs).tobytes())
                if key not in self._combined:
                    self._combined = {key: self._with_prior(to_host(docs), data)}
                data = self._combined[key]
            return fam.pair_similarity(data, None, position(left), position(right), self.backend, progress, clock)
        bands = self._bands
        assert bands is not None  # keep_bands ran
        sig = bands["signatures"]
        rows = bands["lsh_row"]
        if m:
            key = ("signatures", to_host(docs).tobytes())
            if key not in self._combined:
                self._combined = {key: xp.concatenate((to_device(self.prior.signatures(to_host(docs)), xp), sig))}
            sig = self._combined[key]

        def sig_row(nodes):
            return xp.where(nodes < f, xp.searchsorted(docs, nodes), m + xp.searchsorted(rows, nodes - f)) if m \
                else xp.searchsorted(rows, nodes - f)

        return fam.pair_similarity(None, sig, sig_row(left), sig_row(right), self.backend, progress)

    def _with_prior(self, docs, data: RowData) -> RowData:
        """Rows of the indexed documents ``docs``, then this run's rows."""
        if data.vectors is not None:
            pv = self.prior.vectors(docs)
            return RowData(vectors=Vectors(np.concatenate([pv.matrix, data.vectors.matrix]),
                                           np.concatenate([pv.status, data.vectors.status])))
        texts = self.prior.texts(docs).cast(pa.large_string())
        both = string_buffers(pa.concat_arrays([texts, self.norm.cast(pa.large_string())]))
        return RowData(strings=StringBuffers(to_device(both.offsets, self.xp), to_device(both.data, self.xp)))

    def components(self, edges: list, count: int | None = None) -> list:
        """Union-find (the backend's) over the edges' nodes, labelled by their smallest node."""
        xp = self.xp
        e = edges[0]
        nodes = distinct(xp.concatenate((e["src"], e["dst"])))
        comp = self.backend.components(xp.searchsorted(nodes, e["src"]), xp.searchsorted(nodes, e["dst"]),
                                       int(nodes.shape[0]))
        return [{"node": nodes, "label": nodes[comp] if nodes.shape[0] else nodes}]

    # ---- checkpoints ---------------------------------------------------------------------
    def save(self, ckpt, unit: str, parts: dict, meta: dict) -> dict:
        """Unit ``unit``'s parts to checkpoint ``ckpt``.  Device arrays are not copied here: the checkpoint
        writer's thread copies them to the host when it writes the unit, after the kernels that made them
        (:func:`gpu_dedup.backends.host_later`), while the next stages run.  No stage changes an array of a
        saved part afterwards (each makes new arrays from them, on either array module: a checkpoint of NumPy
        arrays is written later too), so the copy reads what the stage handed over."""
        arrays = {f"{name}/{col}": v for name, p in parts.items() if p[0] is not None for col, v in p[0].items()}
        meta = {**meta, "parts": {name: p[0] is not None for name, p in parts.items()}}
        ckpt.save(unit, host_later(arrays), meta)
        return parts

    def load(self, ckpt, unit: str):
        arrays, meta = ckpt.load(unit)
        parts: dict = {name: [None] if not present else [{}] for name, present in meta.get("parts", {}).items()}
        for key, v in arrays.items():
            name, col = key.split("/", 1)
            parts[name][0][col] = to_device(v, self.xp)
        return parts, meta

    # ---- outputs ---------------------------------------------------------------------
    def ids(self, parts: list, column: str = "row") -> list:
        rows = to_host(parts[0][column])
        col = self.corpus.table.column("id")
        ids = col.take(arrow_array(rows, pa.int64())).combine_chunks() if len(rows) else empty_array(col.type)
        return [{"id": ids}]

    def expect_rows(self, rows: int) -> None:
        """Nothing to plan: rows never move between partitions in one process."""

    def soon(self, fn, *args, **kw) -> Ready:
        """At once: this process's workers are its own threads, busy with every stage."""
        return Ready(fn(*args, **kw))

    def take(self, rows, column: str) -> pa.Array:
        return self.take_soon(rows, column, at_once=True).result()

    def take_soon(self, rows, column: str, at_once: bool = False) -> Ready | Soon:
        """:meth:`take`; texts read again from the shards (none held, none on the device: a run that writes no
        shards) on a thread of its own, unless ``at_once``: page reads and decoding (pyarrow, the GIL mostly
        released) beside the write stage.  Anything else at once (held batches come from memory, and the write
        stage frees them)."""
        # device branch (tools/device_branches.py): the read stage's device table is held only until the write
        # stage, which frees it; the report's samples come from it where it still is, else from the host
        if column == "text" and self.device_table is not None:  # the report's samples, from device memory
            return Ready(text_values(self.device_table.take(self.cfg.input.text_column, rows)).combine_chunks())
        if column == "text" and "text" not in self.corpus.table.column_names:
            texts = _ShardTexts(self.corpus, self.cfg, self.held)
            if at_once or self.held is not None:
                return Ready(texts.take(rows))
            return Soon(texts.take, (rows,), name="gpu_dedup-sample-texts")
        return Ready(self.corpus.table.column(column).take(arrow_array(rows, pa.int64())).combine_chunks())

    def release_texts(self) -> None:
        """Free the normalized texts (at 10^6 documents as large as the text itself) before the write stage
        streams the shards; asking for them afterwards is an error, not a silent second normalization."""
        self._strings = self._norm = None
        self._released = True

    def write_shards(self, removed: list, out: Path, ckpt, progress=None) -> int:
        kept = np.ones(self.corpus.n, bool)
        kept[to_host(removed[0]["row"])] = False
        return self.write(kept, out, ckpt, progress)

    def write(self, kept: np.ndarray, out: Path, ckpt, progress=None) -> int:
        """Write every shard's kept rows.  Shards are independent files: on the CPU up to one per core is
        read, filtered, compressed and digested at a time (pyarrow and hashlib release the GIL); the
        checkpoint marks follow in shard order."""
        shards = self.corpus.shards
        starts = shard_starts(shards)
        keeps = [kept[starts[i] : starts[i + 1]] for i in range(len(shards))]
        todo = [i for i, shard in enumerate(shards) if not staged(ckpt.marked(f"shard-{i}"), shard, out)]
        device_writer, table_writer = self.place.shard_writers(self.device_table)
        on_device: dict = {}  # shards the device wrote from the table the read stage held: their digest records
        wrote: list = []  # the writer of each shard the device was offered (cudf, or pyarrow where it declined)
        times = storage.no_busy()  # where the stage's seconds go (write_details)
        # device branch (tools/device_branches.py): the placement hands over the device's writer of the table the
        # read stage held; only a run that writes every shard now uses it (a resumed one writes on the host)
        if table_writer is not None and len(todo) == len(shards):
            on_device = storage.write_shards_on_device(shards, kept, starts, out, self.cfg.output.compression,
                                                       self.device_table, table_writer, DEVICE_WRITE_STREAMS, times,
                                                       host_sink=DEVICE_WRITE_HOST_SINK)
            wrote += ["cudf"] * len(on_device) + ["pyarrow"] * (len(todo) - len(on_device))
        self.device_table = None  # its device memory goes back

        held = self.held or [None] * len(shards)
        self.held = None  # each shard's batches go with its write

        def write_one(i):
            mine, held[i] = held[i], None
            if i in on_device:  # checked and digested on the thread that wrote it
                return on_device[i]
            with storage.busy_into(times):
                storage.write_shard(shards[i], keeps[i], out, self.cfg.output.compression,
                                    device_writer=device_writer, held=mine, wrote=wrote)
                return {"name": shards[i].name, **storage.written_digest(out / shards[i].name)}

        # the device writer too (gpu.writer: cudf): on one H100 the stage took 17 s for 10^6 documents' 16 shards
        # one at a time, 4.0 s from 16 threads (pyarrow wrote every shard again there: see storage.filter)
        needs = [storage.write_memory(shards[i]) for i in todo if i not in on_device]
        threads = storage.concurrent_writes(needs, os.cpu_count() or 1, available_memory())  # a shard a core
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads, thread_name_prefix="gpu-dedup-write") as pool:
            for i, record in zip(todo, pool.map(write_one, todo)):  # in shard order
                ckpt.mark(f"shard-{i}", record)
                maybe_crash("write:first-shard")
                if progress is not None:
                    progress(1)
        if progress is not None and len(todo) < len(shards):
            progress(len(shards) - len(todo))  # written by an earlier, resumed run
        if wrote:  # the device was offered shards: which writer wrote each (the threads appended to it)
            self.writers = {name: wrote.count(name) for name in ("cudf", "pyarrow")}
        self.write_seconds = {**times, "host_shards_seconds": time.perf_counter() - t0}  # rounded in write_details
        return int(sum(int(k.sum()) for k in keeps))

    def write_details(self) -> dict:
        """Where the write stage's seconds went (:meth:`write`): the device's write of the held table and what
        followed it (``device_write_seconds``, ``device_files_seconds``), the shards written on the host
        (``host_shards_seconds``), and the seconds threads spent syncing and digesting the files."""
        return {k: round(v, 4) for k, v in self.write_seconds.items()}

    def write_table(self, parts: Iterable, path: Path) -> int:
        """The tables ``parts`` yields (the whole table, or its row groups as they are made: see
        :meth:`gpu_dedup.run.sequence.Sequence._table_beside`) as one file, in row groups of
        ``DUPLICATES_ROW_GROUP`` rows: the file one write of the whole table makes, byte for byte."""
        return storage.atomic_write_parquet_groups(path, storage.row_groups(parts, DUPLICATES_ROW_GROUP),
                                                   self.cfg.output.compression, duplicates_parquet_options)

    def append_index(self, sink, docs: list, keys: list | None, bands: list, centres: list, dup: list,
                     first_doc: int, layout) -> None:
        """The whole corpus as one segment of ``sink`` (see the contract)."""
        sink.append(**self.index_payload(docs, keys, bands, centres, dup, first_doc), layout=layout)

    def index_payload(self, docs: list, keys: list | None, bands: list, centres: list, dup: list,
                      first_doc: int) -> dict:
        """What an index keeps of this run's documents (see :meth:`gpu_dedup.index.Index.append`)."""
        n = self.corpus.n
        if self.family.uses_text:
            self.strings  # noqa: B018 - normalized texts (recomputed after a resume)
        if keys is None:
            keys = self.exact_keys()
        k = keys[0]
        b = bands[0]
        full = None
        if "signatures" in b:
            sig = to_host(b["signatures"])
            full = np.zeros((n, sig.shape[1]), sig.dtype)
            full[to_host(b["lsh_row"])] = sig
        kept = np.ones(n, bool)
        survivor = first_doc + np.arange(n, dtype=np.int64)
        d = dup[0]
        rows = to_host(d["row"])
        kept[rows] = to_host(d["kept"])
        survivor[rows] = to_host(d["cluster"])
        c = centres[0]
        own = to_host(c["doc"]) >= first_doc  # centres among this run's documents
        key = stored_keys(k, docs[0]["null"])
        return {"ids": self.ids([{"row": np.arange(n, dtype=np.int64)}])[0]["id"] if self.corpus.id_column else
                arrow_array(first_doc + np.arange(n, dtype=np.int64)),
                "kept": kept, "survivor": survivor,
                "keys": key,
                "texts": self.norm if self.family.uses_text else None,
                "band_docs": first_doc + to_host(b["lsh_row"]), "band_hashes": to_host(b["band_hashes"]),
                "signatures": full, "vectors": self.vectors.matrix if self.vectors is not None else None,
                "centres": (to_host(c["band"])[own], to_host(c["hash"])[own], to_host(c["round"])[own],
                            to_host(c["doc"])[own])}


class _ShardTexts:
    """``take(rows)`` of the original texts: from the batches the read stage held, or read again
    (streamed) from the shards that hold the rows."""

    def __init__(self, corpus: LocalCorpus, cfg: Config, held: list | None = None):
        self.corpus, self.cfg, self.held = corpus, cfg, held

    def take(self, rows) -> pa.Array:
        rows = np.asarray(rows, np.int64)
        shards = self.corpus.shards
        starts = shard_starts(shards)
        cfg = replace(self.cfg.input, id_column=None)

        def texts(group):  # read again, streamed; decoding releases the GIL: up to a shard per core at a time
            k, sel = group
            if self.held is not None and self.held[k] is not None:
                return held_texts(self.held[k], cfg.text_column, rows[sel] - starts[k])
            return read_texts(shards[k], cfg, rows[sel] - starts[k])

        def fetch(groups):  # one read per shard holding a row (a few dozen texts)
            with ThreadPoolExecutor(max(1, min(len(groups), os.cpu_count() or 1))) as pool:
                return list(pool.map(texts, groups))
        return take_in_order(rows, starts, fetch, text=True)
