"""Registers, shared memory and occupancy of the signature kernels: the arithmetic, the ptxas parser, and the
tool end to end (NVVM and ptxas, no device; skipped where either is missing)."""

import json
import os
import subprocess
import sys

import pytest

from gpu_dedup.bench import occupancy as occ

PTXAS_OUTPUT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN9gpu_dedup7kernels9hash_cuda13minhash_warps' for 'sm_90'
ptxas info    : Function properties for _ZN9gpu_dedup7kernels9hash_cuda13minhash_warps
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 88 registers, used 1 barriers, 32 bytes smem, 1080 bytes cmem[0]
"""


def test_occupancy_follows_the_calculator():
    # the warp kernel for 260 permutations on sm_90: 88 registers -> 23 warps' worth, 5 blocks of 4 warps
    assert occ.occupancy(88, 4624, 128, (9, 0)) == {"blocks_per_sm": 5, "warps_per_sm": 20, "limited_by": "registers",
                                                     "occupancy": 0.3125}
    full = occ.occupancy(32, 0, 1024, (9, 0))  # 2 blocks of 32 warps fill the SM: both limits bind
    assert full["warps_per_sm"] == 64 and full["occupancy"] == 1.0 and full["limited_by"] == "registers, warps"
    shared = occ.occupancy(32, 48 << 10, 128, (9, 0))  # 48 KiB + 1 KiB reserved per block: 4 blocks in 228 KiB
    assert shared["blocks_per_sm"] == 4 and shared["limited_by"] == "shared memory"
    assert occ.occupancy(255, 0, 32, (9, 0))["warps_per_sm"] == 8  # 255 -> 256 registers: 8 warps of 8192
    assert occ.occupancy(16, 0, 32, (9, 0))["limited_by"] == "blocks"  # 32 one-warp blocks: half the warps
    assert occ.occupancy(16, 0, 32, (8, 6))["warps_per_sm"] == 16
    assert occ.occupancy(32, 300 << 10, 128, (9, 0))["blocks_per_sm"] == 0  # more than a block may have


def test_parse_ptxas_and_arguments():
    got = occ.parse_ptxas(PTXAS_OUTPUT)
    assert got == {"registers": 88, "stack_frame_bytes": 16, "spill_store_bytes": 8, "spill_load_bytes": 12,
                   "static_shared_bytes": 32, "barriers": 1}
    with pytest.raises(ValueError, match="no register count"):
        occ.parse_ptxas("ptxas fatal   : Unresolved extern function")
    assert occ.parse_arch("sm_90") == (9, 0) and occ.parse_case("word:5x128") == ("word", 5, 128)
    with pytest.raises(ValueError, match="sm_75.*H100 and H200: sm_90"):
        occ.parse_arch("sm_75")
    with pytest.raises(Exception, match="char:24x260"):
        occ.parse_case("char:24")


def test_launches_are_the_backends():
    rows = occ.launches("char", 24, 600)  # the warp kernel in two launches (512 + 88), the block kernel in one
    assert [(r["kernel"], r.get("per_lane"), r["permutations"], r["threads"]) for r in rows] == [
        ("warp", 16, 512, 128), ("warp", 3, 88, 128), ("block", None, 600, 512)]
    from gpu_dedup.kernels.hash_cuda import SIM_SCRATCH  # 0 unless another test imported the kernels simulated

    assert rows[0]["dynamic_shared_bytes"] == (SIM_SCRATCH + 66) * 8 + 4 * 128 * 8
    assert rows[2]["dynamic_shared_bytes"] == (600 + 1024) * 4


def test_tool_without_ptxas_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(occ, "find_ptxas", lambda: None)
    assert occ.main(["--cases", "char:5x64"]) == 2
    assert "ptxas is not on the PATH" in capsys.readouterr().err
    assert occ.main(["--arch", "sm_70"]) == 2


def test_tool_compiles_the_kernels_and_reports_registers_and_occupancy(tmp_path):
    from tests.kernels.test_cuda_compile import _nvvm_missing

    if occ.find_ptxas() is None:
        pytest.skip("ptxas is not installed (CUDA toolkit, or the nvidia-cuda-nvcc wheel of numba-cuda[cu12])")
    reason = _nvvm_missing()
    if reason:
        pytest.skip(reason)
    out = tmp_path / "occupancy.json"
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup.bench.occupancy", "--cases", "word:3x40", "--out",
                           str(out)], capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["kernel"], r["variant"]) for r in rows] == [("warp", "minhash_warps[2 per lane, word]"),
                                                          ("block", "minhash_segments")]
    for r in rows:
        assert r["arch"] == "sm_90" and 16 <= r["registers"] <= 255 and r["spill_store_bytes"] == 0
        assert 0 < r["occupancy"] <= 1 and r["warps_per_sm"] == r["blocks_per_sm"] * r["threads"] // 32
    assert rows[0]["stack_frame_bytes"] == 0  # the minima stay in registers
    assert "| word:3x40 | sm_90 | minhash_warps[2 per lane, word] |" in proc.stdout
