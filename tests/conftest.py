"""Shared pytest configuration for the gpu_dedup test suite.

``tests`` is a package (``tests/__init__.py``), so pytest puts the repository
root on ``sys.path`` and test modules import the oracle as
``from tests import reference as ref``.
"""

import pytest

# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def cpu_backend():
    """The CPU backend object (Numba kernels; compiled once, cached on disk)."""
    from gpu_dedup.backend import get_backend

    return get_backend("cpu")
