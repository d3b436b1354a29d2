"""The backend seam: one small registry, backends imported lazily.

Stage code asks ``get_backend(name)`` for an object with the kernel entry
points (``minhash``, ``band_hashes``, ``exact_hashes``, ``shingle_sets``,
``jaccard_pairs``, ``signature_similarity``, ``components``, ``normalize_column``)
and the capabilities every backend declares (:class:`Backend`: its array module,
kernel loading, a memory plan, a device text reader, a device Parquet writer),
so executors ask for a capability instead of probing for attributes.  The GPU
module (and with it CuPy / cuDF) is imported only when the GPU backend is
asked for, so a CPU install never needs them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

import numpy

from gpu_dedup.backends import radix
from gpu_dedup.errors import BackendError

log = logging.getLogger("gpu_dedup")

class Backend:
    """What every backend declares besides its kernels; the defaults are the host's (nothing on a device)."""

    name = ""
    device = False  # arrays live in device memory
    xp = numpy  # the array module of this backend's arrays (CuPy on a GPU)

    def prepare(self, cfg) -> float:
        """Load (or compile) the kernels ``cfg`` uses; the seconds it took."""
        return 0.0

    def holds(self, a) -> bool:
        """Whether ``a`` is an array of this backend's memory: its kernels take it in place, no copy."""
        return array_module(a) is self.xp

    normalizes_while_reading = False  # the read stage may normalize each batch of text as it is read (on the host)
    # the kernels may load on a thread of their own while the read stage reads: it runs none of them then
    loads_beside_read = False

    def plan_memory(self, shards, cfg) -> dict | None:
        """How a one-process run fits the device (None: no device memory to plan)."""
        return None

    def text_reader(self, cfg):
        """A reader of Parquet text columns into device memory (``reader(path, column)``), or None."""
        return None

    def reads_device_text(self, cfg) -> bool:
        """The run reads texts in device memory (it has a device text reader): a text column already there
        stays there."""
        return self.text_reader(cfg) is not None

    def table_reader(self, cfg):
        """A reader of whole Parquet shards into device memory in one call (``reader(paths)``: a table of every
        column, rows in shard order, or None where it cannot read them as one table), or None."""
        return None

    def block_text_reader(self, cfg):
        """A reader of a cluster block's text column into device memory (``reader(shards, row_groups=...)``: a
        table of that one column, its pieces' rows in order, or None where it cannot read them as one), or None."""
        return None

    write_parquet = None  # a Parquet writer of kept rows in device memory (``(shard, keep, dst, codec)``), or None
    write_table = None  # a writer of a device table's kept rows, one file per shard in one call (see the GPU's)


_REGISTRY = {
    "cpu": "gpu_dedup.backends.cpu",
    "gpu": "gpu_dedup.backends.gpu_probe",
}


class Traits:
    """What a backend is, known without loading it (a cluster's client decides by it and never starts CUDA):
    ``host``: its kernels take host arrays (a worker may stream, spill and hash texts on the host);
    ``workers``: the Dask cluster its workers form (``local``, or ``cuda``: Dask-CUDA, one worker per GPU);
    ``graph_components``: cuGraph's multi-GPU connected components may run on its workers."""

    def __init__(self, host: bool, workers: str, graph_components: bool):
        self.host, self.workers, self.graph_components = host, workers, graph_components


_TRAITS = {"cpu": Traits(host=True, workers="local", graph_components=False),
           "gpu": Traits(host=False, workers="cuda", graph_components=True)}


def cluster_backend(name: str) -> str:
    """The backend of a cluster's workers for ``name``: ``auto`` is the CPU's (decided on the client without
    touching CUDA: GPU workers only when asked for)."""
    return "cpu" if name == "auto" else name


def traits(name: str) -> Traits:
    """The :class:`Traits` of backend ``name`` (``auto``: a cluster's, the CPU's)."""
    return _TRAITS[cluster_backend(name)]
_CACHE: dict[str, object] = {}
_AUTO_FALLBACK: list[str] = []  # why ``auto`` chose the CPU, once it has (said once per process)


def _load(name: str):
    if name not in _CACHE:
        module = importlib.import_module(_REGISTRY[name])
        _CACHE[name] = module.create()  # raises BackendError when it cannot run here
    return _CACHE[name]


