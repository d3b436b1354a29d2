"""Package discovery (metadata lives in pyproject.toml).

Every package under ``gpu_dedup/`` is found automatically; ``kernels/`` and
``configs/`` sit at the top of the repository and install as
``gpu_dedup.kernels`` and ``gpu_dedup.configs``.
"""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["gpu_dedup", "gpu_dedup.*"]) + ["gpu_dedup.kernels", "gpu_dedup.configs"],
    package_dir={"gpu_dedup.kernels": "kernels", "gpu_dedup.configs": "configs"},
)
