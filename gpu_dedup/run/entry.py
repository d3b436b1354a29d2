"""The one entry of a run: :func:`run_dedup`, behind ``gpu-dedup run``, ``gpu-dedup index build``,
:func:`gpu_dedup.dedup`, the demo and the evaluation.

It chooses the executor (:func:`gpu_dedup.run.local.run_local` in one process,
:func:`gpu_dedup.run.cluster.run_cluster` with ``cluster.workers`` or
``cluster.scheduler``), and takes the index as an option of the run:
``index_out=DIR`` also writes a new index of the corpus; ``against=DIR``
deduplicates the inputs against an index (indexed documents always survive)
and, with ``update_index=True``, appends them to it.  The index is opened
here and handed to the executor as the run's prior and sink; the executors
never import :mod:`gpu_dedup.index`.  A run that writes an index holds its
lock from start to end: a second writer stops at once (exit 4), so appends
serialize and an index never mixes two runs.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path

from gpu_dedup import storage
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError, OutputError
from gpu_dedup.index.format import SOURCES, is_index_manifest
from gpu_dedup.index.remote import index_builder, open_index
from gpu_dedup.index.store import Index
from gpu_dedup.run.checkpoint import run_fingerprint
from gpu_dedup.run.cluster import run_cluster
from gpu_dedup.run.local import run_local
from gpu_dedup.run.outdir import check_output_path
from gpu_dedup.run.sequence import RunResult
from gpu_dedup.storage.filesystems import is_url

log = logging.getLogger("gpu_dedup")


def run_dedup(inputs, output_dir, cfg: Config = Config(), *, restart: bool = False, index_out=None, against=None,
              update_index: bool = False, write_shards: bool = True) -> RunResult:
    """Deduplicate the shards ``inputs`` into ``output_dir`` (None: in memory, nothing written).

    ``restart``: ignore the checkpoints of an interrupted run and start over; ``index_out`` (a path or URL:
    build a new index of the inputs), ``against`` (a path, a URL or an opened :class:`Index`: deduplicate
    against it) and ``update_index`` (append the inputs to ``against``); ``write_shards=False``: no
    deduplicated shards (``gpu-dedup index build``)."""
    if index_out is not None and against is not None:
        raise ConfigError("--index-out builds a new index and --against uses an existing one; give one of them "
                          "(--against DIR --update-index appends to the existing index)")
    if update_index and against is None:
        raise ConfigError("--update-index appends to the index given by --against; add --against DIR")
    if cfg.layout_warning:  # a preset's layout with another threshold
        log.warning(cfg.layout_warning)
    if cfg.cluster.enabled:
        _check_cluster_index(index_out, against if update_index else None)
    if output_dir is not None and not is_url(output_dir) and is_index_manifest(Path(output_dir) / "manifest.json"):
        raise OutputError(f"output directory {str(output_dir)!r} holds an index (its manifest.json); outputs beside it "
                          "would make both unreadable: choose another -o")
    index_dir = index_out if index_out is not None else (against.path if isinstance(against, Index) else against)
    if index_dir is not None and output_dir is not None and _inside(Path(output_dir), Path(index_dir)):
        raise OutputError(f"the output directory {str(output_dir)!r} is inside the index directory "
                          f"{str(index_dir)!r}, which holds only the index; choose a -o outside it")
    if index_out is None and against is None:  # a plain run
        return _executor(cfg)(inputs, output_dir, cfg, restart=restart, write_shards=write_shards)
    prior = sink = None
    with ExitStack() as held:
        if against is not None:
            prior = against if isinstance(against, Index) else open_index(against)  # a directory or a URL
            if update_index:  # the lock from before matching until the append: the index cannot change between
                held.enter_context(prior.writing())
            prior.check(cfg)
            cfg = prior.pinned(cfg)  # a cosine index's (bands, rows), not this run's own
            _check_id_kind(prior, inputs, cfg, update_index)
            sink = prior if update_index else None
            if update_index:
                source = _source(cfg, inputs)
                done = prior.appended_from(source) if source else None
                if done is None:
                    prior.source = source
                else:  # a rerun of a run killed after its append: the same outputs, no second append
                    log.warning("these inputs were already appended to the index %s (as %s, by a run with the same "
                                "inputs and config, interrupted after its append or run again): deduplicating them "
                                "against the index as it was before, and not appending them again", prior.path, done)
                    prior, sink = prior.before(done), None
        elif index_out is not None:
            source = _source(cfg, inputs)
            if _built_already(index_out, source):  # the same build, killed after its index was published
                log.warning("the index in %s was built from these inputs and config already (by this command, "
                            "interrupted after the index was written, or run again): it is not built again",
                            index_out)
                return _executor(cfg)(inputs, output_dir, cfg, restart=restart, write_shards=write_shards)
            if not is_url(index_out):  # an index in an object store: see gpu_dedup/index/remote.py
                check_output_path(index_out, inputs, "its manifest.json as an input shard", "index directory",
                                  "--index-out")
            sink = held.enter_context(index_builder(index_out, cfg))
            sink.source = source
        return _executor(cfg)(inputs, output_dir, cfg, restart=restart, prior=prior, sink=sink,
                              write_shards=write_shards)


def _executor(cfg: Config):
    """Where the run's data lives: a Dask cluster with ``cluster.workers`` / ``cluster.scheduler``, else this
    process."""
    return run_cluster if cfg.cluster.enabled else run_local


def _check_cluster_index(index_out, updated) -> None:
    """A cluster run's workers write the index's segments into its directory: an index in an object store
    (whose segments a one-process run uploads from a local copy) is refused, naming what to do instead."""
    url = index_out if index_out is not None and is_url(index_out) else None
    if updated is not None:
        remote = getattr(updated, "remote", None)  # an opened index from a URL
        url = remote.url if remote is not None else (str(updated) if is_url(updated) else url)
    if url is not None:
        option = "--index-out" if index_out is not None else "--against ... --update-index"
        raise ConfigError(
            f"{option} {url!r}: a cluster run (--workers / --scheduler) writes an index with its workers, into a "
            "directory every worker sees, not into an object store; write it to a shared directory and copy that "
            "to the store, or run in one process (drop --workers / --scheduler), which uploads the index itself")


def _built_already(index_out, source: str | None) -> bool:
    """Whether ``index_out`` holds an index that a build of these inputs and config wrote whole (every segment
    records ``source``): a build killed between its index's manifest and its end, or the same build run again."""
    if source is None or (not is_url(index_out) and not (Path(index_out) / "manifest.json").exists()):
        return False
    try:
        index = open_index(index_out)
    except (InputError, OSError):  # not an index: the builder says what is there
        return False
    segments, sources = index.manifest.get("segments", []), index.manifest.get(SOURCES, {})
    return bool(segments) and all(sources.get(name) == source for name in segments)