def get_backend(name: str = "auto"):
    """Return the backend object for ``cpu``, ``gpu`` or ``auto`` (GPU if usable, else CPU)."""
    if not isinstance(name, str):
        return name  # already a backend object
    if name not in ("auto", *_REGISTRY):
        raise BackendError(f"backend {name!r} is not known; choose auto, {', '.join(_REGISTRY)}")
    if name != "auto":
        return _load(name)
    if "gpu" in _CACHE or not _AUTO_FALLBACK:
        try:
            return _load("gpu")
        except BackendError as exc:  # the GPU is probed once per process: its absence does not change
            _AUTO_FALLBACK.append(str(exc))
            # without the GPU packages (a CPU install) the CPU is what the user asked for: the reason at -v;
            # with them installed but unusable, the user meant the GPU: said once, at INFO
            installed = importlib.util.find_spec("cupy") is not None
            log.log(logging.INFO if installed else logging.DEBUG, "backend auto: using the CPU (%s)", exc)
    return _load("cpu")


# ---------------------------------------------------------------- array modules
#
# Driver-side stage code (exact groups, buckets, star edges, survivors, ...) is
# written once against an array module ``xp``: NumPy on the CPU backend, CuPy on
# the GPU backend.  It takes ``xp`` from its input arrays, so the CPU tests run
# the very lines the GPU runs.  CuPy is never imported here: an array's module
# is recognised by its type's module name.


def array_module(*arrays):
    """NumPy, or CuPy when any of ``arrays`` is a CuPy array."""
    for a in arrays:
        if on_device(a):
            return importlib.import_module("cupy")
    import numpy

    return numpy


