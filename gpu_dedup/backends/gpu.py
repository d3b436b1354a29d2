"""GPU backend: the CUDA kernels of ``gpu_dedup.kernels.hash_cuda`` behind the CPU backend's API.

Every method has the CPU backend's arguments and results (same dtypes and
shapes, bit-identical values), and results live where the inputs live:

- **device in, device out**: given CuPy arrays / device
  :class:`~gpu_dedup.backends.strings.StringBuffers` (what :meth:`GPUBackend.normalize_column`
  returns, e.g. the buffers of a cuDF string column), the kernels read them in
  place and the results stay on the device.  This is the single-process GPU run:
  text, signatures, band hashes, buckets, edges and labels never leave the card.
- **host in, host out**: given NumPy arrays, a method uploads what it needs
  (for text, only the byte span the selected documents cover) and returns
  NumPy arrays.  Batches of a corpus larger than the memory bound run so.

Every copy between host and device is counted (``gpu_dedup.backends.count_transfer``),
so ``report.json`` states the bytes each stage moved.

Array allocation goes through ``self.xp``: CuPy on a real device, NumPy when
the backend is built under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``),
where kernels accept host arrays.  That is how CI runs this very class
without a GPU (``tests/kernels/_cudasim_cases.py``).

Components: cuGraph's weakly connected components when cuGraph imports, else
:func:`components_xp` (label propagation with pointer jumping, on CuPy; the
same function runs on NumPy in the tests).  Labels are canonical either way:
the smallest node index of the component, as on the CPU.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import io
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends import Backend, array_module, count_transfer, on_device, parquet_metadata, to_host
from gpu_dedup.backends.arrow_arrays import arrow_array
from gpu_dedup.backends.cpu import signature_values
from gpu_dedup.backends.prepare import prepare as prepare_kernels
from gpu_dedup.backends.strings import StringBuffers, arrow_strings, column_buffers, string_buffers
from gpu_dedup.backends.textnorm import slow_path
from gpu_dedup.errors import ConfigError, InputError, ResourceError
from gpu_dedup.kernels import text_scalar as text_kernel
from gpu_dedup.kernels.params import HashParams

log = logging.getLogger("gpu_dedup")

SEGMENT_BYTES = 1 << 15  # a document is cut into segments of this many bytes (one block each)
SPAN = 1024  # byte positions hashed per round of a block (shared buffer of this many values)
PERM_CHUNK = 8192  # permutations per launch (shared memory: (chunk + span) * 4 bytes <= 48 KiB)
WARP_SEGMENT_BYTES = 1 << 13  # warp kernel: a document is cut into segments of this many bytes (one warp each)
WARPS_PER_BLOCK = 4  # warp kernel: warps per block (independent; one barrier at the kernel's start)
SHARED_BYTES = 48 << 10  # static + dynamic shared memory a block may use without opting in
SIGNATURE_KERNELS = ("warp", "block")  # GPU_DEDUP_SIGNATURE_KERNEL picks one; warp is the default
ITEM_THREADS = 256  # block size of the thread-per-item kernels
# a document's shingle values are sorted in a block's shared memory (8 bytes each) up to this many: 32 KiB, which
# holds the char 5-grams of a 4 KB text; longer documents' values go to two sorts of all of them
SORT_CAP = 4096
PINNED_CHUNK = 64 << 20  # bytes a pinned staging buffer holds (host arrays of twice this or more are staged)
CUDF_CODECS = {"none": None, "snappy": "snappy", "zstd": "ZSTD", "lz4": "LZ4"}  # cudf.DataFrame.to_parquet's names


@dataclass
class DeviceTable:
    """Every column of some Parquet shards in device memory, rows in shard order (:meth:`GPUBackend.read_table`):
    a pylibcudf Table, its top-level column names, and each file's Arrow schema with its footer's key-value
    metadata (``ARROW:schema`` included); ``whole``: the table holds every column of the files (the rows the write
    stage writes), not only some (a removal list's text)."""

    table: object
    names: list
    schemas: list
    whole: bool = True

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows())

    def column(self, name: str):
        return self.table.columns()[self.names.index(name)]

    def take(self, name: str, rows) -> pa.Array:
        """Column ``name`` at ``rows`` (a few dozen: the report's samples), copied to the host."""
        import cupy
        import pylibcudf as plc

        rows = np.asarray(rows, np.int64)
        gathered = plc.copying.gather(plc.Table([self.column(name)]),
                                      plc.Column.from_cuda_array_interface(cupy.asarray(rows)),
                                      plc.copying.OutOfBoundsPolicy.DONT_CHECK)
        return pa.array(gathered.columns()[0].to_arrow())


