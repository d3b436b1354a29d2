"""A stand-in for CuPy under Numba's CUDA simulator: NumPy arrays that count as device arrays.

Under ``NUMBA_ENABLE_CUDASIM=1`` the GPU backend computes on NumPy arrays (``xp = numpy``), so its
device-resident path (results left where the inputs are, copies through ``to_host`` / ``to_device`` /
``GPUBackend._dev`` counted) never runs.  :func:`fake_cupy` returns a module named ``cupy`` whose arrays
(:class:`DeviceArray`) are a NumPy subclass defined in a module named ``cupy``: ``gpu_dedup.backends``'
``on_device`` and ``array_module`` take them for device arrays, and the simulator's kernels take them as the
arrays a launch reads and writes.  The module keeps its own ledger of what crossed "the bus" (``moved``):
``.get()`` (device to host) and ``asarray`` / ``array`` / ``ascontiguousarray`` of a host array (host to
device), whoever called them, so a test can compare it with the bytes gpu_dedup counted.

It is permissive where CuPy is strict (a NumPy function given a device array just computes): it checks
where data lives and what moves, not that every line would run on CuPy (the ``gpu`` tests do that).
Install it as ``sys.modules["cupy"]`` for ``array_module`` to find it.
"""

import types

import numpy as np


class DeviceArray(np.ndarray):
    """A NumPy array that ``gpu_dedup.backends.on_device`` takes for a CuPy array."""

    ledger = None  # the ``moved`` dict of the fake module that made it

    def get(self):
        if DeviceArray.ledger is not None:
            DeviceArray.ledger["device_to_host_bytes"] += self.nbytes
        return np.array(self.view(np.ndarray), copy=True)


DeviceArray.__module__ = "cupy._core.core"  # what on_device reads: type(a).__module__


def _device(a):
    """Results of NumPy functions as device arrays (tuples and lists element by element)."""
    if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
        return a.view(DeviceArray)
    if isinstance(a, tuple):
        return tuple(_device(v) for v in a)
    if isinstance(a, list):
        return [_device(v) for v in a]
    return a


def fake_cupy():
    """A fresh ``cupy`` stand-in with a zeroed ledger ``moved``."""
    mod = types.ModuleType("cupy")
    mod.moved = {"host_to_device_bytes": 0, "device_to_host_bytes": 0}
    DeviceArray.ledger = mod.moved
    mod.ndarray = DeviceArray

    def upload(a, dtype=None, copy=True, contiguous=False):
        if isinstance(a, DeviceArray):
            out = a.astype(dtype, copy=copy) if dtype is not None else (a.copy() if copy else a)
            return np.ascontiguousarray(out).view(DeviceArray) if contiguous else out
        host = np.array(a, dtype=dtype, copy=True)
        mod.moved["host_to_device_bytes"] += host.nbytes
        return host.view(DeviceArray)

    mod.asarray = lambda a, dtype=None, order=None: upload(a, dtype, copy=False)
    mod.array = lambda a, dtype=None, copy=True, order=None: upload(a, dtype, copy=copy)
    mod.ascontiguousarray = lambda a, dtype=None: upload(a, dtype, copy=False, contiguous=True)
    mod.cuda = types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(synchronize=lambda: None))

    def attribute(name):
        value = getattr(np, name)
        if callable(value) and not isinstance(value, type):
            return lambda *a, **k: _device(value(*a, **k))
        return value

    mod.__getattr__ = attribute
    return mod
