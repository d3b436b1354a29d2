"""Runs that build, use or update a persisted index: the stage sequence with a prior and a sink.

``run(..., index_out=DIR)`` also writes a new index of the corpus;
``run(..., against=DIR)`` deduplicates the inputs against an index (indexed
documents always survive) and, with ``update_index=True``, appends them to it.
"""

from __future__ import annotations

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError
from gpu_dedup.index.store import Index, IndexBuilder
from gpu_dedup.run import local
from gpu_dedup.run.contract import one_process_only
from gpu_dedup.run.outdir import check_output_path
from gpu_dedup.run.sequence import RunResult


def run(inputs, output_dir, cfg: Config = Config(), *, restart: bool = False, index_out=None, against=None,
        update_index: bool = False, write_shards: bool = True) -> RunResult:
    """:func:`gpu_dedup.run.local.run` with an index: ``index_out`` (a path: build a new index of the
    inputs), ``against`` (a path or an opened :class:`Index`: deduplicate against it) and
    ``update_index`` (append the inputs to ``against``)."""
    if index_out is not None and against is not None:
        raise ConfigError("--index-out builds a new index and --against uses an existing one; give one of them "
                          "(--against DIR --update-index appends to the existing index)")
    if update_index and against is None:
        raise ConfigError("--update-index appends to the index given by --against; add --against DIR")
    if (index_out is not None or update_index) and cfg.cluster.enabled:
        raise one_process_only("writing an index (--index-out, --update-index)")
    prior = sink = None
    if against is not None:
        prior = against if isinstance(against, Index) else Index.open(against)
        prior.check(cfg)
        cfg = prior.pinned(cfg)  # a cosine index's (bands, rows), not this run's own
        sink = prior if update_index else None
    elif index_out is not None:
        check_output_path(index_out, inputs, "its manifest.json as an input shard", "index directory", "--index-out")
        sink = IndexBuilder(index_out, cfg)
    return local.run(inputs, output_dir, cfg, restart=restart, prior=prior, sink=sink, write_shards=write_shards)
