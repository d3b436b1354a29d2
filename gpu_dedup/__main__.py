"""``python -m gpu_dedup`` = the ``gpu-dedup`` command."""

from gpu_dedup.cli import console

console()
