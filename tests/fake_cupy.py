"""A stand-in for CuPy under Numba's CUDA simulator: NumPy arrays that count as device arrays.

Under ``NUMBA_ENABLE_CUDASIM=1`` the GPU backend computes on NumPy arrays (``xp = numpy``), so its
device-resident path (results left where the inputs are, copies through ``to_host`` / ``to_device`` /
``GPUBackend._dev`` counted) never runs.  :func:`fake_cupy` returns a module named ``cupy`` whose arrays
(:class:`DeviceArray`) are a NumPy subclass defined in a module named ``cupy``: ``gpu_dedup.backends``'
``on_device`` and ``array_module`` take them for device arrays, and the simulator's kernels take them as the
arrays a launch reads and writes.  The module keeps its own ledger of what crossed "the bus" (``moved``):
``.get()`` (device to host) and ``asarray`` / ``array`` / ``ascontiguousarray`` of a host array (host to
device), whoever called them, so a test can compare it with the bytes gpu_dedup counted; and a log (``calls``)
of the ``.get()`` copies and of what its ``cuda`` stand-ins (streams, events) were asked, with the thread that asked.

Like CuPy it refuses to mix: a NumPy ufunc or function given a device array and a host array (with at least
one element) raises CuPy's ``TypeError`` (comparing device results with host ones, the bug of several tests
under ``--backend gpu``).  It is permissive where NumPy gives it no say: ``np.asarray`` of a device array
(CuPy raises) returns the data.  It checks where data lives and what moves, not that every line would run
on CuPy (the ``gpu`` tests do that).  Install it as ``sys.modules["cupy"]`` for ``array_module`` to find it.

Like CuPy's, its arrays have a ``__cuda_array_interface__`` (what ``pylibcudf.Column.from_cuda_array_interface``
takes), and ``asarray`` / ``array`` of any object that has one (a pylibcudf ``gpumemoryview``, e.g. of
``tests/fake_pylibcudf.py``) is a view of that memory, not a copy, nothing counted: the stand-in device memory is
host memory, so the interface's pointer is one NumPy can read (:func:`interface_view`).
"""

import threading
import types

import numpy as np


class DeviceArray(np.ndarray):
    """A NumPy array that ``gpu_dedup.backends.on_device`` takes for a CuPy array."""

    ledger = None  # the ``moved`` dict of the fake module that made it
    calls = None  # the ``calls`` list of that module

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _refuse_host(inputs + tuple(kwargs.get("out", ())))
        plain = [a.view(np.ndarray) if isinstance(a, DeviceArray) else a for a in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(a.view(np.ndarray) if isinstance(a, DeviceArray) else a for a in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        return result if method == "at" else _device(result)

    def __array_function__(self, func, types, args, kwargs):
        _refuse_host(args)
        _refuse_host(tuple(kwargs.values()))
        return _device(super().__array_function__(func, (np.ndarray,), _plain(args), _plain(kwargs)))

    @property
    def __cuda_array_interface__(self) -> dict:
        """CuPy's description of the array's memory (version 3; ``strides`` None where C-contiguous)."""
        contiguous = self.flags.c_contiguous
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (int(self.ctypes.data), False),
                "strides": None if contiguous else self.strides, "descr": [("", self.dtype.str)], "stream": None,
                "version": 3}

    def get(self, stream=None, order="C", out=None, blocking=True):
        if DeviceArray.ledger is not None:
            DeviceArray.ledger["device_to_host_bytes"] += self.nbytes
        if DeviceArray.calls is not None:
            DeviceArray.calls.append(("get", threading.current_thread().name, stream))
        host = np.array(self.view(np.ndarray), copy=True, order=order)
        if out is not None:
            out[...] = host
            return out
        return host


DeviceArray.__module__ = "cupy._core.core"  # what on_device reads: type(a).__module__


class _HostInterface:
    """An ``__array_interface__`` over the memory a ``__cuda_array_interface__`` describes (the stand-in device
    memory is host memory); keeps ``owner`` alive as long as a view of it."""

    def __init__(self, cai: dict, owner):
        self.__array_interface__ = {k: cai[k] for k in ("shape", "typestr", "data", "strides") if k in cai}
        self.__array_interface__["version"] = 3
        self.owner = owner


def interface_view(obj) -> np.ndarray:
    """The memory of an object with a ``__cuda_array_interface__`` as a NumPy array (no copy): what
    ``cupy.asarray`` gives for it on a device."""
    cai = obj.__cuda_array_interface__
    if cai.get("mask") is not None:
        raise NotImplementedError("CuPy does not take a masked __cuda_array_interface__")
    shape = tuple(cai["shape"])
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype=np.dtype(cai["typestr"]))
    return np.asarray(_HostInterface(cai, obj))


