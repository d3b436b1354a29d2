"""The package's shape: imports run one way (entry points -> the run's entry -> the index -> executors ->
stages -> backends -> kernels), with no cycle anywhere, and every package is shipped."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "gpu_dedup"

# layer of each top-level part of the package: a module imports only from its own layer or below
LAYERS = {
    "kernels": 0,
    "version": 0,
    "errors": 0,
    "pending": 0,  # values taken later with result() (Ready, Soon): the executors' and the report's
    "curves": 1,
    "config": 2,
    "backends": 3,
    "storage": 3.5,  # shard files: discovery, identity, formats, atomic writes
    "stages": 4,
    "report": 5,
    "run": 6,  # the executors and the stage sequence
    "index": 6.5,  # the persisted index: a run's prior and sink (its store uses run/outdir's lock; Index.add runs
    #                 the one-process executor)
    # entry points
    "api": 7, "evaluation": 7, "demo": 8, "bench": 8, "cli": 9, "__main__": 10, "__init__": 10,
}


# modules above the layer of their package: the run's one entry opens the index a run is given as an option
MODULE_LAYERS = {"gpu_dedup.run.entry": 6.8}


def _layer(module: str) -> float:
    return MODULE_LAYERS.get(module, LAYERS[_part(module)])


def _module_name(path: Path) -> str:
    if path.is_relative_to(ROOT / "kernels"):
        rel = ("kernels",) + path.relative_to(ROOT / "kernels").with_suffix("").parts
    else:
        rel = path.relative_to(PKG).with_suffix("").parts
    if rel[-1] == "__init__" and len(rel) > 1:
        rel = rel[:-1]
    return ".".join(("gpu_dedup",) + rel)


def _sources() -> dict[str, Path]:
    files = list(PKG.rglob("*.py")) + list((ROOT / "kernels").glob("*.py"))
    return {_module_name(p): p for p in files if "__pycache__" not in p.parts}


def _imports(path: Path, name: str, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported gpu_dedup module, line, inside a function) of one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            targets = []
            if isinstance(child, ast.Import):
                targets = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - child.level + 1] + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in child.names]
            for t in targets:
                while t and t not in known:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != name:
                    found.append((t, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return found


def _graph():
    src = _sources()
    known = set(src)
    return src, {m: _imports(p, m, known) for m, p in src.items()}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_imports_run_one_way():
    _, graph = _graph()
    wrong = []
    for mod, edges in graph.items():
        for target, line, _ in edges:
            if target == "gpu_dedup":
                continue  # the package itself (its version): a leaf for this purpose
            if _layer(target) > _layer(mod):
                wrong.append(f"{mod}:{line} imports {target}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_import_cycle():
    _, graph = _graph()
    adj = {m: {t for t, _, _ in e if t != "gpu_dedup"} for m, e in graph.items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def strong(v):  # Tarjan's strongly connected components (a few hundred nodes)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in adj:
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"


def test_every_package_is_shipped():
    """Each folder of Python modules is a package that setup.py's discovery finds."""
    import importlib.util
    import runpy
    from unittest import mock

    with mock.patch("setuptools.setup") as setup:
        runpy.run_path(str(ROOT / "setup.py"), run_name="__main__")
    shipped = set(setup.call_args.kwargs["packages"])
    folders = {p.parent for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    expected = {".".join(("gpu_dedup",) + f.relative_to(PKG).parts) if f != PKG else "gpu_dedup" for f in folders}
    missing_init = sorted(str(f) for f in folders if not (f / "__init__.py").is_file())
    assert not missing_init, f"folders without __init__.py (not shipped): {missing_init}"
    assert expected | {"gpu_dedup.kernels", "gpu_dedup.configs"} == shipped
    assert importlib.util.find_spec("gpu_dedup.bench.peers") is not None


def test_no_module_named_like_the_standard_library():
    import sys

    names = {p.stem for p in PKG.rglob("*.py")} | {p.name for p in PKG.rglob("*") if p.is_dir()}
    clash = sorted(n for n in names if n in sys.stdlib_module_names)
    assert not clash, f"modules named like the standard library: {clash}"



# modules that import an optional extra at their top: the wheel check in .ci/run imports every other module in a
# venv holding only the core dependencies
NEEDS_AN_EXTRA = {"gpu_dedup.run.cluster.plugins": "distributed"}


def test_only_the_listed_modules_import_an_optional_extra_at_their_top():
    import sys

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]} | {"yaml", "llvmlite"}
    found = {}
    for path in PKG.rglob("*.py"):
        name = ".".join(path.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.parse(path.read_text()).body:
            roots = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for root in (r.split(".")[0] for r in roots):
                if root not in core and root not in sys.stdlib_module_names and root != "gpu_dedup":
                    found[name] = root
    assert found == NEEDS_AN_EXTRA, f"top-level imports of optional packages: {found}"
    wheel_check = (ROOT / ".ci" / "run").read_text()
    assert all(f'"{m}"' in wheel_check for m in NEEDS_AN_EXTRA), ".ci/run's wheel check must skip " + str(NEEDS_AN_EXTRA)


# entry points that import their commands on demand, so `gpu-dedup --help` and `import gpu_dedup` stay fast, and
# the benchmarks, whose timed child processes count their own imports
LAZY_OK = {"gpu_dedup.__init__", "gpu_dedup.cli", "gpu_dedup.cli.commands", "gpu_dedup.cli.parser", "gpu_dedup.bench.peers", "gpu_dedup.bench.gpu", "gpu_dedup.bench.stages"}
# modules loaded when first used anywhere: compiled kernels (Numba compiles or loads them), the CUDA backend and
# the large Unicode tables
LAZY_TARGETS = {"gpu_dedup.kernels", "gpu_dedup.kernels.hash_cpu", "gpu_dedup.kernels.hash_cuda", "gpu_dedup.backends.gpu",
                "gpu_dedup.kernels.order_cpu",
                "gpu_dedup.kernels.cosine_cuda",
                "gpu_dedup.kernels.unicode_props", "gpu_dedup.kernels.unicode_tables",
                "gpu_dedup.run.cluster.plugins"}  # a scheduler plugin: Dask's class, imported only with Dask


def test_no_package_import_inside_a_function():
    """Internal imports sit at the top of the module (none placed in a function to dodge a cycle)."""
    _, graph = _graph()
    inner = sorted({f"{m}:{line} imports {t}" for m, e in graph.items() if m not in LAZY_OK
                    for t, line, in_function in e if in_function and t not in LAZY_TARGETS})
    assert not inner, "imports inside functions:\n" + "\n".join(inner)


def _reached(graph, start: str, avoid=lambda m: False) -> set[str]:
    """The modules ``start`` imports, directly or not, through modules that ``avoid`` does not reject."""
    seen, todo = {start}, [start]
    while todo:
        for target, _, _ in graph[todo.pop()]:
            if target not in seen and target != "gpu_dedup" and not avoid(target):
                seen.add(target)
                todo.append(target)
    return seen


def test_a_run_reaches_its_executors_without_the_index():
    """The CLI and the DataFrame API call the run's one entry, which chooses the executor; the executors and
    the stage sequence never import the index (it is handed to them, opened, as the run's prior and sink)."""
    _, graph = _graph()
    entry = "gpu_dedup.run.entry"
    for caller in ("gpu_dedup.cli.commands", "gpu_dedup.api", "gpu_dedup.demo", "gpu_dedup.evaluation.evaluate"):
        assert entry in {t for t, _, _ in graph[caller]}, f"{caller} does not call {entry}"
    reached = _reached(graph, entry, avoid=lambda m: _part(m) == "index")
    assert {"gpu_dedup.run.local", "gpu_dedup.run.cluster", "gpu_dedup.run.sequence"} <= reached
    for executor in ("gpu_dedup.run.local", "gpu_dedup.run.cluster", "gpu_dedup.run.sequence"):
        index = sorted(m for m in _reached(graph, executor) if _part(m) == "index")
        assert not index, f"{executor} imports the index: {index}"


def test_device_decisions_stay_behind_the_backend_seam():
    """Outside gpu_dedup/backends/ at most a handful of branches decide by backend name, array module,
    device-ness or GPU-only state (tools/device_branches.py lists them), each with a comment saying why."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_branches", ROOT / "tools" / "device_branches.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.branches(ROOT)
    assert len(found) <= module.LIMIT, "\n".join(f"{p}:{line}: {text}" for p, line, text in found)
    for path, line, _ in found:
        above = (ROOT / path).read_text().splitlines()[max(0, line - 4):line - 1]
        assert any("device branch" in text for text in above), f"{path}:{line} has no comment saying why"
