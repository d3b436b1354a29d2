"""A DataFrame as the input of a run, and the run's result in the frame's terms.

What :func:`gpu_dedup.dedup` and :meth:`gpu_dedup.index.Index.add` share: the
config from keyword shortcuts (:func:`config_of`), the frame's text (and id /
score) columns as an in-memory shard (:func:`frame_shard`), the duplicates
table and the kept rows in the frame's own type, and :class:`DedupResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import get_backend
from gpu_dedup.backends.frame_kinds import KINDS, kind_of
from gpu_dedup.backends.strings import is_string_column
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError, OutputError
from gpu_dedup.report.build import summary, write_report
from gpu_dedup.report.page import render, write_html
from gpu_dedup.stages.edges import Edges
from gpu_dedup.stages.write import ROW
from gpu_dedup.storage import Shard, memory_shard, rows_only, without_views

# keyword shortcuts for the most used config keys (any dotted key works too: **{"lsh.threshold": 0.7})
ALIASES = {
    "threshold": "lsh.threshold",
    "bands": "lsh.bands",
    "rows": "lsh.rows",
    "star_rounds": "lsh.star_rounds",
    "num_perm": "minhash.num_perm",
    "ngram": "minhash.ngram",
    "shingle": "minhash.shingle",
    "seed": "minhash.seed",
    "verify": "verify.method",
    "keep": "select.keep",
    "score": "select.score_column",
    "split_chains": "select.split_chains",
    "exact_dedup": "exact_dedup",
    "backend": "backend",
    "similarity": "similarity",
    "vector_column": "input.vector_column",
    "bits": "cosine.bits",
}



@dataclass
class DedupResult:
    """What :func:`dedup` returns; rows and ids refer to positions in the input frame."""

    deduplicated: object  # the kept rows, same type as the input frame
    duplicates: object  # every member of a multi-document cluster (pandas / Arrow / cuDF like the input)
    clusters: np.ndarray  # int64 per input row: the cluster id, i.e. the row of its survivor
    kept: np.ndarray  # bool per input row
    report: dict  # the report.json dict
    edges: Edges  # verified edges between input rows, with their similarity

    @property
    def removed(self) -> np.ndarray:
        return ~self.kept

    def summary(self) -> str:
        return summary(self.report)

    def html(self) -> str:
        """The report.html page of this run (figures embedded)."""
        return render(self.report)

    def save_report(self, directory) -> Path:
        """Write report.json and report.html into ``directory``; returns the HTML path."""
        d = Path(directory)
        if d.exists() and not d.is_dir():
            raise OutputError(f"save_report({str(directory)!r}): the path exists and is not a directory; give a "
                              "directory for report.json and report.html")
        d.mkdir(parents=True, exist_ok=True)
        write_report(d / "report.json", self.report)
        return write_html(d / "report.html", self.report)

    def __repr__(self) -> str:
        c = self.report["counts"]
        return (f"DedupResult(read={c['documents_read']:,}, kept={c['kept']:,}, removed={c['removed']:,} "
                f"(exact {c['exact_duplicates']:,}, near {c['near_duplicates']:,}), clusters={c['clusters']:,})")


def frame_kind(frame, call: str = "dedup") -> str:
    """``pandas``, ``arrow``, ``cudf`` or ``datasets`` (the registered kinds of backends/frame_kinds.py); an
    error for anything else names ``call``, the function the user called."""
    return kind_of(frame, call).name


def _columns(frame, kind: str) -> list[str]:
    return KINDS[kind].columns(frame)


def _to_arrow(frame, kind: str, cols: list[str]) -> pa.Table:
    """The columns ``cols`` of ``frame`` as an Arrow table (host memory)."""
    return KINDS[kind].to_arrow(frame, cols)


def _text_column(col) -> pa.ChunkedArray:
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    if pa.types.is_dictionary(col.type):  # categorical text: decode
        col = col.cast(col.type.value_type)
    return without_views(col)  # string_view / binary_view: the same bytes as large strings (Arrow's kernels lack views)


def config_of(config, text: str | None, id, overrides: dict, columns_from_config: bool = False) -> Config:
    """The run's config: ``config`` (a Config, dict, YAML path or preset name) with ``text`` / ``id`` as its input
    columns and the keyword ``overrides``.  ``columns_from_config``: a ``text`` or ``id`` of None keeps the
    config's own ``input.text_column`` / ``input.id_column`` (:func:`gpu_dedup.dedup`)."""
    if config is None:
        cfg = Config()
    elif isinstance(config, Config):
        cfg = config
    elif isinstance(config, dict):
        cfg = Config.from_dict(config)
    elif isinstance(config, (str, Path)):
        cfg = Config.from_yaml(config)
    else:
        raise ConfigError(f"config = {config!r} is not a Config, a dict, a YAML path or a preset name")
    dotted = {"input.text_column": text, "input.id_column": id}
    if columns_from_config:
        dotted = {k: v for k, v in dotted.items() if v is not None}
    for key, value in overrides.items():
        if key in ALIASES:
            dotted[ALIASES[key]] = value
        elif "." in key:
            dotted[key] = value
        else:
            raise ConfigError(f"dedup() got an unknown keyword {key!r}; use one of {', '.join(sorted(ALIASES))} "
                              "or a dotted config key, e.g. **{'lsh.threshold': 0.7}")
    return cfg.with_overrides(dotted)


