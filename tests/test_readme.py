"""README.md is a product page: its first screen fits one screen and shows how to install, with or without a
clone; what it names (the notebook's own-data cell, the wheel) exists."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
SCREEN = 40  # lines of a terminal or an editor's first view


def _first_screen() -> list[str]:
    lines = README.splitlines()
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("## "))]


def test_the_first_screen_fits_one_screen():
    first = _first_screen()
    assert len(first) <= SCREEN, f"{len(first)} lines before the first section"
    assert all(len(line) <= 120 for line in first), [line for line in first if len(line) > 120]


def test_install_without_a_clone_from_the_git_url_or_a_wheel():
    first = "\n".join(_first_screen())
    assert re.search(r'pip install "gpu_dedup @ git\+https://\S+\.git"', first)
    wheel = re.search(r"pip install (gpu_dedup-(\S+)-py3-none-any\.whl)", first)
    assert wheel and "pip wheel --no-deps" in first
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "gpu_dedup" / "version.py").read_text()).group(1)
    assert wheel.group(2) == version  # the wheel named is the one this checkout builds
    assert 'pip install -e ".[test]"' in first  # and from a clone, with the tests


def test_the_readme_names_the_notebook_cell_for_your_own_shards():
    nb = json.loads((ROOT / "notebooks" / "exploration.ipynb").read_text(encoding="utf-8"))
    cells = ["".join(c["source"]) for c in nb["cells"]]
    heading = next(i for i, c in enumerate(cells) if c.startswith("## Or your own shards"))
    assert cells[heading + 1].startswith("SHARDS = None")  # the cell the README names follows its heading
    assert "**Or your own shards**" in README
    for name in ("SHARDS", "LIMIT", "MAX_PAIRS"):
        assert f"`{name}`" in README and f"{name} = " in cells[heading + 1]


def test_every_test_the_reliability_matrix_names_exists():
    """docs/reliability.md names the test that checks each row (``path.py::test_name``, or ``::test_name`` in the
    file named before it): a renamed or removed test leaves a row that nothing checks."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    named, missing, last = 0, [], None
    for ref in re.findall(r"`([\w/]*\.py)?::(\w+)`", text):
        path, name = ref
        last = path or last
        named += 1
        source = ROOT / "tests" / last if last else None
        if source is None or not source.is_file() or not re.search(rf"def {name}\(", source.read_text()):
            missing.append(f"{last}::{name}")
    assert named > 100 and not missing, f"tests the reliability matrix names that do not exist: {missing}"
