"""What the benchmarks record of the machine: what fresh host memory costs there."""

import os


def test_first_touch_is_timed_for_both_kinds_of_array():
    from gpu_dedup.bench import first_touch_seconds, host_memory

    t = first_touch_seconds(8 << 20)
    assert set(t) == {"numpy", "small_pages"} and all(v > 0 for v in t.values())
    info = host_memory()
    assert set(info["first_touch_512mib_seconds"]) == {"numpy", "small_pages"}
    if os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert "[" in info["thp_enabled"]  # the kernel marks the setting in force
