"""Argument types of the command line: whole numbers with a lower bound, checked by argparse (which names the
option in its one-line error, exit 2).  Standard library only: the benchmarks' own parsers use them too."""

from __future__ import annotations

import argparse


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give e.g. 3") from None


def positive_int(text: str) -> int:
    """An integer >= 1 (a count of documents, runs, workers)."""
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (0: none)."""
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def at_least(low: int):
    """An argparse type: an integer >= ``low`` (a planted corpus needs a few documents per planted cluster)."""

    def check(text: str) -> int:
        value = _whole(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be >= {low}")
        return value

    check.__name__ = f"integer >= {low}"
    return check
