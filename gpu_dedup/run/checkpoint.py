"""Stage checkpoints in the output directory, so a killed run resumes.

After each checkpointed stage its arrays go to ``<output>/.gpu_dedup_checkpoint/<unit>.arrays``
(written to a temporary name, then renamed: a half-written file is never
read; the format: :func:`dump_arrays`).  Checkpoints and shard marks are written by one background thread, in
the order they were asked for, so the next stage does not wait on the disk (nor, on
the GPU, on the copy of the checkpoint's device arrays to the host, which that
thread makes too: :func:`gpu_dedup.backends.host_later`): a
checkpoint only shortens a later resume, and one that a crash or power loss
leaves missing or garbled is computed again (:func:`load_arrays` checks each
array's CRC).  So checkpoints, their marks and manifest are not synced to disk; the outputs are.  A run that
reaches its commit drops the checkpoints still queued (it removes the
directory next), and an error of a background write (a full disk) is raised
by the next call that saves, marks or removes.

The directory holds a manifest with the run fingerprint: a hash of
the configuration, the input files (path and identity: size, modification
time and a digest of the Parquet footer or the first and last blocks, see
:func:`gpu_dedup.stages.storage.shard_identity`), the gpu_dedup version
and the kernel sources.  A run whose fingerprint differs
(other inputs, other config, other code) never reuses a checkpoint: it
deletes them and starts over.  ``restart=True`` (``--restart``) always does.
A checkpoint that cannot be read (truncated, garbled) is discarded with a
warning and its stages are computed again.  The directory also holds the
staged outputs (see :mod:`gpu_dedup.run.outdir`); it is removed when the run
commits.  An output directory in an object store (a URL) keeps its checkpoints under the
same prefix, each uploaded as one object, so a rerun resumes from any machine.

``GPU_DEDUP_FAULT=<point>`` makes the process SIGKILL itself at that point
(stage names, ``write:first-shard``, ``save:<unit>``, ``report:before-success``,
``commit:planned``, ``commit:renamed``, ``commit:before-success``; ``<point>:interrupt``
and ``<point>:terminate`` send SIGINT / SIGTERM instead): the crash tests use it to kill runs inside every stage.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import signal
import threading
import weakref
import zlib
from collections import deque
from pathlib import Path

import numpy as np

from gpu_dedup.version import __version__
from gpu_dedup.kernels.params import HASH_FAMILY_NAME
from gpu_dedup.kernels.twin import kernel_digest
from gpu_dedup.storage import atomic_write_bytes, file_digest, shard_identity
from gpu_dedup.storage.atomic import atomically
from gpu_dedup.storage.filesystems import as_path, is_url, remove_tree

log = logging.getLogger("gpu_dedup")

CHECKPOINT_DIR = ".gpu_dedup_checkpoint"
MANIFEST = "manifest.json"
SUFFIX = ".arrays"  # a checkpoint file: dump_arrays
MAGIC = b"GPU_DEDUP-ARRAY2"  # the first 16 bytes of one (format 2: the header has a CRC of its own)
ALIGN = 64  # each array's bytes start at a multiple of this


def dump_arrays(f, arrays: dict, meta: str = "") -> None:
    """Named host arrays (not of objects) and a text ``meta`` into binary file ``f``: MAGIC, the header's length
    (8 bytes, little-endian) and CRC-32 (4 bytes), the header (JSON: ``meta``, then each array's name, dtype,
    shape, offset, bytes and CRC-32), then each array's bytes as they are in memory, ALIGN-aligned.  An array is
    written straight from its buffer and its CRC is one pass over it (about 7 GB/s), where ``np.savez`` copied
    every array into a zip member 16 MiB at a time with the GIL held (results/bench/host-costs: a 1.8 GB unit
    0.58 s against 0.63-0.77 s alone, 0.69-2.27 s against 1.92-2.48 s beside a thread running Python)."""
    bufs, entries, offset = [], [], 0
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.dtype.hasobject or a.dtype.fields is not None:
            raise TypeError(f"checkpoint array {name!r} has dtype {a.dtype}: only plain dtypes are saved")
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)  # a copy only where a is not C-contiguous
        entries.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape), "offset": offset,
                        "nbytes": int(raw.shape[0]), "crc32": zlib.crc32(raw.data)})
        bufs.append(raw)
        offset += -(-raw.shape[0] // ALIGN) * ALIGN
    head = json.dumps({"meta": meta, "arrays": entries}).encode()
    start = _PREFIX + len(head)
    f.write(MAGIC + len(head).to_bytes(8, "little") + zlib.crc32(head).to_bytes(4, "little") + head
            + bytes(-start % ALIGN))
    for raw in bufs:
        f.write(raw)  # from the array's own buffer; the GIL is released while the OS copies it
        f.write(bytes(-raw.shape[0] % ALIGN))


_PREFIX = len(MAGIC) + 8 + 4  # MAGIC, the header's length and its CRC-32


def arrays_bytes(arrays: dict, meta: str = "") -> memoryview:
    """:func:`dump_arrays` into memory (an object store's one upload)."""
    buf = io.BytesIO()
    dump_arrays(buf, arrays, meta)
    return buf.getbuffer()


def save_arrays(path, arrays: dict, meta: str = "", written=None) -> None:
    """:func:`dump_arrays` into ``path`` whole or not at all, not synced (a checkpoint): a temporary file renamed
    into place, or for a URL one upload; ``written()``, where given, runs once the bytes are made, before they
    are published (a fault point)."""
    if is_url(path):  # one upload: the store publishes it whole or not at all
        payload = arrays_bytes(arrays, meta)
        if written is not None:
            written()
        atomic_write_bytes(path, payload, durable=False)
        return

    def write(fd, tmp):
        with os.fdopen(fd, "wb") as f:
            dump_arrays(f, arrays, meta)
        if written is not None:
            written()

    atomically(as_path(path), None, write)


def load_arrays(source) -> tuple[dict, str]:
    """The arrays and meta of a :func:`dump_arrays` file (a path, or its bytes), the header and each array
    checked against its size and CRC-32; ValueError where the file is truncated, garbled or of another format.
    Each array gets a buffer of its own (writable, as ``np.load`` gave): one kept does not keep the others."""
    if isinstance(source, (str, Path)):
        with open(source, "rb") as f:
            return _load(lambda lo, size: _read_at(f, lo, size), os.fstat(f.fileno()).st_size)
    data = memoryview(source)
    return _load(lambda lo, size: np.frombuffer(data[lo:lo + size], np.uint8).copy(), len(data))


def _read_at(f, lo: int, size: int) -> np.ndarray:
    out = np.empty(size, np.uint8)
    f.seek(lo)
    if size and f.readinto(out) != size:
        raise ValueError("the file changed while it was read")
    return out


def _load(read, length: int) -> tuple[dict, str]:
    """:func:`load_arrays` of a file of ``length`` bytes that ``read(offset, size)`` reads (a new uint8 array)."""
    if length < _PREFIX:
        raise ValueError("not a gpu_dedup checkpoint file")
    prefix = bytes(read(0, _PREFIX))
    if prefix[:len(MAGIC)] != MAGIC:
        raise ValueError("not a gpu_dedup checkpoint file of this format")
    n = int.from_bytes(prefix[len(MAGIC):len(MAGIC) + 8], "little")
    start = _PREFIX + n
    if start > length:
        raise ValueError("truncated header")
    raw_head = bytes(read(_PREFIX, n))
    if zlib.crc32(raw_head) != int.from_bytes(prefix[len(MAGIC) + 8:], "little"):
        raise ValueError("the header fails its CRC")
    head = json.loads(raw_head)
    base = start + (-start % ALIGN)
    arrays = {}
    for e in head["arrays"]:
        lo, size = base + e["offset"], e["nbytes"]
        if lo + size > length:
            raise ValueError(f"array {e['name']!r} truncated")
        raw = read(lo, size)
        if zlib.crc32(raw.data) != e["crc32"]:
            raise ValueError(f"array {e['name']!r} fails its CRC")
        arrays[e["name"]] = raw.view(np.dtype(e["dtype"])).reshape(e["shape"])
    return arrays, head["meta"]


_LIVE: weakref.WeakSet[Checkpoints] = weakref.WeakSet()  # whose background writes a fault waits for


def maybe_crash(point: str) -> None:
    """Fault injection for tests: SIGKILL this process if GPU_DEDUP_FAULT names ``point``
    (``<point>:interrupt``: SIGINT, as Ctrl-C would; ``<point>:terminate``: SIGTERM; ``<point>:group-interrupt``
    and ``<point>:group-terminate``: to this process's whole process group, as a terminal or a scheduler sends
    them).  The checkpoints queued before ``point`` are written first, so that what a killed run resumes from
    does not depend on how fast the disk was."""
    fault = os.environ.get("GPU_DEDUP_FAULT")
    if not fault:
        return
    sig = {point: signal.SIGKILL, f"{point}:interrupt": signal.SIGINT, f"{point}:terminate": signal.SIGTERM,
           f"{point}:group-interrupt": -signal.SIGINT, f"{point}:group-terminate": -signal.SIGTERM}.get(fault)
    if sig is None:
        return
    if not point.startswith("save:"):  # a save's own fault point runs on the writer thread
        for ckpt in list(_LIVE):
            ckpt.wait(raise_errors=False)
    if sig < 0:  # the whole process group
        os.killpg(os.getpgrp(), -sig)
    else:
        os.kill(os.getpid(), sig)


class _Writer:
    """One background thread that runs write jobs in order (see the module doc)."""

    def __init__(self):
        self._jobs: deque = deque()
        self._cv = threading.Condition()
        self._busy = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def submit(self, fn) -> None:
        with self._cv:
            self._jobs.append(fn)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="gpu-dedup-checkpoints", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._jobs:
                    self._cv.wait()
                fn = self._jobs.popleft()
                self._busy = True
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - raised again by the caller's next sync point
                with self._cv:
                    if self._error is None:
                        self._error = exc
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def check(self) -> None:
        """The first error of a finished job, raised (once)."""
        with self._cv:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def wait(self, drop: bool = False, raise_errors: bool = True) -> None:
        """Until no job runs or waits (``drop``: the waiting ones are dropped); then the first error of one,
        raised (``raise_errors``) or kept for the next check."""
        with self._cv:
            if drop:
                self._jobs.clear()
            while self._jobs or self._busy:
                self._cv.wait()
        if raise_errors:
            self.check()


def run_fingerprint(cfg, shards, executor: str = "local") -> str:
    """Identity of a run's checkpoints: config (not the backend), inputs, code, and how the executor cut the
    corpus into parts (``executor``: ``local``, or the Dask executor's block size), since a part saved by one
    cannot be read back by another."""

    h = hashlib.sha256()
    h.update(f"{cfg.fingerprint}\0{__version__}\0{HASH_FAMILY_NAME}\0{kernel_digest()}\0{executor}\0".encode())
    h.update(MAGIC)  # the checkpoint files' format
    for s in shards:
        h.update(f"{s.path}\0{s.name}\0{s.format}\0{s.identity or shard_identity(s.path)}\0".encode())
    return h.hexdigest()[:32]


class CheckpointUnreadable(Exception):
    """A checkpoint file that cannot be read back (truncated or garbled): it is computed again."""


class Checkpoints:
    def __init__(self, out_dir: Path, fingerprint: str, restart: bool = False):
        self.dir = as_path(out_dir) / CHECKPOINT_DIR
        self.fingerprint = fingerprint
        manifest = self.dir / MANIFEST
        if self.dir.exists():
            old = None
            if manifest.exists():
                try:
                    old = json.loads(manifest.read_text()).get("fingerprint")
                except (OSError, ValueError):
                    old = None
            if restart:
                log.info("--restart: discarding checkpoints in %s", self.dir)
                remove_tree(self.dir)
            elif old != fingerprint:
                log.warning("checkpoints in %s belong to another run (fingerprint %s, this run %s: inputs, "
                            "config or code changed); starting over", self.dir, old, fingerprint)
                remove_tree(self.dir)
        # the directory is made with the first checkpoint: a run that fails before one (a bad column) leaves none
        self.resumed = sorted(p.stem for p in self.dir.glob(f"*{SUFFIX}"))
        if self.resumed:
            log.info("resuming: checkpoints found for %s", ", ".join(self.resumed))
        self._writer = _Writer()
        self._ensured = False
        self._marks: dict = {}  # marks of this process (read back without waiting for their files)
        _LIVE.add(self)

    def wait(self, raise_errors: bool = True) -> None:
        """Until every checkpoint and mark asked for so far is written (an error of one is raised here)."""
        self._writer.wait(raise_errors=raise_errors)

    def _ensure(self) -> None:
        """The checkpoint directory and its manifest, before the first file goes in (on the writer thread)."""
        if self._ensured:
            return
        manifest = self.dir / MANIFEST
        if not manifest.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(manifest, json.dumps({"fingerprint": self.fingerprint}).encode(), durable=False)
        self._ensured = True

    def _path(self, unit: str) -> Path:
        return self.dir / f"{unit}{SUFFIX}"

    def has(self, unit: str) -> bool:
        return self._path(unit).exists()

    def save(self, unit: str, arrays, meta: dict) -> None:
        """Write ``arrays`` and ``meta`` as unit ``unit``, in the background (see the module doc).  ``arrays``:
        host arrays, which nobody changes afterwards, or a function returning them that the writer's thread
        calls when it writes the unit (a device copy, :func:`gpu_dedup.backends.host_later`; a unit dropped at
        the commit never calls it)."""
        self._writer.check()  # an earlier write's error stops the run here
        text = json.dumps(meta)  # as it is now
        self._writer.submit(lambda: self._save(unit, arrays, text))

    def _save(self, unit: str, arrays, meta: str) -> None:
        if callable(arrays):
            arrays = arrays()
        self._ensure()
        save_arrays(self._path(unit), arrays, meta, written=lambda: maybe_crash(f"save:{unit}"))

    def load(self, unit: str) -> tuple[dict, dict]:
        """The arrays and metadata of ``unit``; CheckpointUnreadable (after deleting it) when it is garbled."""
        try:
            where = self._path(unit)
            arrays, text = load_arrays(where.read_bytes() if is_url(where) else where)
            meta = json.loads(text)
            if not isinstance(meta, dict) or "stages" not in meta or "counts" not in meta:
                raise ValueError("metadata incomplete")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("checkpoint %s is unreadable (%s); discarding it and computing its stages again",
                        self._path(unit), exc)
            self._path(unit).unlink(missing_ok=True)
            self.resumed = [u for u in self.resumed if u != unit]
            raise CheckpointUnreadable(unit) from None
        return arrays, meta

    def mark(self, name: str, record: dict | None = None) -> None:
        """Mark ``name`` done with ``record`` (in the background, after the saves asked for before it)."""
        self._writer.check()
        self._marks[name] = dict(record or {})
        payload = json.dumps(record or {}).encode()

        def write():
            self._ensure()
            atomic_write_bytes(self.dir / f"{name}.done", payload, tmp_dir=self.dir, durable=False)

        self._writer.submit(write)

    def marked(self, name: str):
        """The record saved with mark ``name`` ({} when it has none), or None when unmarked or unreadable."""
        if name in self._marks:
            return dict(self._marks[name])
        try:
            data = json.loads((self.dir / f"{name}.done").read_text() or "{}")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def settle(self) -> None:
        """Checkpoints still queued are dropped and the one being written is waited for: the run is about to
        commit, which removes the directory they go to."""
        self._writer.wait(drop=True, raise_errors=False)

    def remove(self) -> None:
        """The checkpoint directory removed (the run committed): checkpoints still queued are not written."""
        self.settle()
        remove_tree(self.dir)


def staged(record, shard, out, needs: tuple = ()) -> bool:
    """Whether shard ``shard`` in ``out`` is still the file its checkpoint mark ``record`` recorded (size and
    SHA-256; ``needs``: other keys the record must hold), so that a resumed run need not write it again."""
    if not record or record.get("name") != shard.name or any(k not in record for k in needs):
        return False
    path = as_path(out) / shard.name
    try:
        if path.stat().st_size != record.get("size"):
            return False
        return file_digest(path)["sha256"] == record.get("sha256")
    except OSError:
        return False


class NoCheckpoints:
    """Stand-in for :class:`Checkpoints` in a run without an output directory
    (the in-memory DataFrame API): nothing is saved, nothing resumes."""

    fingerprint = None
    resumed: list = []

    def has(self, unit: str) -> bool:
        return False

    def save(self, unit: str, arrays, meta: dict) -> None:
        pass

    def wait(self, raise_errors: bool = True) -> None:
        pass

    def settle(self) -> None:
        pass

    def mark(self, name: str, record: dict | None = None) -> None:
        pass

    def marked(self, name: str):
        return None

    def remove(self) -> None:
        pass
