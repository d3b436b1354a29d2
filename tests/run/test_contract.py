"""The contract (run/contract.py) is kept: both executors define every member of the Executor Protocol with
signatures that accept what the sequence passes, both priors every member of Prior, and every sink every
member of Sink.  (``mypy``, run by .ci/run, checks the same structurally where ``execute`` is called.)"""

from __future__ import annotations

import ast
import threading
import inspect
import textwrap
import typing

import pytest

from gpu_dedup.errors import InputError
from gpu_dedup.index.remote import RemoteIndex, RemoteIndexBuilder
from gpu_dedup.index.store import Index, IndexBuilder
from gpu_dedup.run.cluster.executor import DaskExecutor
from gpu_dedup.run.contract import Executor, Prior, Sink, Soon
from gpu_dedup.run.local import LocalExecutor
from gpu_dedup.run.prior import IndexPrior, NoPrior


def _members(protocol) -> set[str]:
    attrs = getattr(protocol, "__protocol_attrs__", None)  # Python 3.12+
    return set(attrs if attrs is not None else typing._get_protocol_attrs(protocol))


def _assigned(cls) -> set[str]:
    """Attributes a class's own methods assign on ``self`` (``self.x = ...``, ``self.x: T = ...``), with its bases'."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and el.value.id == "self":
                        names.add(el.attr)
    return names


def _defines(cls, name: str) -> bool:
    return any(name in vars(k) or name in getattr(k, "__annotations__", {}) for k in cls.__mro__) or \
        name in _assigned(cls)


def _accepts(impl, spec) -> list[str]:
    """What ``impl`` does not accept of the calls ``spec`` allows (empty: every call to ``spec`` fits ``impl``)."""
    got, want = inspect.signature(impl), inspect.signature(spec)
    params = list(got.parameters.values())
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in params)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems = []
    for i, p in enumerate(q for q in want.parameters.values() if q.name != "self"):
        if p.kind is p.VAR_POSITIONAL:
            if not var_pos:
                problems.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            if not var_kw:
                problems.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if p.name not in got.parameters and not var_kw:
                problems.append(p.name)
        else:  # positional: the same place (self counted on both sides)
            if i + 1 >= len(positional) and not var_pos:
                problems.append(p.name)
            if p.default is not p.empty:  # may be left out
                mine = got.parameters.get(p.name)
                if mine is not None and mine.default is mine.empty and mine.kind is not mine.VAR_POSITIONAL:
                    problems.append(f"{p.name} (optional in the contract)")
    for p in params[1:]:  # the executor's own parameters must be optional beyond the contract's
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and \
                p.name not in want.parameters and not any(q.kind is q.VAR_KEYWORD for q in want.parameters.values()):
            problems.append(f"{p.name} (required, not in the contract)")
    return problems


def _check(cls, protocol) -> None:
    missing, mismatched = [], {}
    for name in sorted(_members(protocol)):
        if not _defines(cls, name):
            missing.append(name)
            continue
        spec = inspect.getattr_static(protocol, name)
        if inspect.isfunction(spec):
            impl = inspect.getattr_static(cls, name, None)
            impl = impl.__func__ if isinstance(impl, (staticmethod, classmethod)) else impl
            if not callable(impl):
                mismatched[name] = ["not a method"]
                continue
            problems = _accepts(impl, spec)
            if problems:
                mismatched[name] = problems
    assert not missing, f"{cls.__name__} lacks {missing} of {protocol.__name__}"
    assert not mismatched, f"{cls.__name__}'s signatures differ from {protocol.__name__}'s: {mismatched}"


@pytest.mark.parametrize("executor", [LocalExecutor, DaskExecutor])
def test_both_executors_satisfy_the_executor_protocol(executor):
    assert len(_members(Executor)) >= 30  # the contract itself: what the sequence asks
    _check(executor, Executor)


@pytest.mark.parametrize("prior", [NoPrior, IndexPrior])
def test_both_priors_answer_every_query_of_the_prior_protocol(prior):
    _check(prior, Prior)


def test_no_prior_answers_every_query_of_no_documents():
    p = NoPrior()
    none = []
    assert not p.active and p.first_doc == 0 and p.path is None and p.min_bucket_size == 2
    assert p.exact_matches(__import__("numpy").zeros((3, 3), "uint64")).tolist() == [-1, -1, -1]
    assert [len(x) for x in p.bucket_centres(none, none)] == [0, 0, 0]
    for query in (p.home, p.ranks, p.ids, p.texts, p.signatures):
        assert len(query(none)) == 0
    assert len(p.vectors(none)) == 0
    assert IndexPrior.min_bucket_size == 1  # a lone new document still meets the index's documents


@pytest.mark.parametrize("sink", [Index, IndexBuilder, RemoteIndex, RemoteIndexBuilder])
def test_every_sink_satisfies_the_sink_protocol(sink):
    _check(sink, Sink)


def test_a_missing_member_is_named():
    class Half:
        def read(self, progress=None):
            return None

    with pytest.raises(AssertionError, match="lacks .*normalize"):
        _check(Half, Executor)

    class Narrow:
        def append(self, ids):  # a required positional the contract passes by keyword only
            return 0

        path = documents = id_type = None

        def append_segments(self, counts, write):  # layout left out
            return 0

        def hold(self):
            pass

        publish_staged = discard_staged = hold

    with pytest.raises(AssertionError, match="append"):
        _check(Narrow, Sink)


def test_a_step_started_soon_runs_at_once_and_hands_back_its_value_or_its_error_when_asked():
    started, go = threading.Event(), threading.Event()

    def step(x, plus):
        started.set()
        go.wait(30)
        return x + plus

    pending = Soon(step, (1,), {"plus": 2})
    assert started.wait(30)  # running in its own thread before anyone asks for it
    go.set()
    assert pending.result() == 3

    def fails():
        raise InputError("shard 'a.parquet' has 3 rows now but had more when read")

    with pytest.raises(InputError, match="had more when read"):
        Soon(fails, (), {}).result()


def test_ready_and_soon_live_below_the_report_and_keep_their_old_names_here():
    from gpu_dedup import pending
    from gpu_dedup.run import contract

    assert contract.Ready is pending.Ready and contract.Soon is pending.Soon
    assert pending.Ready([1, 2]).result() == [1, 2]
