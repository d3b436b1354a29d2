"""The backend seam: one small registry, backends imported lazily.

Stage code asks ``get_backend(name)`` for an object with the kernel entry
points (``minhash``, ``band_hashes``, ``exact_hashes``, ``shingle_sets``,
``jaccard_pairs``, ``signature_similarity``, ``components``).  The GPU
module (and with it CuPy / cuDF) is imported only when the GPU backend is
asked for, so a CPU install never needs them.
"""

from __future__ import annotations

import importlib
import logging

from .errors import BackendError

log = logging.getLogger("gpu_dedup")

_REGISTRY = {
    "cpu": "gpu_dedup.backends.cpu",
    "gpu": "gpu_dedup.backends.gpu",
}
_CACHE: dict[str, object] = {}


def _load(name: str):
    if name not in _CACHE:
        module = importlib.import_module(_REGISTRY[name])
        _CACHE[name] = module.create()  # raises BackendError when it cannot run here
    return _CACHE[name]


def get_backend(name: str = "auto"):
    """Return the backend object for ``cpu``, ``gpu`` or ``auto`` (GPU if usable, else CPU)."""
    if not isinstance(name, str):
        return name  # already a backend object
    if name not in ("auto", *_REGISTRY):
        raise BackendError(f"backend {name!r} is not known; choose auto, {', '.join(_REGISTRY)}")
    if name != "auto":
        return _load(name)
    try:
        return _load("gpu")
    except BackendError as exc:
        log.info("backend auto: using the CPU (%s)", exc)
        return _load("cpu")
