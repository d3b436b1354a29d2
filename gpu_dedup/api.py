"""The DataFrame API: ``gpu_dedup.dedup(frame)`` for notebooks and Python pipelines.

::

    import gpu_dedup
    res = gpu_dedup.dedup(df, text="text", id="url", threshold=0.8)
    res.deduplicated        # df's kept rows: same type, columns, dtypes (and pandas index), input order
    res.duplicates          # one row per member of a cluster of two or more documents
    res.clusters, res.kept  # per input row: the survivor's row, and whether the row is kept
    res.report              # the report.json dict; res.html() is the report.html page

The frame is a pandas DataFrame, a pyarrow Table, a cuDF DataFrame or a Hugging
Face ``datasets.Dataset``; the text (and id / score) columns go to the pipeline
as an in-memory Arrow table (:func:`gpu_dedup.stages.storage.memory_shard`) and
the run writes nothing: no shard, no table, no checkpoint.  A Dataset's columns
are its Arrow table's own buffers (memory-mapped for a dataset on disk): the
text is not copied.  ``deduplicated`` is the input frame filtered by the kept
mask, so every other column comes back untouched (a Dataset: ``select`` of the
kept rows, an indices mapping over the same table).  cuDF and datasets are
never imported unless a frame of theirs is given.
"""

from __future__ import annotations

from gpu_dedup.run.contract import one_process_only
from gpu_dedup.run.dataframes import (
    DedupResult,
    config_of,
    frame_duplicates,
    frame_kind,
    frame_shard,
    like,
    take_rows,
)
from gpu_dedup.run.entry import run_dedup

__all__ = ["DedupResult", "dedup"]


def dedup(frame, text: str | None = None, id: str | None = None, config=None, **overrides) -> DedupResult:
    """Deduplicate the rows of ``frame`` (pandas, pyarrow Table, cuDF or a Hugging Face ``datasets.Dataset``)
    by the column ``text`` (None: the config's ``input.text_column``, ``text`` by default).

    ``id``: a column kept verbatim in ``duplicates`` (under its own name, and
    ``survivor_id``; None: the config's ``input.id_column``, none by default); every document is named by its position in the frame,
    ``row``, either way (``clusters`` holds the survivor's position).  ``config``: a Config, a dict,
    a YAML path or a preset name (``fineweb``); ``overrides``: shortcuts
    (``threshold``, ``num_perm``, ``ngram``, ``shingle``, ``bands``, ``rows``,
    ``verify``, ``keep``, ``score``, ``split_chains``, ``exact_dedup``,
    ``backend``, ``similarity``, ``vector_column``, ``bits``, ...) or dotted keys
    (``**{"lsh.threshold": 0.7}``).  ``similarity="cosine"`` deduplicates by the
    cosine of the embeddings in ``vector_column`` (lists or arrays of floats;
    the text column is then optional), or of tf-idf vectors of the text
    without one.  The run is
    in memory: nothing is written.  Returns a :class:`DedupResult`.
    """
    kind = frame_kind(frame)
    cfg = config_of(config, text, id, overrides, columns_from_config=True)
    text, id = cfg.input.text_column, cfg.input.id_column  # a config's own columns unless text= / id= name others
    if cfg.cluster.enabled:
        raise one_process_only("dedup()", "gpu-dedup run --workers runs shards on a Dask cluster")
    result = run_dedup([frame_shard(frame, kind, text, id, cfg)], None, cfg)

    kept = result.kept
    dup = frame_duplicates(result.duplicates, id)
    return DedupResult(
        deduplicated=take_rows(frame, kind, kept),
        duplicates=like(dup, kind),
        clusters=result.cluster,
        kept=kept,
        report=result.report,
        edges=result.edges,
    )