def frame_shard(frame, kind: str, text: str, id: str | None, cfg: Config) -> Shard:
    """The in-memory shard of ``frame``'s text (and id / score) columns.  A cuDF frame's text column
    stays in device memory where the GPU backend reads text there (``gpu.reader: cudf``); every
    other column, and the text otherwise, is copied to the host."""
    # device branch (tools/device_branches.py): the user's frame, not the backend, is on the device; the frame
    # kinds' registry says which kinds are, and the backend whether its reader takes a device column
    device = KINDS[kind].device and _device_text(frame, kind, text, id, cfg)
    table = frame_table(frame, kind, text, id, cfg, skip_text=device)
    return memory_shard(table, name=f"{kind} frame", text=frame[text] if device else None)


def _device_text(frame, kind: str, text: str, id: str | None, cfg: Config) -> bool:
    """Whether the run keeps a device frame's text column ``text`` on the device."""
    score = cfg.select.score_read
    if cfg.input.vector_column or text in (id, score) or text not in _columns(frame, kind):
        return False
    return get_backend(cfg.backend).reads_device_text(cfg) and is_string_column(frame[text])


def frame_table(frame, kind: str, text: str, id: str | None, cfg: Config, skip_text: bool = False) -> pa.Table:
    """The text (and id / score) columns of ``frame`` as the Arrow table a memory shard reads;
    checks that the columns exist and that the text column holds strings.  ``skip_text``: the
    text column stays out (a device column the caller hands over)."""
    names = _columns(frame, kind)
    vec = cfg.input.vector_column
    wanted = {"text": text if (vec is None or text in names) else None, "id": id,
              "score": cfg.select.score_read, "vector": vec}
    arg = {"text": "text=", "id": "id=", "score": "score= (select.score_column)",
           "vector": "vector_column= (input.vector_column)"}
    for what, col in wanted.items():
        if col is not None and col not in names:
            raise InputError(f"{what} column {col!r} is not in the frame; its columns are: "
                             f"{', '.join(map(repr, names)) or '(none)'}. Pass one of them as {arg[what]}")
    for what, col in wanted.items():  # frame[col] of a name given twice is a frame, not a column
        if col is not None and names.count(col) > 1:
            raise InputError(f"the frame has {names.count(col)} columns named {col!r} (the {what} column); "
                             f"rename or drop all but one of them, e.g. df = df.loc[:, ~df.columns.duplicated()]")
    cols = list(dict.fromkeys(c for k, c in wanted.items() if c is not None and not (skip_text and k == "text")))
    table = _to_arrow(frame, kind, cols) if cols else rows_only(len(frame))
    columns = {c: table.column(c) for c in cols}
    if wanted["text"] is None or skip_text:  # embeddings only, or the text stays on the device
        return pa.table(columns) if columns else table
    columns[text] = _text_column(columns[text])
    ttype = columns[text].type
    if columns[text].null_count == len(columns[text]) and not pa.types.is_null(ttype):
        # no text at all, whatever the type: pandas makes an empty or all-missing column float64
        # (pd.DataFrame({"text": []})), like an all-None one of type null: every row is a null text, kept
        columns[text] = pa.chunked_array([pa.nulls(len(columns[text]), pa.string())])
        ttype = columns[text].type
    if not (pa.types.is_string(ttype) or pa.types.is_large_string(ttype) or pa.types.is_binary(ttype)
            or pa.types.is_large_binary(ttype) or pa.types.is_null(ttype)):
        raise InputError(f"text column {text!r} has type {ttype}; it must hold strings: convert it "
                         f"(e.g. df[{text!r}].astype(str)) or pass text= another column")
    return pa.table(columns)


def frame_duplicates(dup: pa.Table, id: str | None) -> pa.Table:
    """The pipeline's duplicates table in frame terms: ``row`` is the position in the frame (the
    shard row of the one in-memory shard), ``id`` and ``survivor_id`` only with an id column."""
    dup = dup.drop_columns([ROW, "shard"])
    dup = dup.rename_columns([ROW if c == "shard_row" else c for c in dup.column_names])
    order = [ROW, "cluster_id", "kept", "similarity", "match"]
    order += [c for c in ("survivor_id", "in_index") if c in dup.column_names]
    return dup.select(order if id is None else [id] + order)


def take_rows(frame, kind: str, kept: np.ndarray):
    """The kept rows of ``frame``, in input order, same type and columns."""
    return KINDS[kind].take(frame, kept)


def like(table: pa.Table, kind: str):
    return KINDS[kind].from_arrow(table)
