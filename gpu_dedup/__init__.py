"""gpu_dedup: near-duplicate removal for web-scale text corpora (MinHash + LSH, CPU and GPU).

``gpu_dedup.dedup(frame)`` deduplicates a pandas / cuDF DataFrame or a pyarrow
Table in memory (:mod:`gpu_dedup.api`); ``gpu_dedup.stages`` holds every stage
as a plain function.  Both load on first use, so ``import gpu_dedup`` stays light.
"""

from gpu_dedup.config import Config
from gpu_dedup.errors import (
    BackendError,
    ConfigError,
    GpuDedupError,
    InputError,
    OutputError,
    ResourceError,
)

from gpu_dedup.version import __version__

__all__ = ["Config", "ConfigError", "InputError", "OutputError", "ResourceError", "BackendError", "GpuDedupError", "__version__", "dedup",
           "DedupResult", "stages"]


def __getattr__(name: str):
    if name in ("dedup", "DedupResult"):
        from gpu_dedup import api

        return getattr(api, name)
    if name == "stages":
        import importlib

        return importlib.import_module(".stages", __name__)
    raise AttributeError(f"module 'gpu_dedup' has no attribute {name!r}")