def _refuse_host(values) -> None:
    """CuPy's refusal of a host array where device arrays are: a NumPy array with elements, in ``values``
    (lists and tuples searched too)."""
    for v in values:
        if isinstance(v, (list, tuple)):
            _refuse_host(v)
        elif isinstance(v, np.ndarray) and not isinstance(v, DeviceArray) and v.ndim and v.size:
            raise TypeError(f"Unsupported type {np.ndarray}")


def _plain(a):
    """Device arrays as NumPy arrays (to compute with NumPy's own implementation)."""
    if isinstance(a, DeviceArray):
        return a.view(np.ndarray)
    if isinstance(a, tuple):
        return tuple(_plain(v) for v in a)
    if isinstance(a, list):
        return [_plain(v) for v in a]
    if isinstance(a, dict):
        return {k: _plain(v) for k, v in a.items()}
    return a


def _device(a):
    """Results of NumPy functions as device arrays (tuples and lists element by element)."""
    if isinstance(a, np.ndarray) and not isinstance(a, DeviceArray):
        return a.view(DeviceArray)
    if isinstance(a, tuple):
        return tuple(_device(v) for v in a)
    if isinstance(a, list):
        return [_device(v) for v in a]
    return a


def _fake_cuda(calls: list):
    """``cupy.cuda``'s devices, streams and events, which order nothing here (the stand-in's operations run at
    once, on the calling thread); what is asked of them goes to ``calls`` as (what, thread name, object), with
    ``.get()``'s copies, so a test can see on which thread and in which order they came."""

    def note(what, obj):
        calls.append((what, threading.current_thread().name, obj))

    class Stream:
        def __init__(self, null=False, non_blocking=False, ptds=False):
            self.null, self.non_blocking = null, non_blocking
            note("stream", self)

        def wait_event(self, event):
            note("wait_event", event)

        def record(self, event=None):
            event = event or Event()
            event.record(self)
            return event

        def synchronize(self):
            note("synchronize", self)

    class Event:
        def __init__(self, block=False, disable_timing=False, interprocess=False):
            self.stream = None

        def record(self, stream=None):
            self.stream = stream
            note("record", self)

        def synchronize(self):
            pass

        done = True

    class Device:
        def __init__(self, device=None):
            self.id = 0 if device is None else int(device)

        def synchronize(self):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    null = Stream(null=True)
    calls.clear()  # the null stream is no stream a test made
    return types.SimpleNamespace(Device=Device, Stream=Stream, Event=Event, get_current_stream=lambda *a: null)


def fake_cupy():
    """A fresh ``cupy`` stand-in with a zeroed ledger ``moved``."""
    mod = types.ModuleType("cupy")
    mod.moved = {"host_to_device_bytes": 0, "device_to_host_bytes": 0}
    DeviceArray.ledger = mod.moved
    mod.ndarray = DeviceArray

    def upload(a, dtype=None, copy=True, contiguous=False):
        if not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__"):  # device memory: a view
            a = interface_view(a).view(DeviceArray)
        if isinstance(a, DeviceArray):
            out = a.astype(dtype, copy=copy) if dtype is not None else (a.copy() if copy else a)
            return np.ascontiguousarray(out).view(DeviceArray) if contiguous else out
        host = np.array(a, dtype=dtype, copy=True)
        mod.moved["host_to_device_bytes"] += host.nbytes
        return host.view(DeviceArray)

    mod.asarray = lambda a, dtype=None, order=None: upload(a, dtype, copy=False)
    mod.array = lambda a, dtype=None, copy=True, order=None: upload(a, dtype, copy=copy)
    mod.ascontiguousarray = lambda a, dtype=None: upload(a, dtype, copy=False, contiguous=True)
    mod.calls = []
    DeviceArray.calls = mod.calls
    mod.cuda = _fake_cuda(mod.calls)

    def attribute(name):
        value = getattr(np, name)
        if callable(value) and not isinstance(value, type):
            return lambda *a, **k: _device(value(*a, **k))
        return value

    mod.__getattr__ = attribute
    return mod
