"""gpu_dedup: near-duplicate removal for web-scale text corpora (MinHash + LSH, CPU and GPU)."""

from .config import Config
from .errors import BackendError, ConfigError, GpuDedupError, InputError

__version__ = "0.1.0"

__all__ = ["Config", "ConfigError", "InputError", "BackendError", "GpuDedupError", "__version__"]
