"""What an index adds to a run, around the stage sequence: one object, so the sequence reads the same with and
without an index.

A run may be deduplicated against an index (its **prior**, :mod:`gpu_dedup.run.prior`: the index's
documents take part in matching and always survive) and may hand every document to an index (its **sink**:
an index being built, or the prior itself being updated).  :class:`IndexSteps` holds both and is asked at
fixed points of :mod:`gpu_dedup.run.sequence`, always, in the same words:

- exact: whether the documents' exact keys are kept for the sink (:attr:`IndexSteps.keeps_keys`);
- buckets: from how many members a bucket counts (the prior's ``min_bucket_size``);
- components: the indexed documents this run's rows meet, as cluster members (:meth:`IndexSteps.members`),
  and under ``select.split_chains`` their edges to their homes (:meth:`IndexSteps.edges`);
- select and the report: the prior's counts and the report's index section;
- write: whether the normalized texts are still read after it (the sink stores them);
- around the outputs' commit: the append's segments before it (:meth:`IndexSteps.stage`), the manifest that
  adds them to the index after it (:meth:`IndexSteps.publish`), or their removal when it fails
  (:meth:`IndexSteps.discard`).

Without an index (a :class:`~gpu_dedup.run.prior.NoPrior` and no sink) each answer is "nothing": no member,
no count, no section, no append.  The decisions themselves stay in :mod:`gpu_dedup.stages` (their functions
take the prior) and the work where the executor keeps the parts (:meth:`~gpu_dedup.run.contract.Executor.
append_index`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from gpu_dedup.errors import (
    COMMITTED,
    GpuDedupError,
    ResourceError,
    after_commit,
    write_error,
)
from gpu_dedup.run.checkpoint import maybe_crash
from gpu_dedup.run.contract import Executor, Parts, Prior, Sink
from gpu_dedup.run.stagelog import StageLog
from gpu_dedup.stages import frames
from gpu_dedup.stages.components import index_home_edges, index_members, index_nodes
from gpu_dedup.stages.frames import concat_parts

log = logging.getLogger("gpu_dedup")


class Sequence(Protocol):
    """What the index's steps read of the running sequence (:class:`gpu_dedup.run.sequence.Sequence`)."""

    ex: Executor
    st: StageLog
    cfg: Any
    n: int
    first_doc: int
    family: Any
    docs: Parts
    keys: Parts | None
    bands: Parts
    centres_in: Parts
    centres: Parts
    dup: Parts

    def route(self, parts: Parts, dest: Callable, **kw: Any) -> Parts: ...

    def lookup(self, parts: Parts, table: Parts, out: str, key: str = ..., value: str = ...) -> Parts: ...


class IndexSteps:
    """The prior and the sink of one run (see the module docstring)."""

    def __init__(self, prior: Prior, sink: Sink | None):
        self.prior, self.sink = prior, sink
        self._involved: Parts | None = None  # the indexed documents this run's rows meet (members)

    @property
    def keeps_keys(self) -> bool:
        """The sink stores every document's exact keys: the exact stage computes and keeps them."""
        return self.sink is not None

    def exact_parts(self, keys: Parts | None) -> dict:
        """What the exact stage's checkpoint unit keeps for the sink: the exact keys (none without a sink)."""
        return {"keys": keys} if self.keeps_keys and keys is not None else {}

    @property
    def reads_texts(self) -> bool:
        """The sink stores the normalized texts after the write stage: they may not be freed before it."""
        return self.sink is not None

    def members(self, seq: Sequence, labels: Parts) -> list[Parts]:
        """The indexed documents this run's rows meet (their exact matches and their buckets' centres) with
        the labels of their homes' components, as cluster members (routed by ``hash_dest(node)``); none
        without a prior."""
        if not self.prior.active:
            return []
        ex = seq.ex
        involved = ex.map(concat_parts, seq.route(ex.map(index_nodes, seq.docs, None), frames.hash_dest, on="node"),
                          seq.route(ex.map(index_nodes, None, seq.centres_in), frames.hash_dest, on="node"))
        self._involved = involved
        return [seq.lookup(ex.map(index_members, involved, prior=self.prior), labels, "label")]

    def edges(self, seq: Sequence, edges: Parts) -> Parts:
        """The components' edges (with their labels' lookup key), and under ``select.split_chains`` an edge from
        each indexed document met (:meth:`members`) to its home: an index cluster whose members leave a larger
        cluster together re-forms around its home.  ``edges`` as they are without a prior."""
        if not self.prior.active or not seq.cfg.select.split_chains:
            return edges
        assert self._involved is not None, "members() finds the indexed documents before edges() links them"
        return seq.ex.map(concat_parts, edges, seq.ex.map(index_home_edges, self._involved, prior=self.prior))

    def counts(self, totals: dict) -> dict:
        """The select stage's counts of the prior: rows removed as copies of indexed documents."""
        return {"removed_against_index": totals["removed_against_index"]} if self.prior.active else {}

    def report(self, documents: int) -> dict:
        """The report's index section: the index deduplicated against (and whether this run appended its
        ``documents``), or the index built."""
        prior = self.prior
        if prior.active:
            updated = prior.is_index(self.sink)  # its manifest written after the outputs are published (publish)
            first = prior.first_doc
            return {"index": {"path": str(prior.path), "documents_before": first,
                              "updated": updated, "documents_after": first + documents if updated else first}}
        if self.sink is not None:
            return {"index_out": str(self.sink.path)}
        return {}

    def stage(self, seq: Sequence) -> None:
        """Every document of the run into the sink (an index being built or updated) as segments that are not
        yet part of the index, before the outputs' commit: a full disk shows here, before anything is
        published.  A run killed or failing before its commit leaves the index as it was, so rerunning the
        same command neither appends the documents twice nor matches them against their own earlier copies;
        one killed after its commit recomputes the same outputs and appends.  Nothing without a sink."""
        sink = self.sink
        if sink is None:
            return
        remote = getattr(sink, "remote", None)  # an index in an object store, through its local copy
        COMMITTED.index = str(remote if remote is not None else sink.path)
        sink.hold()
        try:
            maybe_crash("index:before-append")
            with seq.st.stage("index", seq.n) as info:
                try:
                    seq.ex.append_index(sink, seq.docs, seq.keys, seq.bands, seq.centres, seq.dup, seq.first_doc,
                                        seq.family.layout)
                except OSError as exc:
                    mapped = write_error(COMMITTED.index, exc)
                    if mapped is exc:
                        raise
                    if not isinstance(mapped, ResourceError):  # read-only, not permitted
                        raise mapped from None
                    raise ResourceError(f"disk full writing the index {COMMITTED.index!r} ({exc.strerror or exc}); "
                                        "its partial segment was removed and nothing was published for this run "
                                        "(its outputs and the index are as they were): free space where the index "
                                        "is and rerun") from None
                info.update(documents=seq.first_doc + seq.n)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Drop the staged segments of a run that publishes nothing (its commit failed)."""
        if self.sink is None:
            return
        try:
            self.sink.discard_staged()
        except OSError:  # pragma: no cover - the run's own failure is the one to report
            log.debug("could not remove the staged index segments", exc_info=True)

    def publish(self, out: Any) -> None:
        """The sink's manifest, after the outputs (under ``out``, if any) are published: what fails here says
        the outputs are there."""
        if self.sink is None:
            return
        try:
            self.sink.publish_staged()
        except (GpuDedupError, OSError) as exc:
            if out is None:
                raise
            raise after_commit(exc, out, COMMITTED.index) from None
        COMMITTED.indexed = True