def available_memory() -> int:
    """Bytes of memory available to a new allocation now (Linux: MemAvailable; else half the physical memory)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (OSError, ValueError):  # pragma: no cover
        return 0


def stable_order(*keys):
    """The positions that sort the rows by ``keys[0]``, then ``keys[1]``, ... (ties: the lower position), as
    int64 (``np.lexsort(keys[::-1])``); every key a 1-d array of one length and one array module.  On the host
    a radix sort (:mod:`gpu_dedup.backends.radix`) where it takes them, else one stable sort per key, the most
    significant last (CuPy's sorts are radix sorts)."""
    order = order_or_none(*keys)
    return numpy.arange(keys[0].shape[0], dtype=numpy.int64) if order is None else order


def order_or_none(*keys):
    """:func:`stable_order`, or None where the rows are in that order already (large host frames of integer
    keys, checked in one pass: a caller keeps its rows as they are instead of gathering them in the same order)."""
    if not keys:
        raise ValueError("stable_order needs at least one key")
    xp = array_module(*keys)
    if xp is numpy:
        if keys[0].shape[0] >= radix.RADIX_MIN and all(k.dtype.kind in "biu" for k in keys) and _in_order(keys):
            # the rows as they are: no sort (integer keys: a float key's NaNs compare false and sort last)
            return None
        got = radix.order(keys, available_memory)
        if got is not None:
            return got
    order = xp.argsort(keys[-1], kind="stable")
    for key in reversed(keys[:-1]):
        order = order[xp.argsort(key[order], kind="stable")]
    return order.astype(xp.int64, copy=False)


def _in_order(keys) -> bool:
    """Whether the host rows are in ``keys``' order already (a frame sorted by a stage before, grouped by the
    key it was sorted on): a pass of comparisons per key, 10-30 ms for 10^7 rows where a stable sort of one
    64-bit key takes 0.2-1 s on 2 cores (and NumPy's merge sort of sorted values still copies them twice)."""
    spaced = keys[0][:: max(1, keys[0].shape[0] // 1024)]  # rows far apart: most unsorted keys fall here at once
    if (spaced[1:] < spaced[:-1]).any():
        return False
    tied = None  # rows equal to the next one on every key so far (None: all of them)
    for key in keys:
        a, b = key[:-1], key[1:]
        down = b < a
        if (down if tied is None else down & tied).any():
            return False
        same = b == a
        tied = same if tied is None else tied & same
        if not tied.any():
            return True
    return True


def sorted_copy(a):
    """The values of the 1-d array ``a``, ascending (``xp.sort(a)``; on the host by radix where it takes them)."""
    xp = array_module(a)
    got = radix.sort(a, available_memory) if xp is numpy else None
    return xp.sort(a) if got is None else got


def distinct(a):
    """The distinct values of the 1-d integer array ``a``, ascending (``xp.unique(a)``), by a sort on either
    module.  NumPy 2.3+'s ``np.unique`` of a bare array hashes its values into a node-based set instead, 5-15x
    slower than sorting for the millions of document numbers a run's arrays hold (numpy/numpy#31969)."""
    xp = array_module(a)
    s = sorted_copy(a)
    if s.shape[0] < 2:
        return s
    keep = xp.empty(s.shape[0], dtype=bool)
    keep[0] = True
    xp.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def sorted_find(a, keys):
    """(found, at): whether each value of ``a`` is in the ascending array ``keys``, and its position there
    where it is (a binary search each)."""
    xp = array_module(a, keys)
    if keys.shape[0] == 0 or a.shape[0] == 0:
        return xp.zeros(a.shape[0], dtype=bool), xp.zeros(a.shape[0], dtype=xp.int64)
    at = xp.minimum(xp.searchsorted(keys, a), keys.shape[0] - 1)
    return keys[at] == a, at


def sorted_in(a, keys):
    """Whether each value of ``a`` is in the ascending array ``keys`` (``xp.isin``, by a binary search)."""
    return sorted_find(a, keys)[0]


def flags_fit(top: int, n: int) -> bool:
    """Whether a flag per value below ``top`` costs no more than sorting ``n`` values: values dense enough (a
    run's document numbers) for a table indexed by value instead of a sort or a binary search."""
    return top <= 4 * n + (1 << 20)


def dense_ranks(a, extra=None):
    """(values, ranks): the distinct values of the non-negative integer arrays ``a`` and ``extra``, ascending,
    and the position of each of ``a``'s among them (``values[ranks] == a``).  A flag per value up to the
    largest, where they are dense enough (a run's document numbers), else a sort; either module."""
    xp = array_module(a)
    both = a if extra is None or extra.shape[0] == 0 else xp.concatenate((a, xp.asarray(extra, dtype=a.dtype)))
    if both.shape[0] == 0:
        return both.astype(xp.int64), xp.zeros(0, dtype=xp.int64)
    top = int(both.max()) + 1
    if not flags_fit(top, both.shape[0]):  # sparse: a flag per value would cost more than the sort
        values = distinct(both)
        return values, xp.searchsorted(values, a)
    present = xp.zeros(top, dtype=bool)
    present[both] = True
    values = xp.flatnonzero(present)
    rank = xp.cumsum(present, dtype=xp.int64)
    return values.astype(both.dtype), rank[a] - 1


def on_device(a) -> bool:
    """Whether ``a`` is a CuPy (device) array."""
    return type(a).__module__.split(".")[0] == "cupy"


def host_copy(a):
    """``a`` itself, or its host copy where it is a device array (counted)."""
    return to_host(a) if on_device(a) else a


def host_frame(frame):
    """``frame`` (a dict of columns, nested frames too) with its device columns copied to the host (counted);
    anything that is not a dict as it is.

    A cluster's frames are host arrays on GPU workers as well: the kernels run on the device inside a block's
    task, and what leaves the task (or a device route) is NumPy.  A block's rows, its ranks (a sample sort on
    the host) and what the client routes are host arrays, and a frame that mixed them with CuPy columns failed
    at the first operation joining the two (the first Dask-CUDA run: ``docs["eligible"] & (keys["k0"] != ...)``)."""
    if not isinstance(frame, dict):
        return frame
    return {k: host_frame(v) if isinstance(v, dict) else host_copy(v) for k, v in frame.items()}


def to_module(a, xp):
    """``a`` as an array of ``xp``: copied to the host for NumPy, to the device for CuPy (each counted)."""
    return to_host(a) if xp is numpy else to_device(a, xp)


def texts_for(strings, backend):
    """Kernel buffers (:class:`~gpu_dedup.backends.strings.StringBuffers`) that ``backend`` can read: as they
    are, or on the host (counted) for a backend that computes on the host while the texts are in device
    memory.  A device backend reads host texts itself (a batch's byte span at a time)."""
    if strings is None or not on_device(strings.offsets) or backend.xp is not numpy:
        return strings
    return type(strings)(to_host(strings.offsets), to_host(strings.data))


class ByArrays:
    """One operation with an implementation per array module, chosen by the module of the arrays at hand: the
    one place where code decides by array type.

    ``lines`` runs on any array module (the GPU's CuPy lines, which NumPy runs too); ``host`` (optional) is the
    host's own, usually a Numba kernel taking NumPy arrays.  :meth:`pick` gives the host's for NumPy where
    there is one, ``lines`` otherwise; ``fast=True`` / ``False`` forces one (the tests run the GPU's lines on
    NumPy with ``fast=False``)."""

    def __init__(self, lines, host=None):
        self.lines, self.host = lines, host

    def pick(self, xp, fast: bool | None = None):
        if fast is None:
            fast = self.host is not None and xp is numpy
        return self.host if fast else self.lines


# ---------------------------------------------------------------- Parquet footers
#
# A Parquet shard's footer, for the GPU backend's device readers (their byte counts, the schemas they compare):
# storage.parquet keeps each input's footer once per process and registers its reader here when imported
# (storage sits above the backends and imports them, not the reverse); without it, or for a bare path, the footer
# is read.
_FOOTER_READERS: list = []


def register_footer_reader(read) -> None:
    """``read(shard)``: the FileMetaData of a discovered Parquet shard (the one reader; a later call replaces it)."""
    _FOOTER_READERS[:] = [read]


def parquet_metadata(shard):
    """The FileMetaData of Parquet ``shard``: a discovered shard (anything with a ``path``) through the registered
    reader, else its file's footer read now."""
    if hasattr(shard, "path") and _FOOTER_READERS:
        return _FOOTER_READERS[0](shard)
    import pyarrow.parquet as pq

    return pq.read_metadata(str(getattr(shard, "path", shard)))


# ---------------------------------------------------------------- host <-> device traffic
#
# Every copy between host and device memory that gpu_dedup makes goes through
# ``to_host`` / ``to_device`` (or the GPU backend's helpers, which call
# ``count_transfer``), so a run can say how many bytes crossed the bus in each
# stage (``report.json``: ``stages.NAME.host_to_device_bytes`` /
# ``device_to_host_bytes``).  On the CPU backend nothing is counted.
#
# The copies of a checkpoint's device arrays (``host_later``) are counted apart,
# under ``checkpoint_device_to_host_bytes``: the checkpoint writer's thread makes
# them while the next stages run, so they belong to no stage (a stage's bytes are
# those of ``STAGE_TRANSFERS``); the report's ``gpu`` section gives their total.

CHECKPOINT_COPIES = "checkpoint_device_to_host_bytes"
STAGE_TRANSFERS = ("host_to_device_bytes", "device_to_host_bytes")  # what a stage's own work moves
TRANSFERS = {"host_to_device_bytes": 0, "device_to_host_bytes": 0, CHECKPOINT_COPIES: 0}


def count_transfer(direction: str, nbytes: int) -> None:
    """Add ``nbytes`` to the process-wide counter ``direction`` (a key of ``TRANSFERS``)."""
    TRANSFERS[direction] += int(nbytes)


def transfer_totals() -> dict:
    """A copy of the counters (take two and subtract to get one stage's traffic)."""
    return dict(TRANSFERS)


def to_host(a):
    """A NumPy array of ``a`` (a no-op for NumPy arrays; a counted device-to-host copy for CuPy)."""
    import numpy

    if on_device(a) and hasattr(a, "get"):  # before the NumPy check: a test's stand-in device array is one too
        count_transfer("device_to_host_bytes", a.nbytes)
        return a.get()
    if isinstance(a, numpy.ndarray):
        return a
    return numpy.asarray(a)


def to_device(a, xp):
    """``a`` as an array of ``xp``: a counted host-to-device copy when ``xp`` is CuPy and ``a`` is on the
    host; ``a`` itself when it already is an ``xp`` array."""
    if xp.__name__ != "cupy" or on_device(a):
        return xp.asarray(a)
    import numpy

    a = numpy.ascontiguousarray(a)
    count_transfer("host_to_device_bytes", a.nbytes)
    return xp.asarray(a)


def host_later(arrays: dict):
    """``arrays`` (named arrays that nobody changes any more) for another thread to take to the host: ``arrays``
    itself where none is a device array, else a function (to be called once, on that thread) that returns them
    with each device array copied to the host, counted under ``checkpoint_device_to_host_bytes``.

    Nothing is copied here: an event is recorded on the current CuPy stream, and the function copies on a
    non-blocking stream of its own that waits for that event.  The current stream is the legacy default stream
    (where CuPy's operations and numba-cuda's kernel launches go, unless a caller chose another stream), so the
    copy waits for the work that made the arrays, and, not synchronizing with the default stream, does not hold
    back the kernels launched after this call while it runs.  A function never called (a checkpoint dropped at
    the commit) copies nothing; the host arrays it returns are byte for byte ``to_host``'s."""
    if not any(on_device(a) for a in arrays.values()):
        return arrays
    cp = array_module(*arrays.values())
    ready = cp.cuda.Event(disable_timing=True)
    ready.record(cp.cuda.get_current_stream())  # after the work queued so far (kernels run later: async)
    device = cp.cuda.Device().id  # where the event and the arrays are

    def copy() -> dict:
        with cp.cuda.Device(device):
            stream = cp.cuda.Stream(non_blocking=True)
            stream.wait_event(ready)
            out = {}
            for name, a in arrays.items():
                if on_device(a):
                    out[name] = a.get(stream=stream)  # C order, as to_host's; the GIL is released while it copies
                    count_transfer(CHECKPOINT_COPIES, a.nbytes)
                else:
                    out[name] = a
            stream.synchronize()
        return out

    return copy
