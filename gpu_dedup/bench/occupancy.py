"""Registers, shared memory and theoretical occupancy of the signature kernels, from ptxas (no GPU needed).

    python -m gpu_dedup.bench.occupancy [--arch sm_90] [--cases char:24x260 char:5x128 word:5x128] [--out X.json]

For each case (shingles x permutations) the warp kernel (``hash_cuda.minhash_warps``, the variant the
backend launches for it) and the block kernel (``hash_cuda.minhash_segments``) are compiled to PTX by
numba-cuda's NVVM (as a device would compile them), then by ``ptxas -v`` for ``--arch``; the table gives
registers per thread, spills, local memory (a stack frame means the minima did not stay in registers),
static and launch (dynamic) shared memory, threads per block, the resident blocks and warps per SM and
what limits them, and the theoretical occupancy (resident warps / the SM's maximum).  On a device the
benchmark (``python -m gpu_dedup.bench.gpu``) reads the same numbers from the loaded kernels instead
(:func:`device_resources`).

Occupancy follows NVIDIA's occupancy calculator: registers are allocated per warp in units of 256, shared
memory per block in units of 128 bytes plus 1 KiB the system reserves per block (compute capability 8.0
and later), with the per-SM limits of ``LIMITS``.  It is the resident share of the SM's warps, not a
measured speed.

Needs numba-cuda's NVVM and ptxas (the CUDA toolkit, or the ``nvidia-cuda-nvcc`` wheel numba-cuda's
``cu12``/``cu13`` extras install).  Without a device the compute capability the compiler asks for is
``--arch``'s.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

# per-SM limits by compute capability (CUDA C++ Programming Guide, technical specifications)
_KEYS = ("warps", "blocks", "registers", "shared", "shared_block")
LIMITS = {
    (8, 0): dict(zip(_KEYS, (64, 32, 65536, 167936, 166912))),
    (8, 6): dict(zip(_KEYS, (48, 16, 65536, 102400, 101376))),
    (8, 9): dict(zip(_KEYS, (48, 24, 65536, 102400, 101376))),
    (9, 0): dict(zip(_KEYS, (64, 32, 65536, 233472, 232448))),
}  # resident warps, blocks, 32-bit registers, shared bytes per SM; shared bytes a block may use
REGISTER_UNIT = 256  # registers are allocated per warp in units of this many
SHARED_UNIT = 128  # bytes
SHARED_RESERVED = 1024  # bytes the system reserves per block (compute capability 8.0 and later)
CASES = ("char:24x260", "char:5x128", "word:5x128")  # nemo_curator's 20 x 13 bands, char and word 5-grams


def parse_arch(arch: str) -> tuple[int, int]:
    """``sm_90`` -> (9, 0)."""
    found = re.fullmatch(r"sm_(\d+)(\d)", arch)
    if not found or (int(found.group(1)), int(found.group(2))) not in LIMITS:
        known = ", ".join(f"sm_{a}{b}" for a, b in LIMITS)
        raise ValueError(f"--arch {arch!r} is not one of {known} (H100 and H200: sm_90)")
    return int(found.group(1)), int(found.group(2))


def parse_case(spec: str) -> tuple[str, int, int]:
    """``char:24x260`` -> ("char", 24, 260)."""
    found = re.fullmatch(r"(char|word):(\d+)x(\d+)", spec)
    if not found or int(found.group(2)) < 1 or int(found.group(3)) < 1:
        raise argparse.ArgumentTypeError(f"case {spec!r} must look like char:24x260 (shingles:n x permutations)")
    return found.group(1), int(found.group(2)), int(found.group(3))


def occupancy(registers: int, shared_bytes: int, threads: int, cc=(9, 0)) -> dict:
    """Theoretical occupancy of a kernel using ``registers`` per thread and ``shared_bytes`` (static plus
    dynamic) per block of ``threads`` threads: resident blocks and warps per SM, the limits that bind, and
    resident warps over the SM's maximum."""
    lim = LIMITS[tuple(cc)]
    warps = -(-threads // 32)
    per_warp = -(-max(registers, 1) * 32 // REGISTER_UNIT) * REGISTER_UNIT
    block_shared = -(-(shared_bytes + SHARED_RESERVED) // SHARED_UNIT) * SHARED_UNIT
    by = {"registers": (lim["registers"] // per_warp) // warps,
          "shared memory": lim["shared"] // block_shared if shared_bytes <= lim["shared_block"] else 0,
          "warps": lim["warps"] // warps, "blocks": lim["blocks"]}
    blocks = min(by.values())
    limit = ", ".join(k for k, v in by.items() if v == blocks)  # every limit that binds
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps, "limited_by": limit,
            "occupancy": round(blocks * warps / lim["warps"], 4)}


def find_ptxas() -> str | None:
    """ptxas on the PATH, or the one of the ``nvidia-cuda-nvcc`` wheel."""
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as nvcc  # the wheel numba-cuda[cu12] installs
    except ImportError:
        return None
    for base in list(getattr(nvcc, "__path__", [])):
        cand = os.path.join(base, "bin", "ptxas")
        if os.path.exists(cand):
            return cand
    return None


def parse_ptxas(text: str) -> dict:
    """Registers, spills, stack frame, static shared memory and barriers from ``ptxas -v`` output (one kernel)."""

    def grab(pattern, default=0):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else default

    if not re.search(r"Used (\d+) registers", text):
        raise ValueError(f"no register count in ptxas output: {text[-500:]!r}")
    return {"registers": grab(r"Used (\d+) registers"), "stack_frame_bytes": grab(r"(\d+) bytes stack frame"),
            "spill_store_bytes": grab(r"(\d+) bytes spill stores"), "spill_load_bytes": grab(r"(\d+) bytes spill loads"),
            "static_shared_bytes": grab(r"(\d+) bytes smem"), "barriers": grab(r"used (\d+) barriers")}


def ptxas_resources(ptx: str, cc=(9, 0), ptxas: str | None = None) -> dict:
    """:func:`parse_ptxas` of ``ptxas -v -arch=sm_XY`` on ``ptx``."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise FileNotFoundError("ptxas is not on the PATH (install the CUDA toolkit, or pip install "
                                "'numba-cuda[cu12]', whose nvidia-cuda-nvcc wheel has it)")
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", src, "-o", os.path.join(tmp, "kernel.cubin")],
                              capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"ptxas failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return parse_ptxas(proc.stderr)


def _answer_device_query(cc) -> None:
    """Let numba-cuda compile device functions without a device: its query for the current device's
    compute capability gets ``cc`` (only when no device answers)."""
    import types

    from numba import cuda
    from numba.cuda import dispatcher

    if not cuda.is_available():
        dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=tuple(cc))


def _warp_signature():
    from numba import types as t

    u8, i64, u32, u64 = t.uint8[::1], t.int64[::1], t.uint32[::1], t.uint64[::1]
    return (u8, i64, i64, i64, i64, i64, t.int64, t.uint64, t.uint64, t.uint64, u64, t.int64, u32, u32,
            t.uint32[:, ::1], i64, i64)


def _block_signature():
    from numba import types as t

    u8, i64, u32 = t.uint8[::1], t.int64[::1], t.uint32[::1]
    return (u8, i64, i64, i64, i64, i64, t.boolean, t.int64, t.uint64, t.uint64, t.uint64, u32, u32, t.int64,
            t.uint32[:, ::1], i64, i64)


def launches(kind: str, n: int, num_perm: int) -> list[dict]:
    """The launches the GPU backend makes for one case: kernel, variant, threads per block, dynamic shared bytes."""
    from gpu_dedup.backends.gpu import (
        PERM_CHUNK,
        SPAN,
        WARPS_PER_BLOCK,
        signature_threads,
        warp_launch,
    )
    from gpu_dedup.kernels.hash_cuda import PERMS_PER_LANE_MAX, WARP

    out = []
    chunk = WARP * PERMS_PER_LANE_MAX
    for p0 in range(0, num_perm, chunk):
        perms = min(chunk, num_perm - p0)
        per_lane, ring, warps, shared = warp_launch(perms, n, WARPS_PER_BLOCK)
        out.append({"kernel": "warp", "variant": f"minhash_warps[{per_lane} per lane, {kind}]", "per_lane": per_lane,
                    "word": kind == "word", "permutations": perms, "threads": warps * WARP, "dynamic_shared_bytes": shared,
                    "ring_slots": ring})
    perms = min(num_perm, PERM_CHUNK)
    out.append({"kernel": "block", "variant": "minhash_segments", "permutations": perms,
                "threads": signature_threads(perms), "dynamic_shared_bytes": (perms + SPAN) * 4})
    return out


def kernel_resources(cases=CASES, cc=(9, 0), log=print) -> list[dict]:
    """Compile each case's launches (PTX by NVVM, then ptxas for ``cc``) and return their resources and
    theoretical occupancy, one row per launch (the warp kernel's, then the block kernel's)."""
    _answer_device_query(cc)
    from numba.cuda import compile_ptx

    from gpu_dedup.kernels import hash_cuda as k

    if compile_ptx is None:
        raise RuntimeError("numba-cuda's compiler is not available here (under NUMBA_ENABLE_CUDASIM=1 there is "
                           "none): run without the simulator")
    rows, seen = [], {}
    for case in cases:
        kind, n, num_perm = parse_case(case) if isinstance(case, str) else case
        for launch in launches(kind, n, num_perm):
            key = (launch["variant"],)
            if key not in seen:
                if launch["kernel"] == "warp":
                    fn, sig = k.warp_kernel(launch["per_lane"], launch["word"]), _warp_signature()
                else:
                    fn, sig = k.minhash_segments, _block_signature()
                ptx, _ = compile_ptx(fn.py_func, sig, cc=tuple(cc))
                seen[key] = ptxas_resources(ptx, cc)
            res = seen[key]
            row = {"case": f"{kind}:{n}x{num_perm}", "arch": f"sm_{cc[0]}{cc[1]}", **launch, **res,
                   **occupancy(res["registers"], res["static_shared_bytes"] + launch["dynamic_shared_bytes"],
                               launch["threads"], cc)}
            rows.append(row)
            log(_line(row))
    return rows


def device_resources(gpu, kind: str, n: int, num_perm: int) -> list[dict]:
    """The same rows for a real device, from the kernels it has loaded (registers of the cubin the driver
    runs, the device's compute capability); launches not compiled yet are left out."""
    from numba import cuda

    from gpu_dedup.kernels import hash_cuda as k

    cc = tuple(cuda.get_current_device().compute_capability)
    rows = []
    for launch in launches(kind, n, num_perm):
        fn = k.warp_kernel(launch["per_lane"], launch["word"]) if launch["kernel"] == "warp" else k.minhash_segments
        if not getattr(fn, "overloads", None):
            continue
        regs = max(fn.get_regs_per_thread().values())
        static = max(fn.get_shared_mem_per_block().values())
        local = max(fn.get_local_mem_per_thread().values())
        row = {"case": f"{kind}:{n}x{num_perm}", "arch": f"sm_{cc[0]}{cc[1]}", **launch, "registers": regs,
               "local_bytes": local, "static_shared_bytes": static}
        if cc in LIMITS:
            row.update(occupancy(regs, static + launch["dynamic_shared_bytes"], launch["threads"], cc))
        rows.append(row)
    return rows


def _line(r: dict) -> str:
    occ = f"{r['occupancy'] * 100:5.1f}% ({r['warps_per_sm']} warps/SM, {r['limited_by']})" if "occupancy" in r else ""
    spill = r.get("stack_frame_bytes", r.get("local_bytes", 0))
    return (f"{r['case']:>12} {r['arch']} {r['variant']:<34} {r['registers']:>4} regs  local {spill:>4} B  "
            f"shared {r['static_shared_bytes'] + r['dynamic_shared_bytes']:>6} B  {r['threads']:>4} threads  {occ}")


def markdown(rows: list[dict]) -> str:
    lines = [("| case | arch | kernel | registers | local B | shared B/block | threads/block | warps/SM | limited by | "
              "occupancy |"), "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for r in rows:
        occ = f"{r['occupancy'] * 100:.1f}%" if "occupancy" in r else ""
        lines.append(f"| {r['case']} | {r['arch']} | {r['variant']} | {r['registers']} | "
                     f"{r.get('stack_frame_bytes', r.get('local_bytes', ''))} | "
                     f"{r['static_shared_bytes'] + r['dynamic_shared_bytes']} | {r['threads']} | "
                     f"{r.get('warps_per_sm', '')} | {r.get('limited_by', '')} | {occ} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpu_dedup.bench.occupancy", description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="sm_90", help="target architecture (default sm_90: H100, H200)")
    p.add_argument("--cases", nargs="+", default=list(CASES), type=parse_case,
                   help="shingles:n x permutations, e.g. char:24x260 word:5x128")
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args(argv)
    try:
        cc = parse_arch(args.arch)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if find_ptxas() is None:
        print("error: ptxas is not on the PATH; install the CUDA toolkit, or pip install 'numba-cuda[cu12]' "
              "(its nvidia-cuda-nvcc wheel has ptxas)", file=sys.stderr)
        return 2
    try:
        rows = kernel_resources(args.cases, cc)
    except (RuntimeError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(markdown(rows))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"arch": args.arch, "rows": rows}, f, indent=1)
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
