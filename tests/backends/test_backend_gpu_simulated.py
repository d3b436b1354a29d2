"""``pytest --backend gpu`` rehearsed without a GPU: the simulator's kernels on stand-in device arrays.

``--backend gpu`` hands every test that asks for the CPU backend the GPU backend.  On the H200 (2026-11-28)
ten tests failed that way, on their own CPU assumptions and on one latent check of the cluster code.  Here
the small ones among them run in a child process under ``NUMBA_ENABLE_CUDASIM=1`` with
``GPU_DEDUP_FAKE_DEVICE=1`` (tests/conftest.py): the GPU backend's arrays are ``tests/fake_cupy.py``'s, which
gpu_dedup takes for device arrays and which, like CuPy, refuse to be mixed with host arrays.  Before the
fixes three of these four failed here as on the H200 (the fourth, the ``auto`` spill accounting, failed
there only because device texts could not be written to a file, which the stand-in allows).  The others
(a planted corpus of thousands of documents through the simulator) are left to a GPU.
"""

from tests.simulated import run_simulated

TESTS = [
    "tests/stages/test_verify_cosine.py::test_vector_exact_similarity_runs_on_the_backend_it_is_given",
    "tests/run/test_cluster_outputs.py::test_signature_values_go_with_the_task_that_makes_the_bands",
    "tests/run/test_cluster_outputs.py::test_spilled_texts_are_the_normalized_texts_mapped_only_while_read",
    ("tests/run/test_cluster_outputs.py::"
     "test_auto_keeps_a_runs_texts_in_memory_up_to_a_share_of_the_worker_and_spills_past_it"),
    "tests/backends/test_prepare.py::test_prepare_normalizes_on_the_backend",
    "tests/backends/test_prepare.py::test_a_cosine_run_prepares_its_own_kernels_not_minhash",
    "tests/run/test_sequence.py::test_the_tables_thread_is_handed_host_arrays",
]
CASES = len(TESTS) + 1  # the last one runs for text and for vectors


def test_backend_gpu_tests_pass_on_simulated_device_arrays():
    run_simulated(TESTS, exactly=CASES, env={"GPU_DEDUP_FAKE_DEVICE": "1"}, args=("--backend", "gpu"))
