"""Every CuPy, pylibcudf, cuDF, RMM and Dask-CUDA name gpu_dedup calls exists in the installed release, and
every keyword it passes is one the callee takes.

The GPU backend's device code runs in CI only under Numba's CUDA simulator, on NumPy arrays (``xp`` is NumPy
there, or ``tests/fake_cupy.py``'s NumPy subclass), so a NumPy function CuPy lacks, or a keyword only NumPy
takes, would first fail on a GPU.  These packages import without a GPU (CuPy, pylibcudf and cuDF load their
libraries lazily), so this runs wherever they are installed: on the GPU machine (tier 1 has CuPy, tier 2 the
RAPIDS kit) and on any CPU machine with them, and skips elsewhere.  The names come from the source (``ast``):
attribute chains on ``xp`` (also ``self.xp``), ``cupy``/``cp``, ``plc``/``pylibcudf``, ``cudf``, ``rmm`` and
``dask_cuda``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import gpu_dedup

ROOTS = {"xp": "cupy", "cupy": "cupy", "cp": "cupy", "plc": "pylibcudf", "pylibcudf": "pylibcudf", "cudf": "cudf",
         "rmm": "rmm", "dask_cuda": "dask_cuda", "cugraph": "cugraph"}
PACKAGE = Path(gpu_dedup.__file__).parent


def _uses() -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """(package, place, attribute chain after the package, keywords) of every attribute (called or not) rooted
    at one of ROOTS, and of every name imported from one of their packages (``from dask_cuda.utils import
    nvml_device_index``: the chain ``utils.nvml_device_index``, with the keywords of the calls of that name in
    the same module), from gpu_dedup's source."""
    found = []
    packages = set(ROOTS.values())
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
        outer = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imported = {}  # local name -> (package, chain)
        aliases = {}  # ``import cugraph.dask as dcg``: dcg -> (cugraph, (dask,))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top, *sub = alias.name.split(".")
                    if top in packages and alias.asname and alias.asname not in ROOTS:
                        aliases[alias.asname] = (top, tuple(sub))
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in packages:
                top, *sub = node.module.split(".")
                for alias in node.names:
                    imported[alias.asname or alias.name] = (top, (*sub, alias.name))
                    where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
                    found.append((top, where, (*sub, alias.name), ()))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
                top, chain = imported[node.func.id]
                kws = tuple(k.arg for k in node.keywords if k.arg)
                if kws:
                    found.append((top, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", chain, kws))
            if not isinstance(node, ast.Attribute) or id(node) in outer:  # the longest chain only
                continue
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if not isinstance(base, ast.Name):
                continue
            chain.append(base.id)
            chain.reverse()  # root first
            call = calls.get(id(node))
            kws = tuple(k.arg for k in call.keywords if k.arg) if call is not None else ()
            where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            if chain[0] in aliases:
                top, prefix = aliases[chain[0]]
                found.append((top, where, prefix + tuple(chain[1:]), kws))
                continue
            at = next((i for i, name in enumerate(chain) if name in ROOTS and (i == 0 or name == "xp")), None)
            if at is not None:
                found.append((ROOTS[chain[at]], where, tuple(chain[at + 1:]), kws))
    return found


USES = _uses()


def test_the_source_scan_finds_the_device_calls():
    """The scan itself: it sees the backend's CuPy calls and the libcudf table reader's."""
    mods = {m for m, *_ in USES}
    assert {"cupy", "pylibcudf"} <= mods
    assert any(m == "pylibcudf" and chain[-1] == "read_parquet" for m, _, chain, _ in USES)
    assert sum(m == "cupy" for m, *_ in USES) > 100


@pytest.mark.parametrize("module", sorted(set(ROOTS.values())))
def test_every_name_and_keyword_exists_in_the_installed_release(module):
    pkg = pytest.importorskip(module)
    problems = []
    for mod, where, chain, kws in USES:
        if mod != module:
            continue
        obj, path = pkg, module
        for name in chain:
            path += "." + name
            try:
                obj = getattr(obj, name)
            except AttributeError:
                try:  # a submodule not imported by its package (``rmm.allocators.cupy``)
                    obj = importlib.import_module(path)
                except ImportError:
                    obj = None
            if obj is None:
                problems.append(f"{where}: {module}.{'.'.join(chain)}: no {path}")
                break
        else:
            if not kws or not callable(obj):
                continue
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):  # ufuncs and Cython functions without a signature
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            problems += [f"{where}: {path}(): no keyword {k!r}" for k in kws if k not in params]
    version = getattr(pkg, "__version__", "?")
    assert not problems, f"{module} {version}:\n" + "\n".join(problems)
