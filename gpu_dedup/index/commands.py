"""Runs that build, use or update a persisted index: the stage sequence with a prior and a sink.

``run(..., index_out=DIR)`` also writes a new index of the corpus;
``run(..., against=DIR)`` deduplicates the inputs against an index (indexed
documents always survive) and, with ``update_index=True``, appends them to it.
"""

from __future__ import annotations

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError
from gpu_dedup.index.remote import index_builder, open_index
from gpu_dedup.index.store import Index
from gpu_dedup.run import local
from gpu_dedup.run.outdir import check_output_path
from gpu_dedup.run.sequence import RunResult
from gpu_dedup.storage.filesystems import is_url


def run(inputs, output_dir, cfg: Config = Config(), *, restart: bool = False, index_out=None, against=None,
        update_index: bool = False, write_shards: bool = True) -> RunResult:
    """:func:`gpu_dedup.run.local.run` with an index: ``index_out`` (a path or URL: build a new index of the
    inputs), ``against`` (a path, a URL or an opened :class:`Index`: deduplicate against it) and
    ``update_index`` (append the inputs to ``against``)."""
    if index_out is not None and against is not None:
        raise ConfigError("--index-out builds a new index and --against uses an existing one; give one of them "
                          "(--against DIR --update-index appends to the existing index)")
    if update_index and against is None:
        raise ConfigError("--update-index appends to the index given by --against; add --against DIR")
    if (index_out is not None or against is not None) and cfg.cluster.enabled:
        raise ConfigError("--index-out / --against run in one process for now; drop --workers / --scheduler")
    prior = sink = None
    if against is not None:
        prior = against if isinstance(against, Index) else open_index(against)  # a directory or a URL
        prior.check(cfg)
        cfg = prior.pinned(cfg)  # a cosine index's (bands, rows), not this run's own
        sink = prior if update_index else None
    elif index_out is not None:
        if not is_url(index_out):  # an index in an object store: see gpu_dedup/index/remote.py
            check_output_path(index_out, inputs, "its manifest.json as an input shard", "index directory", "--index-out")
        sink = index_builder(index_out, cfg)
    return local.run(inputs, output_dir, cfg, restart=restart, prior=prior, sink=sink, write_shards=write_shards)