def _source(cfg: Config, inputs) -> str | None:
    """What an append records of its inputs: the run fingerprint of the files and config (None for
    in-memory input)."""
    shards = storage.discover(inputs, cfg.input.format, warn=False)
    if any(s.format == "memory" for s in shards):
        return None
    return run_fingerprint(cfg, shards)


def _check_id_kind(prior: Index, inputs, cfg: Config, update_index: bool = False) -> None:
    """A run against an index names its documents' survivors by the index's ids: ids of another kind (int64
    against an index of strings) are refused before anything runs (the shards' schemas say); so are row numbers
    appended to an index of ids from a column (they would be stored among its ids, nothing telling them apart)."""
    theirs = prior.id_type
    if theirs is None:
        return
    if cfg.input.id_column is None:  # --no-id-column: the documents are named by row number (integers)
        if storage.id_kind(theirs) != "integer" or (update_index and prior.id_column is not None):
            raise InputError(
                f"this run names documents by row number (--no-id-column), but the index in {str(prior.path)!r} "
                f"holds {storage.id_kind(theirs)} ids in column {prior.id_column!r}; a run "
                f"{'appending to' if update_index else 'against'} an index names documents by ids of the index's "
                f"kind: give --id-column with {storage.id_kind(theirs)} ids")
        return
    for shard in storage.discover(inputs, cfg.input.format, warn=False):  # one schema read per shard
        if shard.format == "memory":
            continue
        kind = storage.shard_id_kind(shard, cfg.input.id_column)
        if kind is not None and kind != storage.id_kind(theirs):
            named = (f"in column {prior.id_column!r}" if prior.id_column else
                     "that are row numbers (it was built without an id column)")
            raise InputError(
                f"column {cfg.input.id_column!r} of shard {shard.path!r} holds {kind} ids, but the index in "
                f"{str(prior.path)!r} holds {storage.id_kind(theirs)} ids {named}; a run against an index names "
                "documents by ids of the index's kind: convert them" + (
                    ", choose another --id-column, or use --no-id-column" if prior.id_column is None
                    else " or choose another --id-column"))


def _inside(path: Path, parent: Path) -> bool:
    try:
        path, parent = path.resolve(), parent.resolve()
    except (RuntimeError, OSError):  # a looping link: the output and index checks name it
        return False
    return path == parent or parent in path.parents
