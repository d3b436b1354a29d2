"""A persisted index for incremental dedup and online queries.

Layout of an index directory (format ``gpu_dedup-index``, version 2)::

    manifest.json          format, format_version, fingerprint, config, threshold, verify_threshold, split_chains,
                           documents, segments, checksums (size + SHA-256 of every segment file),
                           sources (the run fingerprint of the inputs that appended each segment),
                           manifest_sha256
    .gpu_dedup_index.lock  held (flock) by the one run that appends to or builds the index
    seg-00000/docs.arrow   doc, id, kept, survivor, key_len, key_h1, key_h2, text[, signature]
    seg-00000/bands.arrow  band, hash, doc   (sorted by band, hash, doc)
    seg-00000/centers.arrow band, hash, round, doc  (sorted; see below)
    seg-00001/...          one segment per build or append (a cluster run's: one per block, all
                           published by one manifest write); old segments never change

``*.arrow`` files are Arrow IPC files (uncompressed, memory-mapped on open, so
opening costs almost nothing and rows are fetched by position).  ``doc``
numbers documents across segments in the order they were added; ``survivor``
is the doc number of the survivor of a document's cluster; ``text`` is the
normalized text (for exact verification and similarity); the key columns are
the exact-duplicate keys.  Bands hold the documents that went through LSH
(exact-group representatives with at least one shingle).  ``centers`` hold
the centre :func:`gpu_dedup.stages.edges.star_rounds` chose for a bucket at each
round >= 1 (round 0's centre is the bucket's smallest document): new
documents meet exactly this sequence of centres in a full dedup, so an
incremental run replays it instead of re-verifying the indexed members.  The manifest is
replaced atomically after a segment is complete, so a crash never leaves a
half-added segment visible; opening an index verifies the manifest's own checksum and every
segment file against the size and SHA-256 recorded when it was written, so a damaged or mixed
index is refused instead of answering.  One writer at a time holds the lock from opening the
index to its append (:meth:`Index.writing`); readers need none.

Every document is kept in the index, removed ones included: a new document
that resembles only a document removed earlier must still be removed, exactly
as a full dedup of everything would (see ``tests/test_index.py``).

The fingerprint covers what changes hash values and matching (normalize,
minhash, bands x rows); an index opened with another config fails at once.
``verify_threshold`` records the threshold the index's documents were verified
(removed) at (``verify.threshold``, or ``lsh.threshold`` where that is null): a
run at another is refused whatever its layout (with ``lsh.bands`` and
``lsh.rows`` given, or a threshold that derives the index's layout, the
fingerprint alone does not tell them apart); an index written before it was
recorded stands for it by its ``threshold`` (lsh.threshold), and its first
append records it; a run against such an index that gives a verify.threshold
with the index's lsh.threshold is taken at its word, with a warning (the index
cannot show what its documents were verified at).  A query's own threshold is a read-only lookup, not checked.
``split_chains`` records ``select.split_chains``, how the index's clusters were
decided: a run with the other value would remove by another rule than the one
the index's documents were removed by (the combined result follows neither;
``tools/index_settings_experiment.py``), so it is refused too.  An index written
before it was recorded is run against with a warning, and its first append
records the appending run's value.  ``select.keep`` is not recorded: a run with
another policy ranks its new documents by it, indexed documents first, which
is one ranking of all the documents (what ``keep: score`` gives with such a score).

An index of ``similarity: cosine`` (the manifest's ``similarity``; absent:
``jaccard``) holds, instead of MinHash values, the packed random-projection
signatures (``signature``, uint64 words) and, with a vector column, the
vectors (``vector``, fixed_size_list<float32>; ``text`` is then null); its
fingerprint covers the cosine settings (bits, seed, the text vectors) and the
(bands, rows) of the run that built it, which later runs and queries reuse.
A Jaccard index cannot be queried or extended as a cosine one, nor the
other way round.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup.config import Config
from gpu_dedup.errors import InputError, OutputError
from gpu_dedup.index.add import AddResult, add
from gpu_dedup.index.format import (
    CHECKSUMS,
    FORMAT,
    FORMAT_VERSION,
    LOCK,
    MANIFEST,
    MANIFEST_DIGEST,
    SEGMENT_FILES,
    SEGMENT_NAME,
    SOURCES,
    RECORDED,
    SPLIT_CHAINS,
    VERIFY_THRESHOLD,
    IndexMismatchError,
    Segment,
    check_indexable,
    check_manifest,
    fingerprint_of,
    index_config,
    index_fingerprint,
    index_similarity,
    is_index_manifest,
    read_ipc,
    same_kind,
    sealed,
    segment_name,
    verify_file,
    write_ipc,
)
from gpu_dedup.index.query import query
from gpu_dedup.kernels.params import HASH_FAMILY_NAME
from gpu_dedup.run.checkpoint import maybe_crash
from gpu_dedup.run.outdir import MANIFEST_NAME as OUTPUT_MANIFEST
from gpu_dedup.run.outdir import SUCCESS_NAME, check_output_path, release_lock, take_lock
from gpu_dedup.stages.families import NO_KEY, family_for
from gpu_dedup.stages.vectors import Vectors
from gpu_dedup.storage import atomic_write_bytes, file_digest
from gpu_dedup.storage.atomic import sync_dir, sync_file

log = logging.getLogger("gpu_dedup")

MAX_SEGMENTS = 100_000  # seg-00000 .. seg-99999


class Index:
    """An opened index; see the module docstring for the format."""

    def __init__(self, path: Path, manifest: dict, segments: list):
        self.path = Path(path)
        self.manifest = manifest
        self.segments = segments
        self._keys = None
        self._unloaded = None  # (names, first doc) of segments a cluster append published, opened on first use
        self._lock_fd = None  # held while this object writes (see writing())
        self._locked = False  # the index's lock is held for this object (by it, or by its builder)
        self.source: str | None = None  # what the next append records as its segment's source (see appended_from)
        self._hold = False  # appends write their segments and keep the manifest write for publish_staged()
        self._staged = None  # what a held append publishes: its manifest and segment names
        self._split_chains = None  # an index recording none: the value check() saw, which an append records
        self._verify_threshold = None  # likewise for an index recording no verify threshold
        self._recorded: dict = {}  # likewise for the RECORDED settings it records none of

    # ---- lifecycle ----------------------------------------------------------
    @classmethod
    def create(cls, path, cfg: Config, layout: tuple[int, int] | None = None) -> "Index":
        """A new, empty index for ``cfg`` (cosine: ``layout`` is the (bands, rows) of the building run);
        its manifest is written with its first segment (:meth:`append`), so no empty index is left behind."""
        p = Path(path)
        if (p / MANIFEST).exists():
            raise InputError(f"an index already exists in {str(p)!r}; open it, or remove it to build a new one")
        check_indexable(cfg)
        if cfg.similarity == "cosine" and layout is None:
            layout = family_for(cfg).layout
        p.mkdir(parents=True, exist_ok=True)
        config = index_config(cfg, layout)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "hash_family": HASH_FAMILY_NAME,
                    "similarity": cfg.similarity, "fingerprint": fingerprint_of(config),
                    "config": config, "threshold": cfg.lsh.threshold,
                    VERIFY_THRESHOLD: cfg.verify_threshold, SPLIT_CHAINS: cfg.select.split_chains,
                    **{key: _setting(cfg, dotted) for key, (dotted, _) in RECORDED.items()},
                    "id_column": cfg.input.id_column,
                    "vector_column": cfg.input.vector_column,
                    "documents": 0, "segments": [], CHECKSUMS: {},
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        return cls(p, manifest, [])

    @classmethod
    def open(cls, path, cfg: Config | None = None, verify: bool = True) -> "Index":
        """Open the index in ``path`` (checked against ``cfg`` when given).  Its manifest's checksum and every
        segment file's size are always checked; ``verify`` (default) also reads every segment file once to
        compare its SHA-256 with the one recorded when it was written (about 0.7 GB/s on two cores)."""
        p = Path(path)
        if not (p / MANIFEST).is_file():
            raise InputError(f"{str(p)!r} is not a gpu_dedup index (no {MANIFEST}); build one with "
                             "`gpu-dedup index build` or `gpu-dedup run ... --index-out DIR`")
        try:
            manifest = json.loads((p / MANIFEST).read_text())
        except ValueError as exc:
            raise InputError(f"index manifest {str(p / MANIFEST)!r} is not valid JSON ({exc}); restore it from a "
                             "backup or rebuild the index (gpu-dedup index build CORPUS -o NEW_INDEX_DIR)") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            if not isinstance(manifest, dict):
                manifest = {"format": type(manifest).__name__}
            raise InputError(f"{str(p)!r} holds {manifest.get('format')!r}, not a {FORMAT!r} index; give an index "
                             "directory built by `gpu-dedup index build` or `gpu-dedup run ... --index-out DIR`")
        family = manifest.get("hash_family", "v1 (exact arithmetic mod 2^61-1)")
        if manifest.get("format_version") != FORMAT_VERSION or family != HASH_FAMILY_NAME:
            raise InputError(
                f"the index in {str(p)!r} was built with hash family {family} (index format version "
                f"{manifest.get('format_version')}); this gpu_dedup hashes with family {HASH_FAMILY_NAME} (format "
                f"version {FORMAT_VERSION}), so its signatures and band hashes cannot be compared: rebuild the index "
                f"from its corpus (gpu-dedup index build CORPUS -o NEW_INDEX_DIR)")
        try:
            check_manifest(manifest)
            segments = cls._load_segments(p, manifest, verify=verify)
        except (OSError, KeyError, TypeError, ValueError, pa.ArrowException) as exc:
            raise _damaged(p, exc) from None
        unlisted = sorted(n for n in _listdir(p) if SEGMENT_NAME.fullmatch(n) and n not in manifest["segments"])
        if unlisted:
            log.warning("the index in %s holds %s, which its manifest does not list (an append under way, one "
                        "interrupted before it wrote the manifest, or a manifest restored from an earlier copy): %s not "
                        "part of the "
                        "index, and the next append replaces the first of them", p, ", ".join(unlisted),
                        "it is" if len(unlisted) == 1 else "they are")
        unsummed = [name for name in manifest["segments"] if name not in manifest.get(CHECKSUMS, {})]
        if unsummed or MANIFEST_DIGEST not in manifest:
            log.warning("the index in %s was written by an earlier gpu_dedup without checksums (%s): damage to it "
                        "cannot be detected; rebuild it to add them (gpu-dedup index build CORPUS -o NEW_INDEX_DIR)",
                        p, ", ".join(unsummed) or MANIFEST)
        index = cls(p, manifest, segments)
        if cfg is not None:
            index.check(cfg)
        return index

    @staticmethod
    def _load_segments(p: Path, manifest: dict, names=None, first: int = 0, verify: bool = True) -> list:
        """The segments ``names`` (default: all the manifest lists), verified against the checksums recorded
        when they were written and memory-mapped; raises on a segment that is not whole."""
        whole = names is None
        names = manifest["segments"] if whole else names
        sums = manifest.get(CHECKSUMS, {})
        checks = [(p / name / f, sums[name][f]) for name in names if name in sums for f in SEGMENT_FILES]
        if checks:  # every file read once, in parallel (hashlib releases the GIL)
            with ThreadPoolExecutor(min(len(checks), os.cpu_count() or 1, 8)) as pool:
                list(pool.map(lambda c: verify_file(*c, digest=verify), checks))
        segments = []
        nb = int(manifest["config"]["bands"])
        for name in names:  # one step per segment
            docs = read_ipc(p / name / "docs.arrow")
            bands = read_ipc(p / name / "bands.arrow")
            centres = read_ipc(p / name / "centers.arrow")
            start = np.searchsorted(np.asarray(bands.column("band")), np.arange(nb + 1)).astype(np.int64)
            cstart = np.searchsorted(np.asarray(centres.column("band")), np.arange(nb + 1)).astype(np.int64)
            segments.append(Segment(name, docs, np.asarray(bands.column("hash")), np.asarray(bands.column("doc")),
                                     start, np.asarray(centres.column("hash")), np.asarray(centres.column("round")),
                                     np.asarray(centres.column("doc")), cstart, first))
            first += docs.num_rows
        if whole and first != int(manifest["documents"]):
            raise ValueError(f"its segments hold {first} documents, its manifest says {manifest['documents']}")
        return segments

    @staticmethod
    def _write_manifest(p: Path, manifest: dict) -> None:
        atomic_write_bytes(p / MANIFEST, (json.dumps(sealed(manifest), indent=2) + "\n").encode())

    # ---- one writer at a time -----------------------------------------------------
    @contextmanager
    def writing(self):
        """Hold the index's lock (``.gpu_dedup_index.lock``, ``flock``) while deduplicating against the index
        and appending to it: another writer stops at once (exit 4), so appends serialize and an index never
        mixes two writers.  An index another writer changed since it was opened is read again first."""
        if self._locked:
            yield self
            return
        self._lock_fd = _lock_index(self.path)
        self._locked = True
        try:
            if _on_disk(self.path) != _state(self.manifest):
                fresh = Index.open(self.path)
                self.manifest, self.segments, self._keys = fresh.manifest, fresh.segments, None
            yield self
        finally:
            release_lock(self.path / LOCK, self._lock_fd)
            self._lock_fd, self._locked = None, False

    @property
    def segments(self) -> list:
        if self._unloaded is not None:  # opened when first used: the client of a cluster append never maps them
            names, first = self._unloaded
            self._unloaded = None
            self._segments = self._segments + self._load_segments(self.path, {**self.manifest, CHECKSUMS: {}},
                                                                  names, first)
        return self._segments

    @segments.setter
    def segments(self, value: list) -> None:
        self._segments, self._unloaded = value, None

    @property
    def id_type(self):
        """The Arrow type of the index's ids (None while it holds no segment: the first append's ids name it)."""
        return self.segments[0].docs.schema.field("id").type if self.segments else None

    @property
    def similarity(self) -> str:
        return index_similarity(self.manifest)

    def check(self, cfg: Config) -> None:
        theirs = self.manifest["config"]
        lacking = [s.name for s in self.segments if "signature" not in s.docs.schema.names]
        if cfg.verify.method in ("signature", "none") and self.similarity == "jaccard" and lacking:
            raise IndexMismatchError(
                f"--verify {cfg.verify.method} {'compares' if cfg.verify.method == 'signature' else 'scores pairs by'} "
                f"MinHash signatures, but the index in {str(self.path)!r} stores none "
                f"for {', '.join(lacking)} (written by runs with verify.method exact, which keep the normalized "
                "texts instead); run with --verify exact (the default, which compares the texts), or build the index "
                "with --verify signature")
        if cfg.similarity != self.similarity:
            raise IndexMismatchError(
                f"the index in {str(self.path)!r} was built with similarity {self.similarity!r} "
                f"({'random-projection signatures' if self.similarity == 'cosine' else 'MinHash signatures'}); this "
                f"run uses similarity {cfg.similarity!r}, whose signatures cannot be compared with them: run with "
                f"--similarity {self.similarity}, or build a {cfg.similarity} index")
        layout = (theirs["bands"], theirs["rows"]) if self.similarity == "cosine" else None
        if cfg.similarity == "cosine" and (cfg.cosine.bands, cfg.cosine.rows) not in ((None, None), layout):
            layout = (cfg.cosine.bands, cfg.cosine.rows)  # given explicitly: must be the index's
        unchecked: list[str] = []  # settings an index written before they were recorded cannot be checked for
        split = self._split_chains_differs(cfg, unchecked)
        threshold = self._threshold_differs(cfg, unchecked)
        recorded = self._recorded_differ(cfg, unchecked)
        if unchecked:
            log.warning("the index in %s was written by an earlier gpu_dedup and does not record %s, so this run's "
                        "value%s cannot be checked against the runs that built it: make sure %s theirs (a run with "
                        "another value decides its documents by another rule). The next run that appends to the "
                        "index records %s, and later runs must match", self.path, _listed(unchecked),
                        "s" if len(unchecked) > 1 else "", "they are" if len(unchecked) > 1 else "it is",
                        "them" if len(unchecked) > 1 else "it")
        if index_fingerprint(cfg, layout) == self.manifest["fingerprint"]:
            if threshold or split or recorded:  # whatever the layout: one given, or one both thresholds derive
                found = [x for x in (threshold, split, *recorded) if x is not None]
                diffs, why, fixes = ([x[k] for x in found] for k in range(3))
                raise IndexMismatchError(
                    f"the config does not match the index in {str(self.path)!r} ({'; '.join(diffs)}): "
                    f"{'; and '.join(why)}; rerun with {' '.join(fixes)} (the index's "
                    f"value{'s' if len(fixes) > 1 else ''}), or build a new index with this run's "
                    "(--index-out NEW_INDEX_DIR)")
            return
        mine = index_config(cfg, layout)
        diffs = []
        for section in ("normalize", "minhash", "cosine"):
            for k, v in theirs.get(section, {}).items():
                if mine.get(section, {}).get(k) != v:
                    diffs.append(f"{section}.{k}: index {v!r}, this run {mine.get(section, {}).get(k)!r}")
        if mine.get("source") != theirs.get("source"):
            diffs.append(f"vectors from: index {theirs.get('source')}, this run {mine.get('source')} "
                         "(input.vector_column)")
        prefix = "cosine" if self.similarity == "cosine" else "lsh"
        layout_differs = any(mine[k] != theirs[k] for k in ("bands", "rows"))
        derived = (layout_differs and prefix == "lsh" and cfg.lsh.bands is None and cfg.lsh.rows is None
                   and "threshold" in self.manifest and cfg.lsh.threshold != self.manifest["threshold"])
        if threshold:
            diffs.append(threshold[0] + (", from which this run derives its lsh.bands and lsh.rows"
                                         if derived and threshold[0].startswith("lsh.threshold") else ""))
        elif derived:  # the run's (bands, rows) were derived from its threshold: name the setting the user changed
            diffs.append(f"lsh.threshold: index {self.manifest['threshold']!r}, this run {cfg.lsh.threshold!r}, "
                         "from which this run derives its lsh.bands and lsh.rows")
        for k in ("bands", "rows"):
            if mine[k] != theirs[k]:
                diffs.append(f"{prefix}.{k}: index {theirs[k]}, this run {mine[k]}")
        if split:
            diffs.append(split[0])
        diffs += [what for what, _, _ in recorded]
        raise IndexMismatchError(
            f"the config does not match the index in {str(self.path)!r} ({'; '.join(diffs)}); "
            f"run with the index's settings (`gpu-dedup index info {self.path}` prints them) or build a new index"
        )

    def _threshold_differs(self, cfg: Config, unchecked: list) -> tuple[str, str, str] | None:
        """(what differs, why it matters, the fix) when the run would verify (remove) at another threshold than
        the index's documents were: its ``verify_threshold`` (the runs' verify.threshold, or their lsh.threshold).
        Checked whatever the layout: with lsh.bands and lsh.rows given (or a threshold that derives the index's
        layout), the fingerprint is the index's and only this check tells them apart.

        An index that records none (written before it was recorded) stands for it by its lsh.threshold, and its
        next append records the run's.  Its documents may have been verified at a verify.threshold it could not
        record: a run that gives one, with the index's lsh.threshold (the one value it records), is taken at its
        word (it goes to ``unchecked``: one warning), as an unrecorded split_chains is; with another lsh.threshold
        nothing vouches for it, and the refusal names lsh.threshold."""
        m = self.manifest
        if VERIFY_THRESHOLD in m:
            theirs = m[VERIFY_THRESHOLD]
        elif "threshold" in m:
            theirs = m["threshold"]
            self._verify_threshold = cfg.verify_threshold  # what an append records once the check passed
            given = cfg.verify.threshold
            if given is not None and given != theirs:
                if cfg.lsh.threshold == theirs:
                    unchecked.append(f"verify.threshold ({given})")
                    return None
                return (f"lsh.threshold: index {theirs!r}, this run {cfg.lsh.threshold!r}",
                        f"the index was written before gpu_dedup recorded the verify threshold, so only its "
                        f"lsh.threshold ({theirs}) says how its documents were removed, and this run's "
                        f"verify.threshold {given} can be taken for theirs only with that lsh.threshold",
                        f"--threshold {theirs}")
        else:  # pragma: no cover - every index written since the threshold was recorded says it
            return None
        mine = cfg.verify_threshold
        if mine == theirs:
            return None
        lsh = cfg.verify.threshold is None and theirs == m.get("threshold")  # both the runs' lsh.threshold
        what = (f"lsh.threshold: index {theirs!r}, this run {mine!r}" if lsh else
                f"verify threshold: index {theirs!r}, this run {mine!r} "
                f"({'verify.threshold' if cfg.verify.threshold is not None else 'lsh.threshold'})")
        why = (f"the index's documents were removed at similarity {theirs} or above to their survivor, and this "
               f"run's would be removed at {mine}, so together they would follow neither threshold")
        fix = f"--threshold {theirs}" if lsh else f"--set verify.threshold={theirs}"
        return what, why, fix

    def _recorded_differ(self, cfg: Config, unchecked: list) -> list:
        """(what differs, why it matters, the fix) for each :data:`RECORDED` setting whose value in the run is not
        the index's.  One the index records none of (written before it was recorded) cannot be checked: it goes
        to ``unchecked`` (one warning names them all), and the next append records the run's value."""
        out = []
        for key, (dotted, _) in RECORDED.items():
            mine = _setting(cfg, dotted)
            if key not in self.manifest:
                self._recorded[key] = mine
                unchecked.append(f"{dotted} ({mine})")
                continue
            theirs = self.manifest[key]
            if theirs != mine:
                out.append((f"{dotted}: index {theirs}, this run {mine}",
                            f"the index's documents were decided with {dotted} {theirs}, and this run's would be with "
                            f"{mine}, which {_RECORDED_WHY[key]}, so together they would follow neither",
                            f"--set {dotted}={theirs}"))
        return out

    def _split_chains_differs(self, cfg: Config, unchecked: list) -> tuple[str, str, str] | None:
        """(``select.split_chains: index X, this run Y``, why it matters, the fix) when the run's value is not
        the one the index records.
        An index that records none (written before it was recorded) cannot be checked: it goes to ``unchecked`` (one warning), and
        the next append records the run's value (:meth:`append_segments`)."""
        mine = cfg.select.split_chains
        if SPLIT_CHAINS not in self.manifest:
            self._split_chains = mine
            unchecked.append(f"select.split_chains ({_yaml(mine)})")
            return None
        theirs = self.manifest[SPLIT_CHAINS]
        if theirs == mine:
            return None
        return (f"select.split_chains: index {_yaml(theirs)}, this run {_yaml(mine)}",
                f"the index's documents were removed {_split_rule(theirs)}, and this run's would be removed "
                f"{_split_rule(mine)}, so together they would follow neither rule",
                f"--set select.split_chains={_yaml(theirs)}")

    def config(self, base: Config = Config()) -> Config:
        """``base`` with the index's settings: normalize, minhash and (bands, rows); for a cosine
        index its similarity, cosine settings and (bands, rows)."""
        c = self.manifest["config"]
        d = base.to_dict()
        if "threshold" in self.manifest and base == Config():  # the threshold the index was built with
            d["lsh"]["threshold"] = self.manifest["threshold"]
            if self.manifest.get(VERIFY_THRESHOLD, self.manifest["threshold"]) != self.manifest["threshold"]:
                d["verify"]["threshold"] = self.manifest[VERIFY_THRESHOLD]  # and the one it verified at
        if SPLIT_CHAINS in self.manifest and base == Config():  # how its chains were decided
            d["select"]["split_chains"] = self.manifest[SPLIT_CHAINS]
        for key, (dotted, _) in RECORDED.items():  # and its other recorded settings
            if key in self.manifest and base == Config():
                section, name = dotted.split(".")
                d[section][name] = self.manifest[key]
        if self.similarity == "cosine":
            d["similarity"] = "cosine"
            d["cosine"].update(c["cosine"], bands=c["bands"], rows=c["rows"])
            if "normalize" in c:
                d["normalize"] = c["normalize"]
            if c["source"] == "vectors" and not d["input"]["vector_column"]:
                d["input"]["vector_column"] = "vector"
            elif c["source"] == "text":
                d["input"]["vector_column"] = None
            return Config.from_dict(d)
        d["normalize"], d["minhash"] = c["normalize"], c["minhash"]
        d["lsh"]["bands"], d["lsh"]["rows"] = c["bands"], c["rows"]
        return Config.from_dict(d)

    def pinned(self, cfg: Config) -> Config:
        """``cfg`` with the index's (bands, rows) for a cosine index (a run derives them from its own
        number of rows otherwise); ``cfg`` itself for a Jaccard index."""
        if self.similarity != "cosine" or cfg.similarity != "cosine":
            return cfg
        c = self.manifest["config"]
        return cfg.with_overrides({"cosine.bands": c["bands"], "cosine.rows": c["rows"]})

    @property
    def documents(self) -> int:
        return int(self.manifest["documents"])

    @property
    def id_column(self) -> str | None:
        """The input column the indexed documents' ids came from; None: they have none (generated row
        numbers, equal to ``row``).  Indexes written before this was recorded say ``id``."""
        return self.manifest.get("id_column", "id")

    def __len__(self) -> int:
        return self.documents

    # ---- lookups --------------------------------------------------------------
    def _column(self, name: str, docs: np.ndarray):
        """Values of a docs column for index doc numbers ``docs`` (any order)."""
        docs = np.asarray(docs, np.int64)
        if not self.segments or docs.shape[0] == 0:
            kind = self.segments[0].docs.schema.field(name).type if self.segments else pa.int64()
            return pa.array([], kind)
        chunks, starts = [], []
        for s in self.segments:  # every Arrow chunk of every segment, with its first doc number
            col = s.docs.column(name)
            for c, off in zip(col.chunks, np.cumsum([0] + [len(c) for c in col.chunks])):
                chunks.append(c)
                starts.append(s.first_doc + int(off))
        return _take(chunks, np.asarray(starts, np.int64), docs)

    def texts(self, docs) -> pa.Array:
        return self._column("text", docs)

    def ids(self, docs):
        return self._column("id", docs)

    def survivors(self, docs) -> np.ndarray:
        return np.asarray(self._column("survivor", docs))

    def kept(self, docs) -> np.ndarray:
        return np.asarray(self._column("kept", docs))

    def signatures(self, docs) -> np.ndarray:
        col = self._column("signature", docs)
        return np.asarray(col.flatten()).reshape(len(col), -1)

    def vectors(self, docs) -> Vectors:
        """The vectors of indexed documents (a cosine index built from a vector column).

        A segment whose vectors have no direction (null vectors only) stores zeros of the width its run took (1
        when nothing gave it a dimension): when a later segment holds real vectors, that segment's rows read as
        zeros of the index's dimension (:meth:`_vector_dim`), what they are."""
        docs = np.asarray(docs, np.int64)
        widths = {s.docs.schema.field("vector").type.list_size for s in self.segments}
        if len(widths) <= 1:
            col = self._column("vector", docs)
            m = np.asarray(col.flatten(), np.float32).reshape(len(col), widths.pop() if widths else 1)  # 0 docs too
            return Vectors(m, np.zeros(m.shape[0], np.int8))
        dim = self._vector_dim()
        m = np.zeros((docs.shape[0], dim or 1), np.float32)
        firsts = np.array([s.first_doc for s in self.segments], np.int64)
        which = np.searchsorted(firsts, docs, side="right") - 1
        for k in np.unique(which):  # one take per segment touched
            seg, sel = self.segments[k], np.flatnonzero(which == k)
            col = seg.docs.column("vector")
            part = _take(list(col.chunks), np.cumsum([seg.first_doc] + [len(c) for c in col.chunks])[:-1],
                         docs[sel])
            values = np.asarray(part.flatten(), np.float32).reshape(sel.shape[0], -1)
            if values.shape[1] == m.shape[1]:
                m[sel] = values
            elif values.any():  # two dimensions of real vectors: no write path makes this
                raise IndexDamaged(f"the index in {str(self.path)!r} holds vectors of {values.shape[1]} and of "
                                   f"{dim} dimensions (segment {k}); rebuild it from its corpus (gpu-dedup index "
                                   "build CORPUS -o NEW_INDEX_DIR)", "vectors of two dimensions")
        return Vectors(m, np.zeros(m.shape[0], np.int8))

    def exact_matches(self, keys: np.ndarray) -> np.ndarray:
        """Index doc with each key (len, h1, h2), or -1: the kept one (the survivor of the others,
        whatever the keep policy) where one is kept, else the smallest."""
        import pandas as pd  # only runs against an index use it: a plain run does not import pandas

        out = np.full(keys.shape[0], -1, np.int64)
        if not self.segments or keys.shape[0] == 0:
            return out
        if self._keys is None:
            frame = pd.concat([pd.DataFrame({
                "l": np.asarray(s.docs.column("key_len")), "a": np.asarray(s.docs.column("key_h1")),
                "b": np.asarray(s.docs.column("key_h2")), "doc": np.asarray(s.docs.column("doc")),
                "removed": ~np.asarray(s.docs.column("kept"), bool)})
                for s in self.segments])
            first = frame.sort_values(["removed", "doc"], kind="stable").drop_duplicates(["l", "a", "b"])
            self._keys = first.set_index(["l", "a", "b"])["doc"]

        idx = pd.MultiIndex.from_arrays([keys[:, 0], keys[:, 1], keys[:, 2]], names=["l", "a", "b"])
        found = self._keys.reindex(idx)
        hit = found.notna().to_numpy() & (keys[:, 0] != NO_KEY)  # rows without a direction match nothing
        out[hit] = found.to_numpy()[hit].astype(np.int64)
        return out

    @staticmethod
    def _ranges(band_start, sorted_hash, band, hashes):
        """[pos, end) of each (band, hash) query in a segment's (band, hash)-sorted arrays."""
        pos = np.empty(band.shape[0], np.int64)
        end = np.empty(band.shape[0], np.int64)
        for b in np.unique(band):  # one searchsorted per band
            sel = np.flatnonzero(band == b)
            lo, hi = band_start[b], band_start[b + 1]
            seg_h = sorted_hash[lo:hi]
            pos[sel] = np.searchsorted(seg_h, hashes[sel], side="left") + lo
            end[sel] = np.searchsorted(seg_h, hashes[sel], side="right") + lo
        return pos, end

    @staticmethod
    def _expand(pos, count):
        """(query, position) for ``count[q]`` consecutive positions from ``pos[q]``."""
        hit = np.flatnonzero(count > 0)
        reps = count[hit]
        q = np.repeat(hit, reps)
        within = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        return q, pos[q] + within

    def bucket_members(self, band: np.ndarray, hashes: np.ndarray, limit: int = 1):
        """For each (band, hash) query: up to ``limit`` index docs of that bucket, smallest first.

        Returns (query position, doc) arrays.  ``limit=1`` gives the bucket's
        first document, the centre a full dedup would connect to.
        """
        qs, ds = [], []
        for s in self.segments:  # one vectorised lookup per segment
            pos, end = self._ranges(s.band_start, s.band_hash, band, hashes)
            q, at = self._expand(pos, np.minimum(end - pos, limit))
            qs.append(q)
            ds.append(s.band_doc[at])
        if not qs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        q, d = np.concatenate(qs), np.concatenate(ds)
        # keep the `limit` smallest docs per query across segments
        order = np.lexsort((d, q))
        q, d = q[order], d[order]
        first = np.r_[0, np.flatnonzero(np.diff(q)) + 1]
        rank = np.arange(q.shape[0]) - np.repeat(first, np.diff(np.r_[first, q.shape[0]]))
        keep = rank < limit
        return q[keep], d[keep]

    def bucket_centres(self, band: np.ndarray, hashes: np.ndarray):
        """The centre sequence of each (band, hash) bucket: (query position, round, doc).

        Round 0 is the bucket's smallest indexed document; later rounds come
        from the segments' centre records (see the module docstring).
        """
        q0, d0 = self.bucket_members(band, hashes, limit=1)
        qs, rs, ds = [q0], [np.zeros(q0.shape[0], np.int64)], [d0]
        for s in self.segments:
            pos, end = self._ranges(s.centre_start, s.centre_hash, band, hashes)
            q, at = self._expand(pos, end - pos)
            qs.append(q)
            rs.append(s.centre_round[at].astype(np.int64))
            ds.append(s.centre_doc[at])
        return np.concatenate(qs), np.concatenate(rs), np.concatenate(ds)

    # ---- writing --------------------------------------------------------------
    def append(self, *, ids, kept, survivor, keys, texts, band_docs, band_hashes, centres, signatures=None,
               vectors=None, layout=None) -> int:
        """Add documents as a new segment; ``survivor``, ``band_docs`` and the centres' docs are index
        doc numbers; ``centres`` = (band, hash, round, doc) arrays of rounds >= 1; ``vectors``: the
        (n, d) float32 vectors (a cosine index of a vector column); ``layout``: the run's (bands, rows).

        Returns the doc number of the first added document.
        """
        payload = {"ids": ids, "kept": kept, "survivor": survivor, "keys": keys, "texts": texts,
                   "band_docs": band_docs, "band_hashes": band_hashes, "centres": centres, "signatures": signatures,
                   "vectors": vectors}

        def write(plan, writer):  # this process writes the one segment
            return [writer(plan[0], bands=self.manifest["config"]["bands"], id_type=self.id_type, **payload)]

        return self.append_segments([len(ids)], write, layout)

    def append_segments(self, counts: list, write, layout=None) -> int:
        """Add ``len(counts)`` segments of ``counts[k]`` documents each, published by one manifest write: what a
        cluster run appends (one segment per block, written by the worker holding the block).

        ``write(plan, publish_segment)`` writes them: ``plan[k]`` is a dict of ``name``, ``tmp`` (the directory
        to write the files in), ``dir`` (where to rename it once whole) and ``first`` (its first doc number);
        ``publish_segment(plan[k], **columns)`` writes one (handed over so that an executor need not import the
        index); it returns each segment's checksums, in order.  As with :meth:`append`, a run killed before the
        manifest leaves only unlisted segments (replaced by the next append), and every segment records this
        append's ``source``.  Returns the doc number of the first added document."""
        if not self._locked:
            with self.writing():
                return self.append_segments(counts, write, layout)
        on_disk = _on_disk(self.path)
        if on_disk != _state(self.manifest):
            raise OutputError(
                f"the index in {str(self.path)!r} changed since this process opened it (another writer appended: "
                f"{on_disk[1]} documents now, {self.documents} when opened), and these documents were deduplicated "
                "against the earlier state; nothing was appended: open the index again and rerun")
        c = self.manifest["config"]
        if layout is not None and tuple(layout) != (c["bands"], c["rows"]):  # pragma: no cover - runs pin it
            raise RuntimeError(f"run layout {tuple(layout)} differs from the index's {(c['bands'], c['rows'])}")
        k0 = len(self.manifest["segments"])
        if k0 + len(counts) > MAX_SEGMENTS:
            raise OutputError(
                f"appending {len(counts)} segments (one per block) to the index in {str(self.path)!r}, which holds "
                f"{k0}, would pass the {MAX_SEGMENTS} segments an index can hold; raise cluster.block_rows (fewer, "
                "larger blocks), or rebuild the index from its corpus into fewer segments")
        first = self.documents
        names = [segment_name(k0 + k) for k in range(len(counts))]
        starts = first + np.concatenate(([0], np.cumsum(np.asarray(counts, np.int64)))).astype(np.int64)
        plan = [{"name": name, "tmp": str(self.path / f".{name}.tmp"), "dir": str(self.path / name),
                 "first": int(starts[k])} for k, name in enumerate(names)]
        for p in plan:
            self._discard_unlisted(p["name"])
            shutil.rmtree(p["tmp"], ignore_errors=True)
        try:
            sums = list(write(plan, publish_segment))
        except BaseException:  # no segment of a failed append is left behind
            for p in plan:
                shutil.rmtree(p["tmp"], ignore_errors=True)
                shutil.rmtree(p["dir"], ignore_errors=True)
            raise
        manifest = dict(self.manifest)
        manifest["segments"] = list(self.manifest["segments"]) + names
        manifest["documents"] = int(starts[-1])
        manifest[CHECKSUMS] = {**self.manifest.get(CHECKSUMS, {}), **dict(zip(names, sums))}
        if SPLIT_CHAINS not in manifest and self._split_chains is not None:  # an index that recorded none
            manifest[SPLIT_CHAINS] = self._split_chains
        if VERIFY_THRESHOLD not in manifest and self._verify_threshold is not None:  # likewise
            manifest[VERIFY_THRESHOLD] = self._verify_threshold
        for key, value in self._recorded.items():  # likewise
            manifest.setdefault(key, value)
        if self.source is not None:
            manifest[SOURCES] = {**self.manifest.get(SOURCES, {}), **{name: self.source for name in names}}
        manifest.pop(MANIFEST_DIGEST, None)
        if k0:
            manifest["updated"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._staged = {"manifest": manifest, "names": names, "first": first, "plan": plan}
        if not self._hold:
            self.publish_staged()
        return first

    # ---- an append in two steps: the segments before a run's outputs are published, the manifest after
    def hold(self) -> None:
        """Let the next appends write their segments (the bulk of an append, where a full disk shows) but not
        the manifest that makes them part of the index: :meth:`publish_staged` writes it, and
        :meth:`discard_staged` drops the segments.  A run publishes its outputs between the two, so that the
        one step that can fail after its outputs are published is a manifest write."""
        self._hold = True

    def publish_staged(self) -> None:
        """Write the manifest of the held append (if any): its segments become part of the index."""
        staged, self._staged = self._staged, None
        self._hold = False
        if staged is None:
            return
        manifest, names, first = staged["manifest"], staged["names"], staged["first"]
        try:
            for p in staged["plan"]:  # whole segments under their names, then the manifest that lists them
                os.replace(p["tmp"], p["dir"])
            if staged["plan"]:
                sync_dir(self.path)  # the segments' renames on the disk before the manifest names them
            maybe_crash("index:before-manifest")
            self._write_manifest(self.path, manifest)
        except BaseException:
            self._staged = staged  # still discardable
            raise
        self.manifest = sealed(manifest)
        maybe_crash("index:after-append")
        self._segments, self._unloaded = self.segments, (names, first)  # mapped when first used (not by a cluster run)
        self._keys = None
        self.source = None

    def discard_staged(self) -> None:
        """Drop the segments of a held append that will not be published (its run failed before its commit)."""
        staged, self._staged = self._staged, None
        self._hold = False
        for p in staged["plan"] if staged else ():
            shutil.rmtree(p["tmp"], ignore_errors=True)
            if p["name"] not in self.manifest["segments"]:
                shutil.rmtree(p["dir"], ignore_errors=True)

    def appended_from(self, source: str) -> str | None:
        """The first segment an earlier append of the same inputs and config (``source``: their run fingerprint)
        wrote, or None (an append of several segments records its source with each)."""
        sources = self.manifest.get(SOURCES, {})
        for name in self.manifest["segments"]:
            if sources.get(name) == source:
                return name
        return None

    def before(self, name: str) -> "Index":
        """The index as it was before segment ``name`` was appended (read-only)."""
        k = self.manifest["segments"].index(name)
        manifest = {**self.manifest, "segments": self.manifest["segments"][:k],
                    "documents": sum(s.n for s in self.segments[:k])}
        return Index(self.path, manifest, self.segments[:k])

    def _discard_unlisted(self, name: str) -> None:
        """Remove segment ``name`` when it exists but the manifest does not list it: what an append killed
        between renaming its segment into place and writing the manifest leaves (never visible to readers).
        Anything there but a segment of this index's files is refused, not deleted."""
        seg = self.path / name
        if not os.path.lexists(seg) or name in self.manifest["segments"]:
            return
        if not seg.is_dir() or seg.is_symlink() or not set(os.listdir(seg)) <= set(SEGMENT_FILES):
            raise OutputError(f"{str(seg)!r} is in the index directory {str(self.path)!r} but is not a segment it "
                              "lists, and the next segment would be written there; move it out of the index directory")
        log.warning("removing %s: a segment an interrupted append left unlisted in the index manifest", seg)
        shutil.rmtree(seg)

    def add(self, frame, text: str | None = None, id: str | None = None, config=None, **overrides) -> AddResult:
        """Deduplicate the rows of ``frame`` against the index, then append all of them (see
        :func:`gpu_dedup.index.add.add`)."""
        return add(self, frame, text, id, config, **overrides)

    def info(self) -> dict:
        size = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return {"path": str(self.path), "documents": self.documents, "id_column": self.id_column,
                "segments": len(self.segments),
                "bytes": size, "kept": int(sum(pc.sum(s.docs.column("kept")).as_py() or 0 for s in self.segments)),
                "fingerprint": self.manifest["fingerprint"], "config": self.manifest["config"],
                "threshold": self.manifest.get("threshold"),
                "verify_threshold": self.manifest.get(VERIFY_THRESHOLD, self.manifest.get("threshold")),
                "split_chains": self.manifest.get(SPLIT_CHAINS),
                **{key: self.manifest.get(key) for key in RECORDED}}

    # ---- online use ---------------------------------------------------------
    def query(self, texts=None, threshold: float | None = None, members: int = 8, backend="cpu",
              vectors=None) -> pa.Table:
        """Indexed documents similar to each query (see :func:`gpu_dedup.index.query.query`)."""
        return query(self, texts, threshold, members, backend, vectors)

    def _vector_dim(self) -> int | None:
        """The indexed vectors' dimension: the first segment's that holds a vector with a direction (a segment
        of null, zero or unusable vectors only stores zeros, of the width its run happened to take); None when
        no segment holds one."""
        for seg in self.segments:  # the first segment with a vector says (usually the first)
            col = seg.docs.column("vector")
            for chunk in col.chunks:
                flat = np.asarray(chunk.flatten())
                if flat[:1 << 16].any() or flat.any():  # the first vectors usually say, without a whole scan
                    return col.type.list_size
        return None


def _listdir(p: Path) -> list:
    try:
        return os.listdir(p)
    except OSError:
        return []


class IndexDamaged(InputError):
    """An index whose files do not verify: ``what`` says which and how."""

    def __init__(self, message: str, what: str):
        super().__init__(message)
        self.what = what


def _damaged(p: Path, exc: BaseException) -> InputError:
    what = f"missing {exc}" if isinstance(exc, KeyError) else (str(exc).splitlines() or [type(exc).__name__])[0]
    return IndexDamaged(f"the index in {str(p)!r} is damaged ({what}); restore it from a backup or rebuild it "
                        "from its corpus (gpu-dedup index build CORPUS -o NEW_INDEX_DIR)", what)


def _lock_index(p: Path) -> int:
    return take_lock(p / LOCK, lambda holder: (
        f"the index in {str(p)!r} is being written by another gpu-dedup run ({holder}); one run at a time may "
        "append to an index or build it: wait for that run to finish, then rerun (it deduplicates against what "
        "the other run added)"))


def _state(manifest: dict) -> tuple:
    """What identifies an index's contents: its segments and document count."""
    return tuple(manifest.get("segments", ())), manifest.get("documents", 0)


def _on_disk(p: Path) -> tuple:
    """:func:`_state` of the manifest in ``p`` now (no manifest: an index not written yet)."""
    try:
        return _state(json.loads((p / MANIFEST).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return (), 0
    except (OSError, ValueError, AttributeError):
        return ("unreadable",), -1


def _take(chunks: list, starts: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Rows ``rows`` (any order) of the Arrow arrays ``chunks``, chunk k holding rows
    ``starts[k]`` onwards: one take per chunk touched.  (Arrow's ChunkedArray.take
    concatenates every chunk first, which made one query copy a whole segment's texts.)"""
    which = np.searchsorted(starts, rows, side="right") - 1
    parts, order = [], []
    for k in np.unique(which):  # one take per chunk touched
        sel = np.flatnonzero(which == k)
        parts.append(chunks[k].take(pa.array(rows[sel] - starts[k], pa.int64())))
        order.append(sel)
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[np.concatenate(order)] = np.arange(rows.shape[0])
    return pa.concat_arrays(parts).take(pa.array(inverse))



def publish_segment(plan: dict, **columns) -> dict:
    """Segment ``plan["first"]..`` (see :meth:`Index.append_segments`) written whole in ``plan["tmp"]`` by
    :func:`write_segment` (renamed to ``plan["dir"]`` when the append publishes it); nothing is left of it when
    a write fails (a full disk).  Returns its files' checksums."""
    tmp = Path(plan["tmp"])
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        sums = write_segment(tmp, plan["first"], **columns)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sums


def write_segment(directory: Path, first: int, *, ids, kept, survivor, keys, texts, band_docs, band_hashes, centres,
                  signatures=None, vectors=None, bands: int, id_type=None) -> dict:
    """Write one segment's files (docs ``first ..``, see the module docstring) into ``directory`` (which exists);
    ``id_type``: the index's id type (None: these ids name it).  Returns each file's size and SHA-256.  The one
    segment of a one-process append, and each block's segment of a cluster append (written by its worker)."""
    n = len(ids)
    if texts is None:
        texts = pa.nulls(n, pa.large_string())
    cols = {
        "doc": pa.array(np.arange(first, first + n, dtype=np.int64)),
        "id": ids,
        "kept": pa.array(np.asarray(kept, bool)),
        "survivor": pa.array(np.asarray(survivor, np.int64)),
        "key_len": pa.array(keys[:, 0]),
        "key_h1": pa.array(keys[:, 1]),
        "key_h2": pa.array(keys[:, 2]),
        "text": pc.cast(texts, pa.large_string()),
    }
    if signatures is not None:
        cols["signature"] = pa.FixedSizeListArray.from_arrays(pa.array(signatures.ravel()), signatures.shape[1])
    if vectors is not None:
        m = np.ascontiguousarray(vectors, np.float32)
        cols["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(m.ravel()), m.shape[1])
    want = cols["id"].type if id_type is None else id_type
    if cols["id"].type != want and same_kind(cols["id"].type, want):  # e.g. large_string from pandas
        try:
            cols["id"] = pc.cast(cols["id"], want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # does not fit: reported below
    if cols["id"].type != want:
        raise InputError(f"ids of type {cols['id'].type} cannot join an index whose ids are {want}; use the same id "
                         "column type")
    band = np.tile(np.arange(bands, dtype=np.int32), band_docs.shape[0])
    doc = np.repeat(np.asarray(band_docs, np.int64), bands)
    h = np.asarray(band_hashes, np.uint64).ravel()
    order = np.lexsort((doc, h, band))
    write_ipc(directory / "docs.arrow", pa.table(cols))
    write_ipc(directory / "bands.arrow", pa.table({"band": band[order], "hash": h[order], "doc": doc[order]}))
    cb, ch, cr, cd = (np.asarray(x) for x in centres)
    corder = np.lexsort((cd, cr, ch, cb))
    write_ipc(directory / "centers.arrow", pa.table({
        "band": pa.array(cb[corder].astype(np.int32)), "hash": pa.array(ch[corder].astype(np.uint64)),
        "round": pa.array(cr[corder].astype(np.int32)), "doc": pa.array(cd[corder].astype(np.int64))}))
    for f in SEGMENT_FILES:  # on the disk before the manifest that names them is
        sync_file(directory / f)
    sync_dir(directory)  # and the folder's entries
    return {f: file_digest(directory / f) for f in SEGMENT_FILES}


def _setting(cfg: Config, dotted: str):
    """The value of setting ``dotted`` (``lsh.star_rounds``) in ``cfg``."""
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


_RECORDED_WHY = {  # what another value of each RECORDED setting changes
    "star_rounds": "finds other candidates (the index replays the centres its own rounds chose)",
    "verify_method": "estimates the similarity another way",
}


def _listed(names: list) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _yaml(value: bool) -> str:
    return "true" if value else "false"


def _split_rule(split: bool) -> str:
    """How documents are removed under ``select.split_chains = split``."""
    return ("with chains split (each at or above the threshold to its survivor)" if split else
            "by plain connected components (chains remove documents below the threshold)")


class IndexBuilder:
    """The sink of ``run --index-out DIR``: creates the index at ``path`` when the run hands it its
    documents.  A context manager: entering it takes the index directory's lock (a second build of the
    same directory stops with exit 4); leaving it without a complete append leaves no index behind."""

    def __init__(self, path, cfg: Config):
        self.path = Path(path)
        self.cfg = cfg
        check_indexable(cfg)
        check_output_path(self.path, None, "", "index directory", "--index-out (index build -o)")
        self._check_empty()
        self.index = None
        self.source = None  # recorded with the segment (see Index.appended_from)
        self._fd = None
        self._created = False

    def _check_empty(self) -> None:
        """Refuse a directory holding an index or anything a build would overwrite; a segment a killed build
        left without a manifest (only segment files in it) is its own and is replaced."""
        p = self.path
        if (p / MANIFEST).exists():
            if is_index_manifest(p / MANIFEST):
                raise InputError(f"an index already exists in {str(p)!r}; open it with --against "
                                 "(and --update-index), or remove it to build a new one")
            raise OutputError(f"{str(p / MANIFEST)!r} is not a gpu_dedup index manifest, and building an index in "
                              f"{str(p)!r} would overwrite it; choose a new or empty directory for the index")
        for name in _segment_entries(p):
            if not _leftover_segment(p / name):
                raise OutputError(f"{str(p / name)!r} exists, and building an index in {str(p)!r} would overwrite "
                                  "it; choose a new or empty directory for the index")
        if any((p / name).exists() for name in (SUCCESS_NAME, OUTPUT_MANIFEST)):  # a run's outputs
            raise OutputError(f"index directory {str(p)!r} holds a run's outputs (its {SUCCESS_NAME}); an index beside "
                              "them would make both unreadable: choose another --index-out (index build -o)")

    def __enter__(self) -> "IndexBuilder":
        p = self.path
        if not p.exists():
            try:
                p.mkdir(parents=True)
                self._created = True
            except FileExistsError:
                pass
            except OSError as exc:
                raise OutputError(f"cannot create the index directory {str(p)!r} ({exc.strerror or exc}); choose "
                                  "an --index-out (index build -o) whose parent is a writable directory") from None
        try:
            self._fd = take_lock(p / LOCK, lambda holder: (
                f"the index directory {str(p)!r} is in use by another gpu-dedup run ({holder}); two runs cannot "
                "build one index: wait for it to finish, or choose another directory"))
            self._check_empty()  # again, under the lock: another build may have finished meanwhile
            for name in _segment_entries(p):
                log.warning("removing %s: a segment an interrupted index build left behind", p / name)
                shutil.rmtree(p / name)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.index is None:  # no empty or half-built index is left behind
            self.index = None
            if self._fd is not None:  # only under our lock: what is there is this build's
                (self.path / MANIFEST).unlink(missing_ok=True)
                for name in _segment_entries(self.path):
                    shutil.rmtree(self.path / name, ignore_errors=True)
        if self._fd is not None:
            release_lock(self.path / LOCK, self._fd)
            self._fd = None
        if self._created and self.index is None:
            try:
                self.path.rmdir()
            except OSError:
                pass

    @property
    def documents(self) -> int:
        return 0 if self.index is None else self.index.documents

    id_type = None  # a new index: its first append's ids name the type
    _hold = False

    def hold(self) -> None:
        """As :meth:`Index.hold`: the new index's segments now, its manifest with :meth:`publish_staged`."""
        self._hold = True

    def publish_staged(self) -> None:
        if self.index is not None:
            self.index.publish_staged()

    def discard_staged(self) -> None:
        if self.index is not None:
            self.index.discard_staged()
            self.index = None  # nothing of it is left: leaving the builder removes the directory it made

    def append(self, **payload) -> int:
        """:meth:`Index.append` of the new index (a one-process run's documents, one segment)."""
        return self._into_new(payload.get("layout"), lambda index: index.append(**payload))

    def append_segments(self, counts: list, write, layout=None) -> int:
        """:meth:`Index.append_segments` of the new index (a cluster run's blocks, one segment each)."""
        return self._into_new(layout, lambda index: index.append_segments(counts, write, layout))

    def _into_new(self, layout, add) -> int:
        """``add(index)`` to the index this builder creates, under the builder's lock; its first doc number."""
        if self._fd is None:  # pragma: no cover - run.entry.run_dedup enters the builder
            raise RuntimeError("IndexBuilder appended to outside its with block")
        index = Index.create(self.path, self.cfg, layout)
        index._locked = True  # under this builder's lock
        index.source = self.source
        index._hold = self._hold
        first = add(index)
        index._locked = False
        self.index = index
        return first


def _segment_entries(p: Path) -> list:
    """Segments (``seg-NNNNN``) and their temporary directories (``.seg-NNNNN.tmp``) in ``p``."""
    return sorted(n for n in _listdir(p) if SEGMENT_NAME.fullmatch(n) or (
        n.startswith(".") and n.endswith(".tmp") and SEGMENT_NAME.fullmatch(n[1:-4])))


def _leftover_segment(path: Path) -> bool:
    """A directory holding only segment files: what a build killed before writing its manifest leaves."""
    return path.is_dir() and not path.is_symlink() and set(os.listdir(path)) <= set(SEGMENT_FILES)
