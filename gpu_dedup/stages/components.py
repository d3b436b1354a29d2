"""Connected components over verified edges (an array algorithm, no Python loop over edges)."""

from __future__ import annotations

import numpy as np

from gpu_dedup.backends import get_backend
from gpu_dedup.stages.edges import Edges


def components(edges: Edges, n: int, backend="cpu") -> np.ndarray:
    """Component label of each of ``n`` nodes: the smallest node index in its component."""
    return get_backend(backend).components(np.asarray(edges.src), np.asarray(edges.dst), n)
