"""List the device decisions made outside ``gpu_dedup/backends/``: every branch (``if``, ``elif``, ``while``,
a conditional expression, a comprehension's ``if``, an ``assert``, a comparison kept in a variable) whose test asks which backend runs or where
arrays live:

- the backend's name (``backend.name == "cpu"``, ``cfg.backend == "gpu"``, ``backend == "cpu"``);
- the array module (``xp is np``, ``xp is array_module(a)``, ``xp.__name__``);
- device-ness (``on_device(...)``, ``.device``, ``hasattr(a, "get")``);
- state only a GPU has (``memory_plan``, ``batch_bytes``, ``device_text``, ``device_table``, ``text_reader``,
  ``table_reader``, ``device_writer``, ``table_writer``, ``cfg.gpu``), or a GPU-only library (cuDF, cuGraph).

The storage layer's ``batch_bytes`` (the size of a streamed read batch, the same on every backend) is not the
GPU's: :data:`NOT_DEVICE` names it, so that only tests naming GPU-only state count.

Usage: ``python tools/device_branches.py [ROOT]`` prints ``path:line: test`` for each and the count; the
layout test keeps the count at most :data:`LIMIT`, each with a comment on why it is not in the backend.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

LIMIT = 5
# (folder, word): a word of PATTERN that names something else there
NOT_DEVICE = (("gpu_dedup/storage/", "batch_bytes"),)  # a streamed read batch's size, on every backend
PATTERN = re.compile(
    r"""\.name\s*[!=]=\s*["'](?:cpu|gpu)["']|backend\s*(?:[!=]=|in)\s*[("']|\bxp\s+is\s+|"""
    r"""__name__\s*[!=]=\s*["']cupy|\bon_device\(|\.device\b|\bmemory_plan\b|\bbatch_bytes\b|\bdevice_text\b|"""
    r"""\bdevice_table\b|\btext_reader\b|\btable_reader\b|\bdevice_writer\b|\btable_writer\b|\bcfg\.gpu\b|"""
    r"""\bcudf\b|\bcugraph\b|hasattr\(\w+,\s*["']get["']\)""")


def branches(root: Path) -> list[tuple[str, int, str]]:
    """(path, line, test) of every device branch in the package under ``root``, outside ``backends/``."""
    found = []
    package = root / "gpu_dedup"
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("gpu_dedup/backends/", "gpu_dedup/bench/")):  # the seam itself; benchmarks compare
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            tests = []
            if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
                tests.append(node.test)
            elif isinstance(node, ast.comprehension):
                tests.extend(node.ifs)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, (ast.Compare, ast.BoolOp)):
                tests.append(node.value)  # a decision kept for later (``fast = xp is np``)
            for test in tests:
                text = ast.get_source_segment(source, test) or ""
                hits = {m.group(0) for m in PATTERN.finditer(text)}
                hits -= {w for folder, w in NOT_DEVICE if rel.startswith(folder)}
                if hits:
                    found.append((rel, test.lineno, " ".join(text.split())))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    found = branches(root)
    for rel, line, text in found:
        print(f"{rel}:{line}: {text}")
    print(f"{len(found)} device branches outside gpu_dedup/backends/ (at most {LIMIT})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
