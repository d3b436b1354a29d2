"""An index in an object store (``s3://bucket/index/``): a local copy to memory-map, new segments uploaded.

An index is memory-mapped when it is opened, which an object in a store cannot be:
:func:`open_index` copies the manifest and the segments it lists into a local cache
directory (``$GPU_DEDUP_CACHE/index/<digest of the URL>``, default
``~/.cache/gpu_dedup``; a segment never changes once written, so only segments not yet
there are downloaded, each file to a temporary name, checked for its size, then renamed)
and opens that copy.  Appending to it (``run --against URL --update-index``) writes the
new segment in the copy, uploads its files and then the manifest, last: a reader of the
URL sees the new segment only once the manifest names it, as with a local index, and an
append killed before the manifest leaves an unlisted segment that the next append
replaces.  Building (``run --index-out URL``, ``index build -o URL``) writes the index in
a local temporary directory and uploads it the same way, segments first.

One writer at a time, as for a local index; an append whose index changed in the store
since it was opened (another run appended meanwhile) is refused before its manifest is
uploaded, naming the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError, OutputError
from gpu_dedup.index.format import FORMAT, LOCK, MANIFEST, SEGMENT_FILES, segment_name
from gpu_dedup.index.store import Index, IndexBuilder, IndexDamaged
from gpu_dedup.run.remote_outdir import LockObject
from gpu_dedup.storage.filesystems import RemotePath, filesystem, is_url, put_bytes, remote_error

log = logging.getLogger("gpu_dedup")


def cache_root() -> Path:
    return Path(os.environ.get("GPU_DEDUP_CACHE") or Path.home() / ".cache" / "gpu_dedup") / "index"


def _read_manifest(remote: RemotePath) -> tuple[bytes, dict] | None:
    """The manifest's bytes and content, or None when the URL holds none."""
    try:
        raw = (remote / MANIFEST).read_bytes()
    except FileNotFoundError:
        return None
    except Exception as exc:  # noqa: BLE001 - a missing bucket, denied access: one message
        raise remote_error(str(remote / MANIFEST), exc, reading=True) from None
    try:
        return raw, json.loads(raw)
    except ValueError as exc:
        raise InputError(f"index manifest {str(remote / MANIFEST)!r} is not valid JSON ({exc}); restore it or build "
                         "a new index") from None


def local_copy(url) -> Path:
    """The local copy of the index at ``url`` (see the module doc), brought up to date with its manifest."""
    remote = RemotePath(str(url))
    got = _read_manifest(remote)
    if got is None:
        raise InputError(f"{remote.url!r} is not a gpu_dedup index (no {MANIFEST}); build one with `gpu-dedup index "
                         "build ... -o URL` or `gpu-dedup run ... --index-out URL`")
    raw, manifest = got
    local = cache_root() / hashlib.sha256(remote.url.encode()).hexdigest()[:20]
    local.mkdir(parents=True, exist_ok=True)
    fs, _ = filesystem(remote.url)
    copied = _copied(local)
    for name in manifest.get("segments", []) if isinstance(manifest, dict) else []:
        for f in SEGMENT_FILES:
            src, dest = remote / name / f, local / name / f
            try:
                st = src.stat()
                if dest.is_file() and copied.get(f"{name}/{f}") == [st.st_size, st.token]:
                    continue  # this very object was copied before (segments never change once published)
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{f}.tmp")
                fs.get_file(src.key, str(tmp))
                if tmp.stat().st_size != st.st_size:
                    raise OSError(f"downloaded {tmp.stat().st_size} of {st.st_size} bytes")
                os.replace(tmp, dest)
                copied[f"{name}/{f}"] = [st.st_size, st.token]
                _record(local, copied)
            except FileNotFoundError:
                raise InputError(f"the index at {remote.url!r} is damaged (its manifest lists {name}/{f}, which is "
                                 "missing); restore it or rebuild it") from None
            except OSError as exc:
                raise remote_error(str(src), exc, reading=True) from None
    (local / MANIFEST).write_bytes(raw)
    return local


COPIED = ".copied.json"  # in the local copy: size and ETag of each file as it was copied from the store


