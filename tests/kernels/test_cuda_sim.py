"""The CUDA kernels, run by Numba's CUDA simulator in a child process, equal the CPU kernels.

``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is first imported,
and this process keeps the real ``njit`` CPU kernels, so the simulated cases
(``_cudasim_cases.py``) run in a fresh interpreter with the variable set.
This test fails if any case fails, errors or is skipped, or if none ran.
"""

from pathlib import Path

from tests.simulated import run_simulated

CASES = Path(__file__).with_name("_cudasim_cases.py")


def test_cuda_kernels_under_simulator_equal_cpu_kernels():
    run_simulated([CASES], at_least=25)
