"""The shape of report.json as the page reads it: :func:`check` names the first field that is not.

``gpu-dedup report`` draws a page from a report.json it did not write this time (edited, truncated,
from another tool); a field of the wrong type made the page fail with "internal error" and a
traceback.  Each field the page reads is described here (its type, and for objects and lists their
own fields); fields the page does not read are not checked, so reports of earlier versions, which lack
newer sections, still draw.
"""

from __future__ import annotations

import json
import math

from gpu_dedup.errors import InputError


class _Kind:
    """A field's expected value: ``test(value)`` and how to say it."""

    def __init__(self, said: str, test):
        self.said, self.test = said, test


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


NUMBER = _Kind("a number", _number)
INT = _Kind("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
POSITIVE = _Kind("an integer of at least 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1)
TEXT = _Kind("a string", lambda v: isinstance(v, str))
FLAG = _Kind("true or false", lambda v: isinstance(v, bool))
TEXT_OR_NULL = _Kind("a string or null", lambda v: v is None or isinstance(v, str))
SCALAR = _Kind("a number, a string, true, false or null",
               lambda v: v is None or isinstance(v, (str, bool, int, float)))
COUNT = _Kind("a number or true/false", lambda v: isinstance(v, bool) or _number(v))


class Obj:
    """An object: ``fields`` (name -> spec) it must hold, ``optional`` ones it may; ``values``: the spec of
    every value (an object keyed by names, e.g. counts)."""

    def __init__(self, fields=None, optional=None, values=None, nullable: bool = False):
        self.fields, self.optional = fields or {}, optional or {}
        self.values, self.nullable = values, nullable


class Seq:
    """A list of ``item``; ``nullable``: null stands for "not collected"."""

    def __init__(self, item, nullable: bool = False):
        self.item, self.nullable = item, nullable


DOC = Obj({"row": INT, "shard": TEXT, "shard_row": INT, "match": TEXT, "text": TEXT_OR_NULL},
          {"similarity": NUMBER, "characters": INT, "truncated": FLAG, "id": SCALAR})
MEMBER = Obj({**DOC.fields, "similarity": NUMBER}, {k: v for k, v in DOC.optional.items() if k != "similarity"})
CLUSTER = Obj({"cluster_id": SCALAR, "size": INT, "exact_copies": INT, "survivor": DOC, "members": Seq(DOC)},
              {"near_duplicates": INT})
SIZES = Obj({"sizes": Seq(NUMBER), "counts": Seq(NUMBER)})
REPORT = Obj(
    {"counts": Obj({"documents_read": INT, "kept": INT, "removed": INT}, values=COUNT),
     "lsh": Obj({"bands": POSITIVE, "rows": POSITIVE, "threshold": NUMBER, "false_positive_area": NUMBER,
                 "false_negative_area": NUMBER},
                {"verify_threshold": NUMBER, "similarity": TEXT, "num_perm": INT, "bits": INT, "note": TEXT})},
    {"stages": Obj(values=Obj(optional={"seconds": NUMBER, "resumed": FLAG, "copies_collapsed": NUMBER})),
     "fixed_seconds": Obj(values=NUMBER), "unbooked_seconds": NUMBER,
     "histograms": Obj(optional={"bucket_size_counts": SIZES, "cluster_size_counts": SIZES,
                                 "bucket_sizes": Obj(values=SCALAR), "cluster_sizes": Obj(values=SCALAR)}),
     "chaining": Obj(optional={"similarity_to_survivor_histogram": Obj({"edges": Seq(NUMBER),
                                                                        "counts": Seq(NUMBER)}, nullable=True),
                               "below_threshold_to_survivor": INT, "near_duplicates_removed": INT,
                               "similarity_to_survivor": Obj(values=SCALAR), "note": TEXT}),
     "largest_clusters": Seq(CLUSTER, nullable=True),
     "largest_near_duplicate_clusters": Seq(CLUSTER, nullable=True),
     "closest_to_threshold": Seq(Obj({"survivor": DOC, "member": MEMBER}), nullable=True),
     "inputs": Seq(Obj({"name": TEXT, "format": TEXT, "rows": INT, "bytes": INT}, {"kept": INT, "removed": INT})),
     "config": Obj(optional={"verify": Obj(optional={"method": SCALAR})}),
     "wall_seconds": NUMBER, "peak_rss_mb": NUMBER, "created": TEXT, "gpu_dedup_version": TEXT, "backend": TEXT,
     "fingerprint": TEXT})


class ReportShapeError(InputError):
    """A report.json field the page cannot draw: ``field`` names it (``lsh.bands``, ``largest_clusters[0].size``)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"field {field} {problem}")
        self.field, self.problem = field, problem


def _shown(v) -> str:
    text = json.dumps(v, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def _walk(value, spec, where: str) -> None:
    if isinstance(spec, _Kind):
        if not spec.test(value):
            raise ReportShapeError(where, f"is {_shown(value)}, not {spec.said}")
        return
    if value is None and spec.nullable:
        return
    if isinstance(spec, Seq):
        if not isinstance(value, list):
            raise ReportShapeError(where, f"is {_shown(value)}, not a list")
        for i, item in enumerate(value):
            _walk(item, spec.item, f"{where}[{i}]")
        return
    if not isinstance(value, dict):
        raise ReportShapeError(where or "(the whole file)", f"is {_shown(value)}, not an object")
    dot = f"{where}." if where else ""
    for name, sub in spec.fields.items():
        if name not in value:
            raise ReportShapeError(f"{dot}{name}", "is missing")
        _walk(value[name], sub, f"{dot}{name}")
    for name, sub in spec.optional.items():
        if name in value:
            _walk(value[name], sub, f"{dot}{name}")
    if spec.values is not None:
        for name, v in value.items():
            if name not in spec.fields and name not in spec.optional:
                _walk(v, spec.values, f"{dot}{name}")


def check(report) -> None:
    """Raise :class:`ReportShapeError` naming the first field of ``report`` (a parsed report.json) the page
    cannot draw: a missing field, a value of another type, lists that must pair up and do not."""
    _walk(report, REPORT, "")
    hist = report.get("chaining", {}).get("similarity_to_survivor_histogram")
    if hist and len(hist["edges"]) != len(hist["counts"]) + 1:
        raise ReportShapeError("chaining.similarity_to_survivor_histogram.edges",
                               f"has {len(hist['edges'])} values for {len(hist['counts'])} counts (one more is "
                               "needed)")
    for name in ("bucket_size_counts", "cluster_size_counts"):
        sizes = report.get("histograms", {}).get(name)
        if sizes and len(sizes["sizes"]) != len(sizes["counts"]):
            raise ReportShapeError(f"histograms.{name}.counts",
                                   f"has {len(sizes['counts'])} values for {len(sizes['sizes'])} sizes")
    machine = report.get("machine")
    if isinstance(machine, dict) and "cpus" in machine and machine["cpus"] and not INT.test(machine["cpus"]):
        raise ReportShapeError("machine.cpus", f"is {_shown(machine['cpus'])}, not {INT.said}")
    for i, shard in enumerate(report.get("inputs", ())):
        if ("kept" in shard) != ("removed" in shard):
            raise ReportShapeError(f"inputs[{i}].{'removed' if 'kept' in shard else 'kept'}",
                                   "is missing (a shard's kept and removed counts come together)")
    chaining = report.get("chaining", {})
    if hist and sum(hist["counts"]):  # the figure's title says how many are below the threshold
        for name in ("below_threshold_to_survivor", "near_duplicates_removed"):
            if name not in chaining:
                raise ReportShapeError(f"chaining.{name}", "is missing (the histogram beside it counts documents)")
    for where, doc in _documents(report):
        if doc.get("truncated") and "characters" not in doc:
            raise ReportShapeError(f"{where}.characters", "is missing (the text is truncated)")
        if doc["match"] != "kept" and "similarity" not in doc:
            raise ReportShapeError(f"{where}.similarity", f"is missing (a {doc['match']!r} member has one)")


def _documents(report: dict):
    """(where, document) of every sample document the page shows."""
    for where in ("largest_clusters", "largest_near_duplicate_clusters"):
        for i, c in enumerate(report.get(where) or ()):
            yield f"{where}[{i}].survivor", c["survivor"]
            for j, d in enumerate(c["members"]):
                yield f"{where}[{i}].members[{j}]", d
    for i, pair in enumerate(report.get("closest_to_threshold") or ()):
        yield f"closest_to_threshold[{i}].survivor", pair["survivor"]
        yield f"closest_to_threshold[{i}].member", pair["member"]