def _copied(local: Path) -> dict:
    try:
        data = json.loads((local / COPIED).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _record(local: Path, copied: dict) -> None:
    tmp = local / f".{COPIED}.tmp"
    tmp.write_text(json.dumps(copied))
    os.replace(tmp, local / COPIED)


class RemoteIndex(Index):
    """An index opened from a URL: its local copy, whose appends are uploaded (see the module doc)."""

    remote: RemotePath

    @contextmanager
    def writing(self):
        """One writer at a time in the store too: the lock object ``<url>/.gpu_dedup_index.lock`` (a conditional
        write) is held from opening to the append's manifest, besides the local copy's lock; a second writer,
        from this machine or another, stops at once (exit 4) before it publishes anything."""
        if self._locked:
            yield self
            return
        lock = LockObject(self.remote / LOCK, secrets.token_hex(16), lambda who: (
            f"the index at {self.remote.url!r} is being written by another gpu-dedup run ({who}); one run at a time "
            "may append to an index: wait for that run to finish, then rerun (it deduplicates against what the "
            "other run added)"))
        lock.take()
        try:
            got = _read_manifest(self.remote)
            if got is not None and isinstance(got[1], dict) and got[1].get("segments") != self.manifest["segments"]:
                fresh = open_index(self.remote.url)  # appended since this copy was made: matched as it is now
                self.manifest, self.segments, self._keys = fresh.manifest, fresh.segments, None
            with super().writing():
                self._store_lock = lock
                yield self
        finally:
            self._store_lock = None
            lock.release()

    def append(self, **payload) -> int:
        before = list(self.manifest["segments"])
        hold = self._hold
        self._hold = True
        try:
            first = super().append(**payload)
        finally:
            self._hold = hold
        self._remote_before = before
        try:  # the segments now, refused when the store's index changed since it was opened: nothing published
            staged = {p["name"]: Path(p["tmp"]) for p in self._staged["plan"]}
            upload_segments(self.path, self.remote, staged, before)
        except BaseException:
            super().discard_staged()
            raise
        if not hold:
            self.publish_staged()
        return first

    def publish_staged(self) -> None:
        """The manifest, in the local copy and then in the store (refused when the store's index changed since
        it was opened: the segments stay unlisted, replaced by the next append)."""
        if self._staged is None:
            self._hold = False
            return
        check_unchanged(self.remote, self._remote_before)
        lock = getattr(self, "_store_lock", None)
        if lock is not None and not lock.held():
            raise OutputError(f"the lock object {str(self.remote / LOCK)!r} of this run was deleted or taken over by "
                              "another run; nothing was appended to the index: rerun when no other run writes it")
        super().publish_staged()
        put_bytes(self.remote / MANIFEST, (self.path / MANIFEST).read_bytes())

    def info(self) -> dict:
        return {**super().info(), "path": self.remote.url, "local_copy": str(self.path)}


def open_index(path, cfg: Config | None = None) -> Index:
    """:meth:`Index.open` of a local directory, or of an index in an object store (a local copy).  A local copy
    that does not verify (changed on this machine since it was copied) is copied again from the store, once: a
    damaged copy is not a damaged index; what does not verify after that is the store's."""
    if not is_url(path):
        return Index.open(path, cfg)
    local = local_copy(path)
    try:
        index = RemoteIndex.open(local, cfg)
    except IndexDamaged as exc:
        log.warning("the local copy %s of the index at %s does not verify (%s); copying it from the store again",
                    local, path, exc.what)
        shutil.rmtree(local, ignore_errors=True)
        local = local_copy(path)
        try:
            index = RemoteIndex.open(local, cfg)
        except IndexDamaged as again:
            raise InputError(f"the index at {str(path)!r} is damaged ({again.what}, also in a fresh copy of its "
                             "files); restore it from a backup or rebuild it from its corpus (gpu-dedup index build "
                             "CORPUS -o URL)") from None
    index.remote = RemotePath(str(path))
    return index


def check_unchanged(remote: RemotePath, expected: list) -> None:
    """Refuse (exit 4) an append to the index at ``remote`` whose manifest no longer lists ``expected`` (another
    writer appended since this one opened it): this run's documents were matched against the earlier state."""
    got = _read_manifest(remote)
    now = got[1].get("segments", []) if got is not None and isinstance(got[1], dict) else []
    if now != expected:  # the local copy's new segments were never published: the next open copies the store's
        raise OutputError(f"the index at {remote.url!r} changed since this run opened it (another run appended to "
                          "it without taking its lock, e.g. an earlier gpu_dedup); nothing was published nor "
                          "appended: rerun, so that this run dedups against its new documents too")


def upload_segments(local: Path, remote: RemotePath, segments, expected: list) -> None:
    """Upload ``segments`` of the index in ``local`` (names, or name -> the local directory holding its files)
    to ``remote``, unlisted until the manifest that names them is uploaded, last; refused when the remote
    manifest no longer lists ``expected``."""
    check_unchanged(remote, expected)
    copied = _copied(local)
    where = segments if isinstance(segments, dict) else {name: local / name for name in segments}
    for name, directory in where.items():
        for f in SEGMENT_FILES:
            with pa.memory_map(str(directory / f)) as m:  # uploaded in parts, not read into memory at once
                put_bytes(remote / name / f, m.read_buffer())
            st = (remote / name / f).stat()
            copied[f"{name}/{f}"] = [st.st_size, st.token]  # the local file is that object: no download next time
    _record(local, copied)


class RemoteIndexBuilder:
    """The sink of ``run --index-out URL``: builds the index in a local temporary directory when the run hands it
    its documents, then uploads it (segments, then the manifest)."""

    def __init__(self, url, cfg: Config):
        self.path = RemotePath(str(url))
        self.cfg = cfg
        got = _read_manifest(self.path)
        if got is not None:
            if isinstance(got[1], dict) and got[1].get("format") == FORMAT:
                raise InputError(f"an index already exists at {self.path.url!r}; use it with --against (and "
                                 "--update-index), or remove it to build a new one")
            raise OutputError(f"{str(self.path / MANIFEST)!r} is not a gpu_dedup index manifest, and building an "
                              f"index at {self.path.url!r} would overwrite it; choose a new or empty prefix")
        if (self.path / segment_name(0)).is_dir():
            raise OutputError(f"{str(self.path / segment_name(0))!r} exists, and building an index at "
                              f"{self.path.url!r} would overwrite it; choose a new or empty prefix")
        self._tmp = tempfile.mkdtemp(prefix="gpu_dedup-index-")
        self._builder = IndexBuilder(Path(self._tmp) / "index", cfg)

    @property
    def index(self):
        return self._builder.index

    @property
    def documents(self) -> int:
        return self._builder.documents

    def __enter__(self) -> "RemoteIndexBuilder":  # the local build's lock, held as a local build holds it
        self._builder.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._builder.__exit__(exc_type, exc, tb)
        shutil.rmtree(self._tmp, ignore_errors=True)

    @property
    def source(self):
        return getattr(self._builder, "source", None)

    @source.setter
    def source(self, value) -> None:
        self._builder.source = value

    id_type = None  # a new index: its first append's ids name the type

    def append_segments(self, counts: list, write, layout=None) -> int:
        """A cluster's blocks as segments: refused, as run.entry.run_dedup refuses such a run before it starts
        (its workers would write into the object store, not into a directory every worker sees)."""
        raise ConfigError(f"--index-out {self.path.url!r}: a cluster run writes an index with its workers, into "
                          "a directory every worker sees, not into an object store; write it to a shared directory "
                          "and copy that to the store, or run in one process (drop --workers / --scheduler)")

    def hold(self) -> None:
        """As :meth:`Index.hold`: the segments are uploaded by the append, the manifest by publish_staged()."""
        self._hold = True

    def append(self, **payload) -> int:
        try:
            first = self._builder.append(**payload)  # the local build, whole (a temporary directory)
            upload_segments(self._builder.path, self.path, list(self._builder.index.manifest["segments"]), [])
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self._built = True
        if not getattr(self, "_hold", False):
            self.publish_staged()
        return first

    def publish_staged(self) -> None:
        """The manifest of the built index, uploaded last (refused when another build published one meanwhile)."""
        if not getattr(self, "_built", False):
            return
        self._built = False
        try:
            check_unchanged(self.path, [])
            put_bytes(self.path / MANIFEST, (self._builder.path / MANIFEST).read_bytes())
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def discard_staged(self) -> None:
        """Drop the build: its uploaded segments stay unlisted (no manifest names them), the local copy goes."""
        self._built = False
        shutil.rmtree(self._tmp, ignore_errors=True)


def index_builder(path, cfg: Config):
    """The sink that builds a new index at ``path``: a local directory, or a URL."""
    return RemoteIndexBuilder(path, cfg) if is_url(path) else IndexBuilder(path, cfg)