def _has_map(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_map(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_map(t.value_type)
    return False


def _timestamp_types(t: pa.DataType) -> list:
    """The timestamp types in ``t`` (itself, or its fields' and items' at any depth)."""
    if pa.types.is_timestamp(t):
        return [t]
    if pa.types.is_struct(t):
        return [u for i in range(t.num_fields) for u in _timestamp_types(t.field(i).type)]
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _timestamp_types(t.value_type)
    return []


def _declared_nulls(plc, col, field: pa.Field):
    """Column ``col`` (of Arrow field ``field``) with only the nulls its fields declare: libcudf pushes a struct's
    nulls down into its fields (``make_structs_column``), and its writer refuses nulls in a field written
    ``required``, so a field the input declares not nullable gets its mask back off (its own rows have no nulls;
    the struct's null rows stay the struct's).  New Column objects over the same device buffers, nothing copied."""
    t = field.type
    if pa.types.is_struct(t):
        kids = [_declared_nulls(plc, c, t.field(j)) for j, c in enumerate(col.children())]
        kids = [c if t.field(j).nullable or not c.null_count() else
                plc.Column(c.type(), c.size(), c.data(), None, 0, c.offset(), c.children()) for j, c in enumerate(kids)]
    elif pa.types.is_list(t) or pa.types.is_large_list(t):  # children: offsets, then values
        kids = [col.children()[0], _declared_nulls(plc, col.children()[1], t.value_field)]
    else:
        return col
    return plc.Column(col.type(), col.size(), col.data(), col.null_mask(), col.null_count(), col.offset(), kids)


def _column_metadata(col, field: pa.Field) -> None:
    """Name and nullability of a written column (and of its children) as the input's Arrow field has them."""
    col.set_name(field.name).set_nullability(field.nullable)
    t = field.type
    if pa.types.is_struct(t):
        for j in range(t.num_fields):
            _column_metadata(col.child(j), t.field(j))
    elif pa.types.is_list(t) or pa.types.is_large_list(t):  # a list column's children: offsets, then values
        _column_metadata(col.child(1), t.value_field)


def signature_threads(num_perm: int) -> int:
    """Block size of the signature kernel: one permutation per thread, a warp multiple, 64..512."""
    return int(min(512, max(64, -(-num_perm // 32) * 32)))


def signature_kernel_choice(value: str | None = None, environ=os.environ) -> str:
    """The signature kernel: ``value`` if given, else ``GPU_DEDUP_SIGNATURE_KERNEL``, else ``warp``."""
    choice = value if value is not None else environ.get("GPU_DEDUP_SIGNATURE_KERNEL", "warp")
    if choice not in SIGNATURE_KERNELS:
        raise ConfigError(f"signature kernel {choice!r} (GPU_DEDUP_SIGNATURE_KERNEL) is not one of "
                          f"{', '.join(SIGNATURE_KERNELS)}; unset it for the default (warp)")
    return choice


def warp_launch(num_perm: int, ngram: int, warps: int = WARPS_PER_BLOCK, shared_limit: int = SHARED_BYTES):
    """Geometry of the warp kernel for one launch of ``num_perm`` permutations (at most
    ``32 * PERMS_PER_LANE_MAX``) and n-grams of ``ngram`` tokens: (minima per lane, ring slots per
    warp, warps per block, dynamic shared bytes).  A warp's shared memory holds a ring of the last
    Horner prefixes (a power of two above ``ngram + 32``, so a window's first prefix is still there)
    and its key buffer; the block's holds the 33 powers of the base and of its inverse once.  Warps
    per block shrink (to one) when long n-grams would pass ``shared_limit``."""
    from gpu_dedup.kernels.hash_cuda import KEY_SLOTS, POWERS, SIM_SCRATCH, WARP

    per_lane = -(-num_perm // WARP)
    ring = 1 << (ngram + WARP).bit_length()
    per_warp = (ring + KEY_SLOTS) * 8
    warps = max(1, min(warps, (shared_limit - (SIM_SCRATCH + 2 * POWERS) * 8) // per_warp))
    return per_lane, ring, warps, (SIM_SCRATCH + 2 * POWERS) * 8 + warps * per_warp


def segment_table(starts, ends, seg_bytes: int):
    """Cut documents [starts[k], ends[k]) into segments of at most ``seg_bytes``:
    (document index, first byte, end byte) per segment; empty documents have none.
    Array code of the inputs' module (segment k's document is found by a search in the
    running segment count, so it runs on CuPy as on NumPy)."""
    xp = array_module(starts, ends)
    nseg = (ends - starts + seg_bytes - 1) // seg_bytes
    cum = xp.cumsum(nseg)
    total = int(cum[-1]) if cum.shape[0] else 0
    k = xp.arange(total, dtype=xp.int64)
    seg_doc = xp.searchsorted(cum, k, side="right").astype(xp.int64)
    lo = starts[seg_doc] + (k - (cum - nseg)[seg_doc]) * seg_bytes
    hi = xp.minimum(lo + seg_bytes, ends[seg_doc])
    return seg_doc, lo.astype(xp.int64), hi.astype(xp.int64)


def sorted_unique_segments(xp, offsets, values):
    """Sort each segment ``values[offsets[k]:offsets[k+1]]`` and drop repeats; returns the CSR (offsets,
    values) of the distinct values (:func:`sorted_distinct_counts` without the counts)."""
    out_offsets, distinct, _ = sorted_distinct_counts(xp, offsets, values)
    return out_offsets, distinct


def sorted_distinct_counts(xp, offsets, values):
    """Sort each segment ``values[offsets[k]:offsets[k+1]]``, drop repeats and count them: the CSR
    (offsets, distinct values, how many times each occurred) that the CPU's per-document sort gives.  Two
    stable sorts (by value, then by segment) instead of a per-segment loop; ``xp`` is NumPy or CuPy.  (The GPU
    backend sorts segments that fit a block's shared memory with a kernel instead:
    :meth:`GPUBackend.sorted_distinct_counts`.)"""
    m = offsets.shape[0] - 1
    if values.shape[0] == 0:
        return xp.zeros(m + 1, dtype=xp.int64), values[:0].astype(xp.uint64), xp.zeros(0, dtype=xp.int64)
    return distinct_of_sorted(xp, offsets, sorted_within(xp, offsets, values))


def sorted_within(xp, offsets, values):
    """``values`` with each segment ``offsets[k]:offsets[k+1]`` sorted: two stable sorts of every value, by value
    then by segment."""
    m = offsets.shape[0] - 1
    seg = xp.searchsorted(offsets[1:], xp.arange(values.shape[0], dtype=xp.int64), side="right")
    if m < 2**31:
        seg = seg.astype(xp.int32)  # half the key bits for the second sort
    o1 = xp.argsort(values, kind="stable")
    o2 = xp.argsort(seg[o1], kind="stable")
    return values[o1[o2]]


def distinct_of_sorted(xp, offsets, v):
    """The CSR (offsets, distinct values, their counts) of ``v``, whose segments ``offsets[k]:offsets[k+1]`` are
    each sorted (at least one value)."""
    total = v.shape[0]
    first = xp.ones(total, dtype=bool)
    first[1:] = v[1:] != v[:-1]
    lengths = offsets[1:] - offsets[:-1]
    first[offsets[:-1][lengths > 0]] = True  # a segment's first value, whatever the last one's
    before = xp.zeros(total + 1, dtype=xp.int64)
    before[1:] = xp.cumsum(first)
    starts = xp.flatnonzero(first)
    counts = xp.empty(starts.shape[0], dtype=xp.int64)
    counts[:-1] = starts[1:] - starts[:-1]
    counts[-1:] = total - starts[-1:]
    return before[offsets], v[starts], counts


def _footers(shards) -> tuple[list[str], list[pq.FileMetaData]]:
    """The paths and Parquet footers of ``shards`` (discovered shards, or paths): a discovered shard's footer as
    the process keeps it (read once, by whichever reader opened the shard first: :func:`parquet_metadata`)."""
    return [str(getattr(s, "path", s)) for s in shards], [parquet_metadata(s) for s in shards]


def corpus_estimate(shards, text_column: str, xp=np) -> tuple[int, int]:
    """(text bytes, documents) of ``shards`` from metadata: the text column's uncompressed size and
    the row count of Parquet files, the size of JSONL files (x4 when compressed, ~256 bytes a
    document), the table of in-memory shards.  Unreadable files count 0 (reading reports them)."""
    text = rows = 0
    for shard in shards:
        try:
            if shard.format == "memory":
                rows += shard.data.num_rows
                if text_column in shard.data.column_names:
                    text += shard.data.column(text_column).nbytes
                elif shard.text is not None:  # a cuDF frame's text column, in device memory
                    offsets = column_buffers(shard.text, xp)[0]
                    text += int(offsets[-1] - offsets[0]) + 8 * len(shard.text)
            elif shard.format == "parquet":
                meta = parquet_metadata(shard)  # read once per process (storage.parquet.FOOTERS)
                rows += meta.num_rows
                for g in range(meta.num_row_groups):
                    group = meta.row_group(g)
                    for c in range(group.num_columns):
                        if group.column(c).path_in_schema == text_column:
                            text += group.column(c).total_uncompressed_size
            else:
                compressed = os.path.splitext(str(shard.path))[1] in (".gz", ".zst", ".bz2", ".xz")
                size = (shard.size or os.path.getsize(shard.path)) * (4 if compressed else 1)
                text += size
                rows += size // 256
        except Exception:  # an unreadable shard: the read stage reports it
            continue
    return int(text), int(rows)


def setup_memory() -> dict:
    """One RMM pool for cuDF, CuPy and the kernels, set up once per process.

    Importing cuDF points CuPy at RMM's current device resource.  When that is RMM's default
    (a plain ``cudaMalloc`` per allocation, ``CudaMemoryResource``), a pool wrapping it is made
    the current resource, so the many short-lived arrays of the stages are cheap; a resource the
    user set (a pool, managed memory, a logging or limiting adaptor, ...) is kept as it is.  The
    current resource is wrapped, never replaced by ``rmm.reinitialize``, which is undefined once
    cuDF objects exist.  CuPy then allocates through RMM (``rmm.allocators.cupy``).  Without RMM,
    CuPy keeps its own memory pool.  Returns what was set up (for the run's mode line)."""
    if _MEMORY:
        return _MEMORY
    try:
        import rmm
        from rmm.allocators.cupy import rmm_cupy_allocator
    except Exception:  # RMM not installed: CuPy's own pool
        _MEMORY["allocator"] = "CuPy memory pool"
        return _MEMORY
    import cupy

    current = rmm.mr.get_current_device_resource()
    if type(current) is rmm.mr.CudaMemoryResource:  # RMM's default: wrap it in a pool
        rmm.mr.set_current_device_resource(rmm.mr.PoolMemoryResource(current))
        _MEMORY["allocator"] = "RMM pool (cuDF and CuPy)"
    else:
        _MEMORY["allocator"] = f"RMM {type(current).__name__} set by the caller (cuDF and CuPy)"
    cupy.cuda.set_allocator(rmm_cupy_allocator)
    return _MEMORY


_MEMORY: dict = {}


def steady_reductions(environ=os.environ) -> str:
    """CuPy's reductions (``sum``, ``all``, ``max``, ...) with one compiled kernel per operation and dtype.

    By default CuPy reduces through CUB block reductions, whose kernel is compiled for a block size
    that CuPy picks from the array's length (32 to 512 threads below 2,048 elements).  A run reduces
    arrays of every length (star rounds, pointer-jumping sweeps), and each new block size meant one
    more NVRTC compile of CUB (1.5 to 2 s each on an H100; 10 s of a 24 s run at 10^6 documents,
    although the run had been warmed up on 2,000 documents).  CuPy's own reduction kernel has one
    block size, so each operation compiles once, and then from CuPy's disk cache.  The setting is
    CuPy's, for the process; ``CUPY_ACCELERATORS``, where set, is left as the user chose it.
    Returns what is in effect (for the run's mode line)."""
    if "CUPY_ACCELERATORS" in environ:
        return f"CuPy accelerators {environ['CUPY_ACCELERATORS']!r} (CUPY_ACCELERATORS)"
    try:
        from cupy import _core
    except Exception:  # pragma: no cover - no CuPy: the GPU backend does not start
        return ""
    setter = getattr(_core, "set_reduction_accelerators", None)
    if setter is None:  # a CuPy without the switch: reductions as it does them
        return ""
    setter([])
    return "CuPy reductions without CUB"


def _minimum_at(labels, new, src, dst):
    """NumPy hooking step of :func:`components_xp`."""
    lu = labels[src]
    lv = labels[dst]
    m = np.minimum(lu, lv)
    for target in (lu, lv, src, dst):
        np.minimum.at(new, target, m)


def components_xp(xp, src, dst, n: int, hook=_minimum_at):
    """Connected components by min-label hooking and pointer jumping.

    Each sweep lowers, for every edge (u, v) with m = min(L[u], L[v]), the
    labels of u, v and of the roots L[u], L[v] to m (``hook``), then jumps
    pointers (L = L[L]) until every node points at a root.  Labels only
    decrease and always name a node of the same component; at the fixed point
    both ends of every edge share one root, the component's smallest node.
    """
    labels = xp.arange(n, dtype=xp.int64)
    if n == 0 or src.shape[0] == 0:
        return labels
    while True:
        new = labels.copy()
        hook(labels, new, src, dst)
        while True:
            jumped = new[new]
            if bool((jumped == new).all()):
                break
            new = jumped
        if bool((new == labels).all()):
            return labels
        labels = new


@dataclass
class DeviceText:
    """Normalized texts on the device (``xp`` arrays) and what it took to get them there."""

    offsets: object  # int64, n + 1, from 0
    chars: object  # uint8
    invalid_utf8: int  # documents that had ill-formed UTF-8
    slow_docs: int  # documents normalized on the host (an unstable code point, or repair first)
    bytes_to_host: int  # host<->device traffic of the fallback (bytes)
    bytes_to_device: int


def quiet_low_occupancy() -> None:
    """Turn off numba-cuda's warning for grids under 128 blocks: small batches (a verify chunk, a few
    pairs) legitimately launch small grids.  numba-cuda reads ``numba.cuda.core.config``, which some
    versions alias to ``numba.core.config`` and others keep apart: both are set."""
    for name in ("numba.core.config", "numba.cuda.core.config"):
        try:
            module = importlib.import_module(name)
        except Exception:  # a numba-cuda without its own config module
            continue
        module.CUDA_LOW_OCCUPANCY_WARNINGS = 0


def _lock_simulated_shared_arrays() -> None:
    """Under Numba's CUDA simulator, a block's static shared arrays made under a lock.  The simulator runs a
    block's threads as Python threads and creates a ``cuda.shared.array`` on the first thread to reach its line
    without a lock, so two threads arriving together could each create one and the block work on two arrays
    (seen as the block signature kernel's wrong minima in about one run of three; a device has one array)."""
    import sys
    import threading
    import traceback

    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared = kernelapi.FakeCUDAShared
    if getattr(shared.array, "locked", False):
        return
    make, lock = shared.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer made at launch), or refused
            return make(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = traceback.extract_stack(sys._getframe(1), limit=1)[0][0:2]  # the simulator's key: file, line
        with lock:
            got = self._allocations.get(caller)
            if got is None:
                got = self._allocations[caller] = np.empty(shape, dtype)
        return got

    array.locked = True
    shared.array = array


class GPUBackend(Backend):
    """Same entry points, arguments and results as ``CPUBackend``; kernels on the device."""

    name = "gpu"
    # its read stage launches no kernel (a device reader's libcudf call, or pyarrow's batches put on the device):
    # the kernels load beside it, on the same device (see prepare)
    loads_beside_read = True

    def __init__(self, info: dict | None = None, *, xp=None, threads: int | None = None, span: int = SPAN,
                 seg_bytes: int = SEGMENT_BYTES, item_threads: int = ITEM_THREADS, max_blocks: int | None = None,
                 perm_chunk: int = PERM_CHUNK, compact_gap: int = 1 << 20, signature_kernel: str | None = None,
                 warp_seg_bytes: int | None = None, warps_per_block: int = WARPS_PER_BLOCK, sort_cap: int = SORT_CAP):
        from numba import config as numba_config
        from numba import cuda

        from gpu_dedup.kernels import hash_cuda as kernels

        self.k = kernels
        self.simulator = bool(numba_config.ENABLE_CUDASIM)
        quiet_low_occupancy()
        if xp is None:
            if self.simulator:
                xp = np
            else:
                import cupy as xp
        self.xp = xp
        self.info = dict(info or {})
        self.threads = threads  # None: signature_threads(num_perm)
        self.span = int(span)
        self.seg_bytes = int(seg_bytes)
        self.item_threads = int(item_threads)
        self.perm_chunk = int(perm_chunk)
        self.compact_gap = int(compact_gap)  # host text: gather the selected documents when the span has more
        self.signature_kernel = signature_kernel_choice(signature_kernel)
        self.warp_seg_bytes = int(warp_seg_bytes or min(self.seg_bytes, WARP_SEGMENT_BYTES))
        self.warps_per_block = int(warps_per_block)
        self.sort_cap = int(sort_cap)  # segments of at most this many values are sorted in shared memory
        if self.simulator:
            self.device_name = "CUDA simulator"
            self.max_blocks = int(max_blocks or 4)
            _lock_simulated_shared_arrays()
        else:
            device = cuda.get_current_device()
            self.device_id = int(device.id)  # the device of this process's context (prepare may run on another thread)
            name = device.name
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
            self.max_blocks = int(max_blocks or device.MULTIPROCESSOR_COUNT * 16)
        self._span_dev = None  # (host bytes, lo, hi, device copy of bytes[lo:hi]) of the last host text
        if not self.simulator:
            self.memory = setup_memory()
            self.reductions = steady_reductions()

    # ------------------------------------------------------------------ plumbing

    @property
    def mode(self) -> str:
        where = f"CUDA kernels (numba-cuda) on {self.device_name}"
        if self.info.get("frames") == "cudf":
            frames = ("cuDF reads Parquet text columns (and writes shards with gpu.writer: cudf); text, "
                      "signatures, buckets and graphs in device memory")
        elif self.info.get("cudf_error"):
            frames = ("text, signatures, buckets and graphs in device memory (cuDF is installed but does not "
                      f"import: {self.info['cudf_error'][:200]}; pyarrow reads and writes)")
        else:
            frames = "text, signatures, buckets and graphs in device memory (cuDF not installed: pyarrow writes)"
        pool = getattr(self, "memory", {}).get("allocator")
        if pool:
            frames += f"; {pool}"
        if getattr(self, "reductions", ""):
            frames += f"; {self.reductions}"
        if self.info.get("frames") == "cudf" and self.info.get("io_threads"):
            frames += f"; {self.info['io_threads']}"
        comps = "cuGraph components" if self._cugraph() is not None else "CuPy components"
        return f"gpu: {where}, {frames}, {comps}"

    def prepare(self, cfg) -> float:
        """Compile the CUDA kernels a run with ``cfg`` launches, before the first stage (numba-cuda
        compiles a kernel at its first launch in each process), on a tiny sample; logs once when
        something compiles.  Returns the seconds spent (under the simulator nothing compiles, but the same
        calls run, so a rehearsal exercises them).  Called on another thread (beside the read stage), it
        loads them into the same device's context: this backend's, made current on that thread first."""
        if self.simulator:
            seconds, _ = prepare_kernels(self, cfg)
            return seconds
        with self.xp.cuda.Device(self.device_id):  # its primary context, current on this thread: numba-cuda's too
            seconds, _ = prepare_kernels(self, cfg)
            self.synchronize()
        return seconds

    def synchronize(self) -> None:
        """Wait for the device's queued work (for timings)."""
        if self.xp is not np:
            self.xp.cuda.Device().synchronize()

    def _dev(self, a, dtype=None):
        """``a`` on the device as a contiguous array of ``dtype``: device arrays are used in place
        (cast if needed); host arrays are copied, and the copy counted (under the simulator the copy
        is a NumPy copy: it writes every argument back)."""
        if on_device(a):
            return self.xp.ascontiguousarray(a if dtype is None else a.astype(dtype, copy=False))
        host = np.ascontiguousarray(a, dtype=dtype)
        if self.xp is not np:
            count_transfer("host_to_device_bytes", host.nbytes)
            if host.nbytes >= 2 * PINNED_CHUNK:
                return self._upload(host)
        return self.xp.array(host)

    def _upload(self, host: np.ndarray):
        """A large host array on the device through two pinned staging buffers: while one chunk crosses the
        bus (asynchronously, on its own stream), the next is copied into the other buffer.  A copy from
        pageable memory runs at the speed of the driver's own staging (about 2.3 GB/s measured on an H200);
        this one at the speed of a host memcpy, the bus being faster."""
        import cupyx

        cp = self.xp
        out = cp.empty(host.shape, dtype=host.dtype)
        src = host.reshape(-1).view(np.uint8)
        dst = out.reshape(-1).view(cp.uint8)
        bufs = [cupyx.empty_pinned(PINNED_CHUNK, dtype=np.uint8) for _ in range(2)]
        streams = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]
        done = [None, None]
        for i, lo in enumerate(range(0, src.shape[0], PINNED_CHUNK)):  # one step per 64 MiB
            k = i % 2
            if done[k] is not None:
                done[k].synchronize()  # buffer k has crossed: it may be filled again
            m = min(PINNED_CHUNK, src.shape[0] - lo)
            np.copyto(bufs[k][:m], src[lo:lo + m])
            dst[lo:lo + m].set(bufs[k][:m], stream=streams[k])
            done[k] = streams[k].record()
        for stream in streams:
            stream.synchronize()
        return out

    @staticmethod
    def _host(a) -> np.ndarray:
        return to_host(a)  # counted when ``a`` is on the device

    def _out(self, a, device: bool):
        """A result where the inputs were: left on the device, or copied to the host."""
        return a if device else self._host(a)

    def _span(self, data: np.ndarray, lo: int, hi: int):
        """Device copy of host text bytes ``data[lo:hi]``; the last span is kept, so repeated calls
        inside it (verify's chunks, signature batches of one span) copy nothing more."""
        c = self._span_dev
        if c is None or c[0] is not data or lo < c[1] or hi > c[2]:
            part = data[lo:hi] if hi > lo else np.zeros(1, np.uint8)  # no zero-size arguments
            c = self._span_dev = (data, lo, hi, self._dev(part, np.uint8))
        return c[3][lo - c[1]:] if lo > c[1] else c[3]

    def _text(self, strings: StringBuffers, docs=None):
        """(count, starts, ends, bytes) of the selected documents, on the device.  Device strings are
        read in place; host strings upload only the byte span the selection covers, or, when that span
        holds more than ``compact_gap`` bytes besides twice the selection (scattered documents, e.g. a
        verify chunk of a corpus kept on the host), only the selected documents (an Arrow take)."""
        xp = self.xp
        if on_device(strings.offsets):
            docs = xp.arange(len(strings), dtype=xp.int64) if docs is None else self._dev(docs, np.int64)
            data = strings.data if strings.data.shape[0] else xp.zeros(1, dtype=xp.uint8)
            return docs.shape[0], strings.offsets[docs], strings.offsets[docs + 1], data
        docs = np.arange(len(strings), dtype=np.int64) if docs is None else np.asarray(to_host(docs), np.int64)
        starts = strings.offsets[docs].astype(np.int64)
        ends = strings.offsets[docs + 1].astype(np.int64)
        lo = int(starts.min()) if docs.shape[0] else 0
        hi = int(ends.max()) if docs.shape[0] else 0
        if hi - lo > 2 * int((ends - starts).sum()) + self.compact_gap:
            picked = string_buffers(arrow_strings(strings.offsets, strings.data).take(arrow_array(docs, pa.int64())))
            data = picked.data if picked.data.shape[0] else np.zeros(1, np.uint8)
            return docs.shape[0], self._dev(picked.offsets[:-1]), self._dev(picked.offsets[1:]), self._dev(data)
        return docs.shape[0], self._dev(starts - lo), self._dev(ends - lo), self._span(strings.data, lo, hi)

    def _blocks(self, items: int, per_block: int = 1) -> int:
        return max(1, min(self.max_blocks, -(-items // per_block)))

    def _sig(self, sig):
        """Signature values as a contiguous uint32 device matrix (checked as on the CPU when on the host)."""
        return self._dev(sig, np.uint32) if on_device(sig) else self._dev(signature_values(sig))

    @staticmethod
    def _shingle_args(params: HashParams, shingle: str, ngram: int):
        return (shingle == "word", np.int64(ngram), np.uint64(params.shingle_base), np.uint64(params.word_base),
                np.uint64(params.word_base2))

    def _segments(self, starts, ends):
        seg_doc, lo, hi = segment_table(starts, ends, self.seg_bytes)  # on the device
        return seg_doc.shape[0], (seg_doc, lo, hi)

    def _count_pass(self, data, d_start, d_end, nseg, segs, sargs, threads):
        """Full-shingle counts and first token positions (count kernel)."""
        xp = self.xp
        counts = xp.zeros(d_start.shape[0], dtype=xp.int64)
        first = d_end.copy()
        if nseg:
            self.k.count_segments[self._blocks(nseg), threads](data, d_start, d_end, *segs, *sargs, counts, first)
        return counts, first

    def _short_values(self, data, d_start, d_end, first, short, sargs):
        xvals = self.xp.empty(short.shape[0], dtype=self.xp.uint64)
        if short.shape[0]:
            t = self.item_threads
            self.k.short_values[self._blocks(short.shape[0], t), t](short, data, d_start, d_end, first, *sargs, xvals)
        return xvals

    # ------------------------------------------------------------------ kernels

    def minhash(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None, docs=None):
        """Signatures (len(docs) x num_perm) and shingle counts of the selected documents."""
        out, counts = self.minhash_device(strings, params, shingle, ngram, num_perm, docs)
        device = on_device(strings.offsets)
        return self._out(out, device), self._out(counts, device)

    def minhash_device(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None,
                       docs=None):
        """:meth:`minhash` with the results left on the device (``xp`` arrays)."""
        xp = self.xp
        num_perm = params.num_perm if num_perm is None else int(num_perm)
        m, d_start, d_end, data = self._text(strings, docs)
        if m == 0 or num_perm == 0:
            return xp.empty((m, num_perm), dtype=xp.uint32), xp.zeros(m, dtype=xp.int64)
        sargs = self._shingle_args(params, shingle, ngram)
        if self.signature_kernel == "warp":
            out, counts, first = self._minhash_warps(data, d_start, d_end, params, shingle, ngram, num_perm)
        else:
            out, counts, first = self._minhash_blocks(data, d_start, d_end, params, sargs, num_perm)
        short = xp.flatnonzero((counts == 0) & (first < d_end)).astype(xp.int64)  # left by the block kernel only
        if short.shape[0]:
            xvals = self._short_values(data, d_start, d_end, first, short, sargs)
            a = self._dev(params.a[:num_perm], np.uint32)
            b = self._dev(params.b[:num_perm], np.uint32)
            t = self.item_threads
            self.k.short_signatures[self._blocks(short.shape[0] * num_perm, t), t](short, xvals, a, b, out, counts)
        return out, counts

    def signature_pass(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None,
                       docs=None):
        """What the chosen signature kernel alone returns, on the device: (signatures, full-shingle counts,
        first token offsets).  A first offset counts bytes from the document's start (its length when it
        has no token).  The warp kernel also signs short documents (count 1); the block kernel leaves them
        to :meth:`minhash_device`'s fix-up (count 0, signature ``SENTINEL``).  For tests and benchmarks."""
        num_perm = params.num_perm if num_perm is None else int(num_perm)
        _, d_start, d_end, data = self._text(strings, docs)
        if self.signature_kernel == "warp":
            out, counts, first = self._minhash_warps(data, d_start, d_end, params, shingle, ngram, num_perm)
        else:
            sargs = self._shingle_args(params, shingle, ngram)
            out, counts, first = self._minhash_blocks(data, d_start, d_end, params, sargs, num_perm)
        return out, counts, first - d_start

    def _minhash_warps(self, data, d_start, d_end, params: HashParams, shingle: str, ngram: int, num_perm: int):
        """Warp kernel (``hash_cuda.minhash_warps``): a warp per document segment of at most
        ``warp_seg_bytes``; short documents included.  Returns (signatures, counts, first positions)."""
        from gpu_dedup.kernels.hash_cuda import PERMS_PER_LANE_MAX, WARP, warp_kernel

        xp, m = self.xp, d_start.shape[0]
        out = xp.full((m, num_perm), params.sentinel, dtype=xp.uint32)
        counts = xp.zeros(m, dtype=xp.int64)
        first = d_end.copy()
        seg_doc, lo, hi = segment_table(d_start, d_end, self.warp_seg_bytes)
        if seg_doc.shape[0] == 0 or num_perm == 0:
            return out, counts, first
        mask = (1 << 64) - 1
        base = params.shingle_base
        powers = self._dev(np.array([pow(base, e, 1 << 64) for e in range(WARP + 1)]
                                    + [pow(base, -e, 1 << 64) for e in range(WARP + 1)], np.uint64))
        args = (np.int64(ngram), np.uint64(pow(base, ngram, 1 << 64)), np.uint64(params.word_base),
                np.uint64(params.word_base2 & mask), powers)
        chunk = WARP * PERMS_PER_LANE_MAX
        for p0 in range(0, num_perm, chunk):  # one launch up to 512 permutations
            p1 = min(num_perm, p0 + chunk)
            per_lane, ring, warps, shared = warp_launch(p1 - p0, ngram, 1 if self.simulator else self.warps_per_block)
            a = np.zeros(per_lane * WARP, np.uint32)  # lanes past the last permutation fold into values never stored
            b = np.full(per_lane * WARP, params.sentinel, np.uint32)
            a[:p1 - p0] = params.a[p0:p1]
            b[:p1 - p0] = params.b[p0:p1]
            whole = p0 == 0 and p1 == num_perm
            part = out if whole else xp.full((m, p1 - p0), params.sentinel, dtype=xp.uint32)
            c, f = (counts, first) if p0 == 0 else (xp.zeros(m, dtype=xp.int64), d_end.copy())
            kernel = warp_kernel(per_lane, shingle == "word")
            kernel[self._blocks(seg_doc.shape[0], warps), warps * WARP, 0, shared](
                data, d_start, d_end, seg_doc, lo, hi, *args, np.int64(ring), self._dev(a), self._dev(b), part, c, f
            )
            if not whole:
                out[:, p0:p1] = part
        return out, counts, first

    def _minhash_blocks(self, data, d_start, d_end, params: HashParams, sargs, num_perm: int):
        """Block kernel (``hash_cuda.minhash_segments``): a block per segment of ``seg_bytes``; short
        documents come back with count 0 and a first token.  Returns (signatures, counts, first positions)."""
        xp, m, sentinel = self.xp, d_start.shape[0], params.sentinel
        a = self._dev(params.a[:num_perm], np.uint32)
        b = self._dev(params.b[:num_perm], np.uint32)
        nseg, segs = self._segments(d_start, d_end)
        out = xp.full((m, num_perm), sentinel, dtype=xp.uint32)
        counts = xp.zeros(m, dtype=xp.int64)
        first = d_end.copy()
        threads = self.threads or signature_threads(min(num_perm, self.perm_chunk))
        for p0 in range(0, num_perm, self.perm_chunk):  # one launch unless num_perm > perm_chunk
            p1 = min(num_perm, p0 + self.perm_chunk)
            whole = p0 == 0 and p1 == num_perm
            part = out if whole else xp.full((m, p1 - p0), sentinel, dtype=xp.uint32)
            c, f = (counts, first) if p0 == 0 else (xp.zeros(m, dtype=xp.int64), d_end.copy())
            if nseg:
                shared = (p1 - p0 + self.span) * 4
                self.k.minhash_segments[self._blocks(nseg), threads, 0, shared](
                    data, d_start, d_end, *segs, *sargs, a[p0:p1], b[p0:p1], np.int64(self.span), part, c, f
                )
            if not whole:
                out[:, p0:p1] = part
        return out, counts, first

    def shingle_sets(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, docs=None):
        """Sorted distinct shingle values of each selected document, as CSR (offsets, values)."""
        xp = self.xp
        device = on_device(strings.offsets)
        m, d_start, d_end, data = self._text(strings, docs)
        if m == 0:
            return self._out(xp.zeros(1, dtype=xp.int64), device), self._out(xp.zeros(0, dtype=xp.uint64), device)
        nseg, segs = self._segments(d_start, d_end)
        sargs = self._shingle_args(params, shingle, ngram)
        threads = self.threads or 128
        counts, first = self._count_pass(data, d_start, d_end, nseg, segs, sargs, threads)
        is_short = (counts == 0) & (first < d_end)
        raw_offsets = xp.zeros(m + 1, dtype=xp.int64)
        raw_offsets[1:] = xp.cumsum(counts + is_short.astype(xp.int64))
        raw = xp.empty(int(raw_offsets[-1]), dtype=xp.uint64)
        if nseg and raw.shape[0]:
            cursor = raw_offsets[:-1].copy()
            self.k.emit_segments[self._blocks(nseg), threads, 0, self.span * 8](
                data, d_start, d_end, *segs, *sargs, np.int64(self.span), cursor, raw
            )
        short = xp.flatnonzero(is_short).astype(xp.int64)
        if short.shape[0]:
            raw[raw_offsets[short]] = self._short_values(data, d_start, d_end, first, short, sargs)
        offsets, values, _ = self.sorted_distinct_counts(raw_offsets, raw)
        return self._out(offsets, device), self._out(values, device)

    def sorted_distinct_counts(self, offsets, values):
        """:func:`sorted_distinct_counts` of device arrays, ``values`` sorted in place: each segment of at most
        ``sort_cap`` values by the ``sort_segments`` kernel, a block per segment, in shared memory; longer ones by
        the two stable sorts of their values alone.  The same CSR, bit for bit."""
        xp = self.xp
        m, total = offsets.shape[0] - 1, values.shape[0]
        if total == 0:
            return xp.zeros(m + 1, dtype=xp.int64), values[:0].astype(xp.uint64), xp.zeros(0, dtype=xp.int64)
        lengths = offsets[1:] - offsets[:-1]
        small = xp.flatnonzero((lengths > 1) & (lengths <= self.sort_cap))
        if small.shape[0]:
            longest = int(lengths[small].max())
            room = 1 << (longest - 1).bit_length()  # the longest one's power of two
            threads = self.threads or max(32, min(256, room // 2))  # a thread per pair compared at each step
            self.k.sort_segments[self._blocks(small.shape[0]), threads, 0, room * 8](offsets, small, values)
        big = xp.flatnonzero(lengths > self.sort_cap)
        if big.shape[0]:  # the values of the long segments, sorted together
            sub = xp.zeros(big.shape[0] + 1, dtype=xp.int64)
            sub[1:] = xp.cumsum(lengths[big])
            j = xp.arange(int(sub[-1]), dtype=xp.int64)
            which = xp.searchsorted(sub[1:], j, side="right")
            at = offsets[big][which] + (j - sub[which])
            values[at] = sorted_within(xp, sub, values[at])
        return distinct_of_sorted(xp, offsets, values)

    def jaccard_pairs(self, set_offsets, set_values, left, right) -> np.ndarray:
        xp, e = self.xp, len(left)
        device = on_device(set_values) or on_device(left)
        if e == 0:
            return self._out(xp.empty(0, dtype=xp.float64), device)
        out = xp.empty(e, dtype=xp.float64)
        values = set_values if len(set_values) else np.zeros(1, np.uint64)
        t = self.item_threads
        self.k.jaccard_pairs[self._blocks(e, t), t](
            self._dev(set_offsets, np.int64), self._dev(values, np.uint64), self._dev(left, np.int64),
            self._dev(right, np.int64), out,
        )
        return self._out(out, device)

    def signature_similarity(self, sig, left, right) -> np.ndarray:
        xp, e = self.xp, len(left)
        device = on_device(sig) or on_device(left)
        if e == 0:
            return self._out(xp.empty(0, dtype=xp.float64), device)
        out = xp.empty(e, dtype=xp.float64)
        t = self.item_threads
        self.k.signature_similarity[self._blocks(e, t), t](
            self._sig(sig), self._dev(left, np.int64), self._dev(right, np.int64), out
        )
        return self._out(out, device)

    def band_hashes(self, sig, bands: int, rows: int, band_base: int) -> np.ndarray:
        """One 64-bit hash per band of ``rows`` uint32 signature values: (n, bands) uint64."""
        xp, n, device = self.xp, sig.shape[0], on_device(sig)
        if n == 0 or bands == 0:
            return self._out(xp.empty((n, bands), dtype=xp.uint64), device)
        out = xp.empty((n, bands), dtype=xp.uint64)
        t = self.item_threads
        self.k.band_hashes[self._blocks(n * bands, t), t](
            self._sig(sig), np.int64(bands), np.int64(rows), np.uint64(band_base), out
        )
        return self._out(out, device)

    def exact_hashes(self, strings: StringBuffers, seed1: int, seed2: int) -> np.ndarray:
        """Two 64-bit lanes of the exact-duplicate key of every document: (n, 2) uint64."""
        xp, n, device = self.xp, len(strings), on_device(strings.offsets)
        if n == 0:
            return self._out(xp.empty((0, 2), dtype=xp.uint64), device)
        out = xp.empty((n, 2), dtype=xp.uint64)
        if device:
            offsets = self._dev(strings.offsets, np.int64)
            data = strings.data if strings.data.shape[0] else xp.zeros(1, dtype=xp.uint8)
        else:  # the byte span of the documents, offsets shifted to it
            lo, hi = int(strings.offsets[0]), int(strings.offsets[-1])
            offsets, data = self._dev(strings.offsets - lo, np.int64), self._span(strings.data, lo, hi)
        t = self.item_threads
        self.k.exact_hashes[self._blocks(n, t), t](offsets, data, np.uint64(seed1), np.uint64(seed2), out)
        return self._out(out, device)

    # ------------------------------------------------------------------ text

    def normalize_column(self, column, cfg):
        """Normalized texts of a string column as device :class:`StringBuffers`, and the number
        of documents with ill-formed UTF-8 (the CPU's ``normalize_counted``, bit for bit).

        ``column``: a host Arrow array (its offsets and bytes are copied to the device once,
        counted) or a cuDF Series / pylibcudf Column already on the device (its buffers are
        read in place).  Under the simulator the buffers stay NumPy arrays."""
        offsets, chars, valid = column_buffers(column, self.xp)
        offsets, chars = self._dev(offsets, np.int64), self._dev(chars, np.uint8)
        if valid is not None:
            valid = self._dev(valid, np.bool_)
        out = self.normalize(offsets, chars, cfg, valid)
        return StringBuffers(out.offsets, out.chars), out.invalid_utf8

    def text_reader(self, cfg):
        """The reader of Parquet text columns into device memory (:meth:`read_text`) for a run with
        ``cfg``, or None: cuDF not installed, ``gpu.reader: pyarrow``, or the simulator."""
        if self.info.get("frames") != "cudf" or cfg.gpu.reader != "cudf" or self.simulator:
            return None
        return self.read_text

    def read_text(self, shard, column: str):
        """The string column ``column`` of Parquet shard ``shard`` (a discovered shard, or a path) as a cuDF
        Series in device memory (``cudf.read_parquet``).  The column chunks' compressed bytes are what crosses
        the bus (counted as host->device bytes of the read stage)."""
        import cudf

        (path,), (meta,) = _footers([shard])
        names = [meta.schema.column(j).path.split(".")[0] for j in range(meta.num_columns)]
        chunks = [j for j, name in enumerate(names) if name == column]
        count_transfer("host_to_device_bytes", sum(meta.row_group(g).column(j).total_compressed_size
                                                   for g in range(meta.num_row_groups) for j in chunks))
        try:
            return cudf.read_parquet(path, columns=[column])[column]
        except MemoryError as exc:  # RMM out of device memory
            raise ResourceError(f"out of device memory reading the text of shard {path!r} ({exc}); set "
                                "gpu.memory_limit lower (the run then goes in batches) or gpu.reader: pyarrow") from None
        except (OSError, RuntimeError, ValueError) as exc:  # libcudf's errors
            raise InputError(f"cuDF could not read text column {column!r} of shard {path!r} ({exc}); replace "
                             "the shard, or set gpu.reader: pyarrow to read it on the host") from None

    def table_reader(self, cfg):
        """The reader of all the Parquet shards into device memory in one call (:meth:`read_table`) for a run
        with ``cfg`` (cuDF installed, ``gpu.reader: cudf``): every column where the write stage takes the kept
        rows from them (``output.shards``, ``output.hold_inputs`` not false), else the text column alone (a
        removal list); None without cuDF (pyarrow reads)."""
        if self.text_reader(cfg) is None:
            return None
        if importlib.util.find_spec("pylibcudf") is None:  # cuDF older than pylibcudf: each shard's text column
            return None
        if cfg.output.shards and cfg.output.hold_inputs is not False:
            return self.read_table
        return functools.partial(self.read_table, columns=[cfg.input.text_column])

    def read_table(self, shards, columns: list | None = None, row_groups: list | None = None) -> DeviceTable | None:
        """Every column (or the top-level ``columns``) of the Parquet ``shards`` (discovered shards, or paths) in
        one libcudf read (its decoding spread over the whole device, not one file at a time), rows in file order: a
        :class:`DeviceTable`; None where libcudf cannot read them as one table (their schemas differ, a type it
        lacks): the caller reads each shard's text column instead.  Files that differ only in columns not read
        are one table for ``columns``; so are files whose Arrow types differ within one Parquet type (``string``
        and ``large_string``, ...).  ``row_groups``: the row groups read of each file, in that order (None for a
        file: all of them; a cluster block's pieces).  The files' compressed column chunks are what crosses the bus
        (counted once libcudf has read them)."""
        import pylibcudf as plc

        paths, footers = _footers(shards)  # schema, key-values, chunks
        schemas = [m.schema.to_arrow_schema().with_metadata(m.metadata or {}) for m in footers]
        if columns is not None:
            if any(c not in s.names for s in schemas for c in columns):
                return None
            schemas = [pa.schema([s.field(c) for c in columns], metadata=s.metadata) for s in schemas]
        # what libcudf compares: the files' Parquet schemas (of the columns read), here with nullability (the write
        # gives every file the first one's); string and large_string, plain and dictionary strings are one Parquet
        # type, and each file is written back with its own Arrow types (its ARROW:schema)
        every = [[m.schema.column(j) for j in range(m.num_columns)] for m in footers]
        read = [[j for j, c in enumerate(cs) if columns is None or c.path.split(".")[0] in columns] for cs in every]
        leaves = [[cs[j] for j in js] for cs, js in zip(every, read)]
        if any(len(a) != len(leaves[0]) or not all(x.equals(y) for x, y in zip(a, leaves[0])) for a in leaves[1:]):
            return None
        groups = [list(range(m.num_row_groups)) if row_groups is None or row_groups[k] is None
                  else [int(g) for g in row_groups[k]] for k, m in enumerate(footers)]
        moved = sum(m.row_group(g).column(j).total_compressed_size for m, gs, js in zip(footers, groups, read)
                    for g in gs for j in js)
        try:
            build = plc.io.parquet.ParquetReaderOptions.builder(plc.io.types.SourceInfo(paths))
            if columns is not None:
                # pylibcudf 26.10 deprecates ``columns`` for ``column_names`` (older releases have only ``columns``)
                build = getattr(build, "column_names", build.columns)(list(columns))
                if hasattr(build, "allow_mismatched_pq_schemas"):  # libcudf compares the files' whole schemas else
                    build = build.allow_mismatched_pq_schemas(True)
            options = build.build()
            if row_groups is not None:
                options.set_row_groups(groups)
            got = plc.io.parquet.read_parquet(options)
        except MemoryError as exc:  # RMM out of device memory
            raise ResourceError(f"out of device memory reading {len(paths)} shards into device memory ({exc}); set "
                                "gpu.memory_limit lower (the run then goes in batches), output.hold_inputs: false or "
                                "gpu.reader: pyarrow") from None
        except (OSError, RuntimeError, ValueError, TypeError, NotImplementedError) as exc:  # libcudf's errors
            log.info("cuDF did not read the %d shards as one table (%s); it reads each shard's text column",
                     len(paths), str(exc)[:200])
            return None
        count_transfer("host_to_device_bytes", moved)
        return DeviceTable(got.tbl, list(got.column_names()), schemas, whole=columns is None)

    def block_text_reader(self, cfg):
        """The reader of a cluster block's text column into device memory (``reader(shards, row_groups=...)``:
        the row groups of each shard its pieces cover, in one libcudf read, :meth:`read_table`), where a run with
        ``cfg`` has a table reader; else None (pyarrow reads a block's pieces on the host)."""
        if self.table_reader(cfg) is None:
            return None
        return functools.partial(self.read_table, columns=[cfg.input.text_column])

    def write_table(self, held: DeviceTable, starts, keep, targets, codec: str, streams: int = 1,
                    after=None) -> list | None:
        """The kept rows of ``held`` (shard ``k`` at rows ``starts[k]:starts[k+1]``; ``keep``: bool per row, on the
        host) written to ``targets`` (a file per shard, or an ``io.BytesIO`` per shard: the bytes in host memory): filtered and compressed on the device, every file with its
        shard's own key-value metadata (``ARROW:schema`` included, so pyarrow reads the input's Arrow types back)
        and the input's field names and nullability; timestamps written UTC-adjusted where the input's have a time
        zone, as they are where they have none.  Returns the rows written per file, or None (nothing written)
        where it cannot: a codec libcudf does not write, a map column, timestamps with and without a zone in one
        table, key-value metadata that is not text.  The caller checks each file's logical schema against its
        shard's.

        ``streams`` 1: one libcudf write of every file (its partitions), then ``after(k, rows)`` (the caller's check
        and digest of file ``k``) for each file, a thread per core.  More: a libcudf write per file, up to
        ``streams`` at once (and a thread per core at most), each from a thread of its own on a CUDA stream of its
        own, so that one file's encoding on the device overlaps others' copies to the host, writes to disk and
        digests; ``after(k, rows)`` then runs on file ``k``'s thread as soon as it is written."""
        import pylibcudf as plc

        comp = {"none": "NONE", "snappy": "SNAPPY", "zstd": "ZSTD", "lz4": "LZ4"}.get(codec)
        zoned = {bool(t.tz) for f in held.schemas[0] for t in _timestamp_types(f.type)}
        if comp is None or any(_has_map(f.type) for f in held.schemas[0]) or len(zoned) > 1:
            return None
        try:
            kv = [{k.decode("utf-8"): v.decode("utf-8") for k, v in (s.metadata or {}).items()} for s in held.schemas]
        except UnicodeDecodeError:
            return None
        keep = np.asarray(keep, dtype=bool)
        firsts = np.concatenate(([0], np.cumsum(keep, dtype=np.int64)))[np.asarray(starts, np.int64)]
        counts = np.diff(firsts)
        mask = plc.Column.from_cuda_array_interface(self._dev(keep, np.bool_))
        compaction = plc.stream_compaction  # pylibcudf 26.10 deprecates apply_boolean_mask for apply_retention_mask
        kept = getattr(compaction, "apply_retention_mask", compaction.apply_boolean_mask)(held.table, mask)
        kept = plc.Table([_declared_nulls(plc, c, f) for c, f in zip(kept.columns(), held.schemas[0])])
        meta = plc.io.types.TableInputMetadata(kept)
        for i, field in enumerate(held.schemas[0]):
            _column_metadata(meta.column_metadata[i], field)

        def options(sinks: list, kvs: list, parts: list):
            build = (plc.io.parquet.ParquetWriterOptions.builder(plc.io.types.SinkInfo(sinks), kept)
                     .metadata(meta).key_value_metadata(kvs).compression(getattr(plc.io.types.CompressionType, comp)))
            if zoned == {False} and hasattr(build, "utc_timestamps"):  # libcudf marks them UTC-adjusted by default
                build = build.utc_timestamps(False)
            opts = build.build()
            opts.set_partitions([plc.io.types.PartitionInfo(int(firsts[k]), int(counts[k])) for k in parts])
            return opts

        rows = [int(c) for c in counts]
        threads = max(1, min(len(targets), os.cpu_count() or 1))
        sinks = [t if isinstance(t, io.BytesIO) else str(t) for t in targets]  # files, or host buffers (the probe)
        if streams <= 1 or len(targets) == 1:
            plc.io.parquet.write_parquet(options(sinks, kv, range(len(targets))))
            if after is not None:
                with ThreadPoolExecutor(threads, thread_name_prefix="gpu-dedup-written") as pool:
                    list(pool.map(after, range(len(targets)), rows))
            return rows
        each = [options([t], [kv[k]], [k]) for k, t in enumerate(sinks)]  # one partition of the kept table
        self.xp.cuda.Device().synchronize()  # the kept table, made on the default stream, before other streams read it

        def one(k: int) -> None:
            plc.io.parquet.write_parquet(each[k], self.xp.cuda.Stream(non_blocking=True))
            if after is not None:
                after(k, rows[k])

        with ThreadPoolExecutor(min(streams, threads), thread_name_prefix="gpu-dedup-device-write") as pool:
            list(pool.map(one, range(len(targets))))
        return rows

    @property
    def write_parquet(self):
        """The cuDF writer of kept rows (:meth:`write_parquet_cudf`) where cuDF is installed, else None (the
        write stage then writes on the host, a shard per core)."""
        return self.write_parquet_cudf if self.info.get("frames") == "cudf" else None

    def write_parquet_cudf(self, src, keep, dst: str, compression: str) -> int | None:
        """cuDF writer of the write stage: read Parquet shard ``src`` (a discovered shard, whose footer the
        process already holds, or a path) into device memory, keep the rows
        of ``keep`` and write them to ``dst`` with ``compression``; None when cuDF is not installed, the
        codec is one cuDF cannot write (gzip, brotli), cuDF cannot read or write this shard (a type it
        lacks, device memory), or the shard changed its row count (the host writer then writes, or
        reports the change).

        cuDF marks a column without nulls ``required`` unless told otherwise; the columns are written
        nullable where the input's are all nullable (as pyarrow writes them), so that the schema stays
        the input's and the caller's schema check passes."""
        if self.info.get("frames") != "cudf" or compression not in CUDF_CODECS:
            return None
        import cudf

        (path,), (meta,) = _footers([src])
        nullable = all(field.nullable for field in meta.schema.to_arrow_schema())  # as pq.read_schema gives it
        try:
            frame = cudf.read_parquet(path)
            if len(frame) != keep.shape[0]:
                return None
            mask = self._dev(keep, np.bool_)
            kept = frame[cudf.Series(mask)] if len(frame) else frame
            kept.to_parquet(dst, compression=CUDF_CODECS[compression], index=False, force_nullable_schema=nullable)
        except (MemoryError, RuntimeError, ValueError, NotImplementedError, TypeError) as exc:  # libcudf's errors
            log.debug("cuDF did not write %s (%s): pyarrow writes it", src, exc)
            return None
        return int(len(kept))

    def plan_memory(self, shards, cfg) -> dict:
        """Where a single-process run of ``shards`` keeps its data under ``gpu.memory_limit``.

        The estimate (from Parquet metadata, or the file size of JSONL) counts the text three
        times (raw, normalized, the kernel's scratch) and, per document, its signature, band
        hashes and ~100 bytes of driver arrays.  ``resident``: everything stays in device memory;
        otherwise the run keeps its driver arrays and normalized text in host memory and each
        kernel batch uploads at most ``batch_bytes`` of text (a quarter of the limit)."""
        text, rows = corpus_estimate(shards, cfg.input.text_column, self.xp)
        b, r = cfg.layout
        need = 3 * text + rows * (4 * cfg.signature_perms + 16 * b + 96)
        device = self.device_memory()
        limit = cfg.gpu.limit_bytes(device)
        resident = self.simulator or need <= limit
        return {"memory_limit_bytes": limit, "device_bytes": device, "estimate_bytes": int(need),
                "resident": bool(resident), "batch_bytes": None if resident else max(1 << 20, limit // 4)}

    def device_memory(self) -> int:
        """Total memory of the current device in bytes (0 under the simulator)."""
        if self.simulator:
            return 0
        return int(self.xp.cuda.runtime.memGetInfo()[1])

    def _text_tables(self, form: str):
        """Device copies of the property table of ``form`` (once per backend and form)."""
        cache = self.__dict__.setdefault("_tables_dev", {})
        if form not in cache:
            stage1, stage2 = text_kernel.property_table(form)
            cache[form] = (self._dev(stage1, np.uint16), self._dev(stage2, np.uint64))
        return cache[form]

    def _gather(self, src_values, src, lengths, dst, dst_values) -> None:
        if src.shape[0]:
            self.k.gather_segments[self._blocks(src.shape[0]), self.item_threads](src_values, src, lengths, dst,
                                                                                  dst_values)

    def take_strings(self, strings: StringBuffers, rows) -> StringBuffers:
        """The strings ``rows`` (any order, repeats allowed) of ``strings``, gathered where they are (one
        kernel, no copy of the other strings): new buffers, offsets from 0.  A cluster's payload of a few rows
        of a block's device texts copies those rows' bytes to the host, not the block's."""
        xp = self.xp
        rows = self._dev(rows, np.int64)
        offsets = self._dev(strings.offsets, np.int64)
        starts = offsets[rows]
        lengths = offsets[rows + 1] - starts
        out_offsets = xp.zeros(rows.shape[0] + 1, dtype=xp.int64)
        out_offsets[1:] = xp.cumsum(lengths)
        total = int(out_offsets[-1])
        data = xp.empty(max(1, total), dtype=xp.uint8)  # no zero-size kernel arguments
        if total:
            self._gather(self._dev(strings.data, np.uint8), starts, lengths, out_offsets[:-1], data)
        return StringBuffers(out_offsets, data[:total])

    def normalize(self, offsets, chars, cfg, valid=None) -> DeviceText:
        """Normalize device string buffers (``offsets`` int32/int64 n + 1, ``chars`` uint8, the
        layout of a cuDF / Arrow string column; ``valid``: optional bool mask, nulls read as
        empty) into new device buffers, byte-identical to the CPU's ``normalize_counted``.

        The one-pass kernel of ``kernels/text_scalar.py`` runs a thread per document; only the
        documents it hands back (an unstable code point, or ill-formed UTF-8 whose
        replacement does not fit) cross the bus, go through the host's slow path
        (``gpu_dedup.backends.textnorm.slow_path``: repair, utf8proc, the same kernel) and
        come back; their bytes are counted in the result.
        """
        xp = self.xp
        need = text_kernel.need_mask(cfg.unicode, cfg.lowercase)
        offsets = xp.asarray(offsets).astype(xp.int64)
        n = offsets.shape[0] - 1
        starts = xp.ascontiguousarray(offsets[:-1])
        ends = xp.ascontiguousarray(offsets[1:])
        if valid is not None:
            ends = xp.where(xp.asarray(valid, dtype=bool), ends, starts)
        if chars.shape[0] == 0:
            chars = xp.zeros(1, dtype=xp.uint8)  # no zero-size kernel arguments
        out = xp.empty(chars.shape[0], dtype=xp.uint8)
        lengths = xp.zeros(n, dtype=xp.int64)
        status = xp.zeros(n, dtype=xp.int64)
        if n:
            stage1, stage2 = self._text_tables(cfg.unicode)
            act = self._dev(text_kernel.ascii_actions(cfg.lowercase, cfg.punctuation, cfg.whitespace), np.int64)
            t = self.item_threads
            self.k.normalize_texts[self._blocks(n, t), t](
                chars, starts, ends, stage1, stage2, act, np.int64(need), bool(cfg.lowercase),
                bool(cfg.punctuation), bool(cfg.whitespace), out, starts, lengths, status)
        slow_mask = (status & (text_kernel.UNSTABLE | text_kernel.OVERFLOW)) != 0
        invalid = int(((~slow_mask) & ((status & text_kernel.INVALID) != 0)).sum())
        slow = xp.flatnonzero(slow_mask).astype(xp.int64)
        m = int(slow.shape[0])
        down = up = 0
        if m:
            seg_len = ends[slow] - starts[slow]
            seg_off = xp.zeros(m + 1, dtype=xp.int64)
            seg_off[1:] = xp.cumsum(seg_len)
            seg = xp.empty(max(1, int(seg_off[-1])), dtype=xp.uint8)
            self._gather(chars, starts[slow], seg_len, seg_off[:-1], seg)
            host_seg, host_off = self._host(seg)[: int(seg_off[-1])], self._host(seg_off)
            down = host_seg.nbytes + host_off.nbytes
            fb, fb_off, bad = slow_path(host_seg, host_off, cfg)
            invalid += bad
            fb_dev = self._dev(fb if fb.shape[0] else np.zeros(1, np.uint8), np.uint8)
            fb_off_dev = self._dev(fb_off, np.int64)
            up = fb.nbytes + fb_off.nbytes
            lengths[slow] = fb_off_dev[1:] - fb_off_dev[:-1]
        new_offsets = xp.zeros(n + 1, dtype=xp.int64)
        new_offsets[1:] = xp.cumsum(lengths)
        result = xp.empty(max(1, int(new_offsets[-1])), dtype=xp.uint8)
        ok = xp.flatnonzero(~slow_mask).astype(xp.int64)
        self._gather(out, starts[ok], lengths[ok], new_offsets[ok], result)
        if m:
            self._gather(fb_dev, fb_off_dev[:-1], lengths[slow], new_offsets[slow], result)
        return DeviceText(new_offsets, result[: int(new_offsets[-1])], invalid, m, down, up)

    # ------------------------------------------------------------------ graphs and frames

    @staticmethod
    def _cugraph():
        """cuGraph, or None when it is not installed or does not import (the probe says which)."""
        try:
            import cugraph
        except Exception:
            return None
        return cugraph

    def _hook(self, labels, new, src, dst):
        t = self.item_threads
        self.k.hook_min[self._blocks(src.shape[0], t), t](labels, new, src, dst)

    # ---- cosine (random projections): kernels/cosine_cuda.py, arrays where this backend keeps them
    #
    # Text vectors (SimHash, document frequencies, sparse cosine) read texts as the MinHash kernels do
    # (``_text``): device strings in place, results left on the device; host strings by their byte span, results
    # copied back.
    def simhash_text(self, strings: StringBuffers, docs, bits: int, key: int, word_mode: bool, ngram: int,
                     use_idf: bool, table, shift):
        """SimHash words (len(docs), bits / 64) and feature occurrences of texts ``docs`` (``table``: the idf
        weights, used in place when on the device)."""
        from gpu_dedup.kernels import cosine_cuda

        device = on_device(strings.offsets)
        _, starts, ends, data = self._text(strings, docs)
        cache = self.__dict__.setdefault("_tables_dev", {})
        if "gauss8" not in cache:  # the hyperplane entries' table: copied once
            cache["gauss8"] = self._dev(cosine_cuda.GAUSS8, np.int64)
        # blocks of at most 128 threads: at its 142 registers a thread, three fit an SM where one of 256 does
        threads = min(self.item_threads, cosine_cuda.THREADS)
        out, count = cosine_cuda.simhash_spans_device(starts, ends, data, bits, key, word_mode, int(ngram), use_idf,
                                                      self._dev(table, np.int64), shift, self.xp, threads,
                                                      gauss=cache["gauss8"])
        return self._out(out, device), self._out(count, device)

    def text_features(self, strings: StringBuffers, docs, word_mode: bool, ngram: int):
        """Sorted distinct feature hashes (rule 6) of texts ``docs`` with their counts, as CSR (offsets int64,
        features uint64, tf int64): the feature occurrences counted and written by two kernels, then sorted
        and counted per document (:func:`sorted_distinct_counts`)."""
        from gpu_dedup.kernels import cosine_cuda

        xp, device, t = self.xp, on_device(strings.offsets), self.item_threads
        m, starts, ends, data = self._text(strings, docs)
        raw_offsets = xp.zeros(m + 1, dtype=xp.int64)
        raw_offsets[1:] = xp.cumsum(cosine_cuda.feature_counts_device(starts, ends, data, word_mode, ngram, xp, t))
        raw = cosine_cuda.emit_features_device(starts, ends, data, word_mode, ngram, raw_offsets, xp, t)
        offsets, feat, tf = self.sorted_distinct_counts(raw_offsets, raw)
        return self._out(offsets, device), self._out(feat, device), self._out(tf, device)

    def sparse_norms(self, offsets, features, weights):
        from gpu_dedup.kernels import cosine_cuda

        out = cosine_cuda.sparse_norms_device(self._dev(offsets, np.int64), self._dev(features, np.uint64),
                                              self._dev(weights, np.float64), self.xp, self.item_threads)
        return self._out(out, on_device(features))

    def sparse_cosine_pairs(self, offsets, features, weights, norms, left, right):
        from gpu_dedup.kernels import cosine_cuda

        out = cosine_cuda.sparse_cosine_pairs_device(
            self._dev(offsets, np.int64), self._dev(features, np.uint64), self._dev(weights, np.float64),
            self._dev(norms, np.float64), self._dev(left, np.int64), self._dev(right, np.int64), self.xp,
            self.item_threads)
        return self._out(out, on_device(features) or on_device(left))

    # host arrays go to the device through ``_dev`` (counted); the launchers then use them in place
    def row_norms(self, vectors):
        from gpu_dedup.kernels import cosine_cuda

        out = cosine_cuda.row_norms_device(self._dev(vectors, np.float32), self.xp)
        return self._out(out, on_device(vectors))

    def cosine_pairs(self, vectors, norms, left, right):
        from gpu_dedup.kernels import cosine_cuda

        out = cosine_cuda.cosine_pairs_device(self._dev(vectors, np.float32), self._dev(norms, np.float64),
                                              self._dev(left, np.int64), self._dev(right, np.int64), self.xp)
        return self._out(out, on_device(vectors) or on_device(left))

    def hamming_pairs(self, bits, left, right):
        from gpu_dedup.kernels import cosine_cuda

        out = cosine_cuda.hamming_pairs_device(self._dev(bits), self._dev(left, np.int64), self._dev(right, np.int64),
                                               self.xp)
        return self._out(out, on_device(bits) or on_device(left))

    def components(self, src, dst, n: int) -> np.ndarray:
        """Connected components; label = smallest node index in the component."""
        device = on_device(src)
        if n == 0:
            return self._out(self.xp.zeros(0, dtype=self.xp.int64), device)
        src = self._dev(src, np.int64)
        dst = self._dev(dst, np.int64)
        cugraph = None if self.simulator else self._cugraph()
        if cugraph is not None and src.shape[0]:
            try:
                return self._out(self._components_cugraph(cugraph, src, dst, n), device)
            except Exception as exc:  # pragma: no cover - needs cuGraph
                log.warning("cuGraph components failed (%s); using the CuPy implementation", exc)
        return self._out(components_xp(self.xp, src, dst, n, hook=self._hook), device)

    def _components_cugraph(self, cugraph, src, dst, n):  # pragma: no cover - needs cuGraph
        import cudf

        xp = self.xp
        g = cugraph.Graph(directed=False)
        g.from_cudf_edgelist(cudf.DataFrame({"src": src, "dst": dst}), source="src", destination="dst")
        wcc = cugraph.weakly_connected_components(g)
        wcc["root"] = wcc.groupby("labels")["vertex"].transform("min")
        labels = xp.arange(n, dtype=xp.int64)
        labels[xp.asarray(wcc["vertex"].values, dtype=xp.int64)] = xp.asarray(wcc["root"].values, dtype=xp.int64)
        return labels
