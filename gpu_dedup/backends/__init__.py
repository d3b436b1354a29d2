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

import numpy

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

    def plan_memory(self, shards, cfg) -> dict | None:
        """How a one-process run fits the device (None: no device memory to plan)."""
        return None

    def text_reader(self, cfg):
        """A reader of Parquet text columns into device memory (``reader(path, column)``), or None."""
        return None

    def table_reader(self, cfg):
        """A reader of whole Parquet shards into device memory in one call (``reader(paths)``: a table of every
        column, rows in shard order, or None where it cannot read them as one table), or None."""
        return None

    write_parquet = None  # a Parquet writer of kept rows in device memory (``(src, keep, dst, codec)``), or None
    write_table = None  # a writer of a device table's kept rows, one file per shard in one call (see the GPU's)


_REGISTRY = {
    "cpu": "gpu_dedup.backends.cpu",
    "gpu": "gpu_dedup.backends.gpu_probe",
}
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


def on_device(a) -> bool:
    """Whether ``a`` is a CuPy (device) array."""
    return type(a).__module__.split(".")[0] == "cupy"


# ---------------------------------------------------------------- host <-> device traffic
#
# Every copy between host and device memory that gpu_dedup makes goes through
# ``to_host`` / ``to_device`` (or the GPU backend's helpers, which call
# ``count_transfer``), so a run can say how many bytes crossed the bus in each
# stage (``report.json``: ``stages.NAME.host_to_device_bytes`` /
# ``device_to_host_bytes``).  On the CPU backend nothing is counted.

TRANSFERS = {"host_to_device_bytes": 0, "device_to_host_bytes": 0}


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
