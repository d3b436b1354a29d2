"""``Index.add``: a DataFrame deduplicated against an index, then appended to it."""

from __future__ import annotations

from dataclasses import dataclass

from gpu_dedup.errors import InputError
from gpu_dedup.run import dataframes as frames
from gpu_dedup.run.contract import one_process_only
from gpu_dedup.run.dataframes import DedupResult
from gpu_dedup.run.local import run_local


def add(index, frame, text: str | None = None, id: str | None = None, config=None, **overrides) -> "AddResult":
    """Deduplicate the rows of ``frame`` against the index, then append all of them.

    What ``gpu-dedup run NEW --against INDEX --update-index`` does, for a
    pandas DataFrame, a pyarrow Table or a cuDF DataFrame, with the
    conventions of :func:`gpu_dedup.dedup` (``text``, ``id``, ``config``,
    ``overrides``; ``text`` / ``id`` of None: the config's ``input.text_column`` /
    ``input.id_column``).  Without ``config`` the index's own settings are used;
    a config that changes hashes or matching fails with
    :class:`IndexMismatchError`.  Indexed documents always survive; every
    row is appended, removed ones included.  Returns an :class:`AddResult`.
    """

    kind = frames.frame_kind(frame, "Index.add")
    cfg = frames.config_of(index.config() if config is None else config, text, id, overrides, columns_from_config=True)
    text, id = cfg.input.text_column, cfg.input.id_column  # a config's own columns unless text= / id= name others
    if cfg.cluster.enabled:
        raise one_process_only("Index.add()")
    index.check(cfg)
    cfg = index.pinned(cfg)
    shard = frames.frame_shard(frame, kind, text, id, cfg)
    with index.writing():  # one writer at a time; what another writer appended meanwhile is matched too
        first = index.documents
        if id is None and first and index.id_column is not None:  # row numbers stored among its ids
            raise InputError(f"Index.add() without id= names the rows by number, but the index in "
                             f"{str(index.path)!r} holds ids from column {index.id_column!r}; give id= the frame's "
                             "column of those ids")
        if first == 0:  # the first documents name the index's id column
            index.manifest = {**index.manifest, "id_column": id}
        result = run_local([shard], None, cfg, prior=index, sink=index)
    dup = frames.frame_duplicates(result.duplicates, id)
    return AddResult(deduplicated=frames.take_rows(frame, kind, result.kept), duplicates=frames.like(dup, kind),
                     clusters=result.cluster, kept=result.kept, report=result.report, edges=result.edges,
                     first_doc=first)


@dataclass(repr=False)
class AddResult(DedupResult):
    """What :meth:`Index.add` returns: :class:`gpu_dedup.api.DedupResult`'s fields, in index terms.

    ``kept`` / ``removed``: per row of the frame; ``deduplicated``: the kept
    rows; ``duplicates``: one row per frame row that was removed or has
    copies (``row``: position in the frame, ``cluster_id`` = the survivor's index doc number,
    ``survivor_id`` with an id column, ``in_index``: the survivor is an earlier indexed
    document); ``clusters``: the index doc number of each row's survivor;
    ``edges``: verified edges between index doc numbers.  The frame's rows
    are index documents ``first_doc .. first_doc + len(frame) - 1``.
    """

    first_doc: int = 0

