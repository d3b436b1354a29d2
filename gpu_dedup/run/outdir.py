"""The output directory: what a run owns in it, and how it publishes its results.

A run owns only what it creates.  :class:`OutputDir` enforces it:

- **Lock.**  ``<out>/.gpu_dedup.lock`` is held with ``flock`` for the whole
  run and names the holder (pid, host, start time).  A second run on the same
  directory stops at once with :class:`~gpu_dedup.errors.OutputError`.  The
  kernel releases the lock when its process dies (even by SIGKILL), so a lock
  file left by a killed run is simply taken over; where ``flock`` is not
  supported the file's pid is checked instead (a dead pid on this host is stale).
- **Manifest.**  ``<out>/.gpu_dedup_manifest.json`` lists every file a run
  published (relative name, size, SHA-256, modification time).  A run
  overwrites or deletes only files listed there and unchanged since (same size
  and modification time); any other file where it would write stops the run
  before anything is written.  Files of an earlier run that the new run does not
  produce (e.g. shards of inputs since removed) are deleted when the new run
  commits.  Nothing else in the directory is touched.
- **Collisions** are refused before anything is written: ``-o`` an existing
  file, an output directory equal to or inside an input directory, an input
  whose path is one the run would write, an input named like an output
  (``duplicates.parquet``, ``report.json``, ...).
- **Staging and commit.**  Every output (shards, ``duplicates.parquet``,
  ``report.json``, ``report.html``) is written under
  ``<out>/.gpu_dedup_checkpoint/staged/``.  The previous complete output
  (its ``_SUCCESS`` and reports included) stays in place until the new run is
  ready: :meth:`OutputDir.commit` re-checks the inputs' identity, verifies every
  staged file (Parquet: footer and row count; all: size and SHA-256, against
  the digest recorded when it was written), records the commit plan in the
  manifest, then removes ``_SUCCESS``, renames the staged files into place,
  deletes the previous run's files the new one does not produce, writes the
  manifest and finally ``_SUCCESS``.  A run killed during the commit is rolled
  forward by the next run on the directory (the plan is in the manifest).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.errors import COMMITTED, Interrupted, OutputError, write_error
from gpu_dedup.run.checkpoint import CHECKPOINT_DIR, maybe_crash
from gpu_dedup.run.checkpoint import MANIFEST as CHECKPOINT_MANIFEST
from gpu_dedup.storage.filesystems import remove_tree
from gpu_dedup.storage import (
    PARQUET_EXT,
    is_url,
    source,
    atomic_write_bytes,
    check_unchanged,
    file_digest,
    known_digest,
)
from gpu_dedup.storage.atomic import file_stamp, sync_dir

log = logging.getLogger("gpu_dedup")

LOCK_NAME = ".gpu_dedup.lock"
MANIFEST_NAME = ".gpu_dedup_manifest.json"
STAGED = "staged"
DUPLICATES_NAME = "duplicates.parquet"
REPORT_NAME = "report.json"
REPORT_HTML_NAME = "report.html"
SUCCESS_NAME = "_SUCCESS"
PUBLISHED = (DUPLICATES_NAME, REPORT_NAME, REPORT_HTML_NAME, SUCCESS_NAME)  # beside the shards
BOOKKEEPING = (LOCK_NAME, MANIFEST_NAME, CHECKPOINT_DIR)


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputDir:
    """The output directory of one run (see the module doc); a context manager holding the lock."""

    def __init__(self, out, shards, inputs=(), *, duplicates: bool = True, shards_written: bool = True):
        self.out = Path(out)
        self.shards = list(shards)
        self._had_previous = True  # a previous run's outputs are there (commit() knows)
        self._own_commit = False  # publishing this run's outputs (else an earlier run's interrupted commit)
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        self.inputs = [i for i in (inputs or ()) if isinstance(i, (str, os.PathLike))]  # paths, dirs, globs
        self.names = [s.name for s in self.shards if s.format != "memory"] if shards_written else []
        self.published = [n for n in PUBLISHED if duplicates or n != DUPLICATES_NAME]
        self._fd: int | None = None
        self._created = False
        self.committed = False  # this run's outputs are in place (its commit finished)
        self._verified: dict = {}  # name -> digest (and stamp) of the staged outputs verify() checked

    @property
    def work(self) -> Path:
        return self.out / CHECKPOINT_DIR

    @property
    def staging(self) -> Path:
        return self.work / STAGED

    # ------------------------------------------------------------------ open / close
    def __enter__(self) -> "OutputDir":
        if self._fd is None:
            self.open()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        if self.committed and exc_type is not None and issubclass(exc_type, KeyboardInterrupt) \
                and not isinstance(exc, Interrupted):
            raise Interrupted(COMMITTED.message() or f"interrupted after the outputs in {str(self.out)!r} were "
                              "published and verified (_SUCCESS is there)") from exc

    def open(self, fresh: bool = False) -> "OutputDir":
        """Refuse collisions, take the lock, finish an interrupted commit, refuse foreign files.
        ``fresh``: this run never resumes, so the previous run's work directory is discarded."""
        self._check_collisions()
        if not self.out.exists():
            try:
                self.out.mkdir(parents=True)
            except FileExistsError:
                pass
            except OSError as exc:
                mapped = write_error(self.out, exc)
                if mapped is exc:  # a parent that is a file, or a path no directory can be made at (/proc/...)
                    raise OutputError(f"cannot create output directory {str(self.out)!r} ({exc.strerror or exc}); "
                                      "choose an -o whose parent is a writable directory") from None
                raise mapped from None
            else:
                self._created = True
        self._lock()
        try:
            self._sweep_temporaries()
            manifest = self._manifest()
            if manifest.get("state") == "committing":
                self._roll_forward(manifest)
            self._check_foreign()
            if fresh and self.work.exists():
                remove_tree(self.work)  # a local directory, or the objects under a prefix
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self._fd is None:
            return
        release_lock(self.out / LOCK_NAME, self._fd)
        self._fd = None
        if self._created:  # a run refused before it wrote anything leaves no empty directory behind
            try:
                self.out.rmdir()
            except OSError:
                pass

    # ------------------------------------------------------------------ checks
    def _check_collisions(self) -> None:
        out = self.out
        check_output_path(out, self.inputs, "its outputs as inputs")
        real = out.resolve()
        reserved = set(self.published) | set(BOOKKEEPING)
        for s in self.shards:
            if s.format == "memory":
                continue
            top = Path(s.name).parts[0]
            if s.name in reserved or top in BOOKKEEPING:
                raise OutputError(
                    f"input shard {s.path!r} would be written as {s.name!r}, a name gpu_dedup uses for its own "
                    f"output ({', '.join(self.published)}); rename the input file, or pass it inside a subdirectory")
            path = Path(s.path).resolve()
            if (real / s.name).resolve() == path:
                raise OutputError(
                    f"output {str(real / s.name)!r} would overwrite input shard {s.path!r}; choose another output "
                    "directory")
            if _inside(path, real / CHECKPOINT_DIR):
                raise OutputError(f"input shard {s.path!r} lies in gpu_dedup's work directory of {str(out)!r}; "
                                  "give the input shards themselves")
        self._check_inner_links()

    def _check_inner_links(self) -> None:
        """A symbolic link inside the output directory where the run writes below it (a shard's subdirectory,
        the work directory): the run would write (and delete) through it, outside the directory it owns; a file
        there: the commit could not make the directory."""
        dirs = {CHECKPOINT_DIR}
        for name in self.names + self.published:
            parts = Path(name).parts[:-1]
            dirs.update(str(Path(*parts[:i + 1])) for i in range(len(parts)))
        for d in sorted(dirs):
            if os.path.islink(self.out / d):
                raise OutputError(f"{str(self.out / d)!r} is a symbolic link to {os.readlink(self.out / d)!r} where "
                                  "gpu_dedup writes its files; it never writes through a link: remove the link or "
                                  "choose another -o")
            if os.path.lexists(self.out / d) and not os.path.isdir(self.out / d):
                raise OutputError(f"{str(self.out / d)!r} is a file where gpu_dedup would make a directory for its "
                                  "output files; move it away or choose another -o")

    def _owned(self, manifest: dict) -> dict:
        files = dict(manifest.get("previous", {}))
        files.update(manifest.get("files", {}))
        return files

    def _unchanged(self, name: str, rec: dict) -> bool:
        try:
            st = os.stat(self.out / name)
        except OSError:
            return False
        return st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")

    def _our_success(self, manifest: dict) -> bool:
        """_SUCCESS is written after the manifest: it is ours when it holds the manifest's fingerprint."""
        try:
            return bool(manifest.get("fingerprint")) and \
                (self.out / SUCCESS_NAME).read_text() == f"{manifest['fingerprint']}\n"
        except (OSError, UnicodeDecodeError):
            return False

    def _check_foreign(self) -> None:
        """Refuse a run that would overwrite a file gpu_dedup did not write (or that changed since)."""
        manifest = self._manifest()
        owned = self._owned(manifest)
        real = self.out.resolve()
        for s in self.shards:  # an earlier run's output read back as an input (e.g. a recursive glob)
            path = Path(s.path).resolve()
            if s.format != "memory" and _inside(path, real) and str(path.relative_to(real)) in owned:
                raise OutputError(
                    f"input shard {s.path!r} is an output of an earlier gpu_dedup run in {str(self.out)!r}; "
                    "the inputs must not include the output directory: narrow the input pattern or choose "
                    "another -o")
        for name in self.names + self.published:
            path = self.out / name
            if not os.path.lexists(path):
                continue
            if name == SUCCESS_NAME and self._our_success(manifest):
                continue
            if path.is_dir() and not path.is_symlink():
                raise OutputError(f"{str(path)!r} is a directory where gpu_dedup would write its output file "
                                  f"{name!r}; move it away or choose another -o")
            if name not in owned:
                raise OutputError(
                    f"{str(path)!r} exists and was not written by gpu_dedup (it is not in the output directory's "
                    f"manifest {MANIFEST_NAME}); the run would overwrite it: move it away or choose an empty "
                    "output directory")
            if not self._unchanged(name, owned[name]):
                raise OutputError(
                    f"{str(path)!r} changed after gpu_dedup wrote it (size or modification time differ from its "
                    f"manifest {MANIFEST_NAME}); the run would overwrite it: move it away, or delete it to let the "
                    "run write it again")

    # ------------------------------------------------------------------ lock
    def _lock(self) -> None:
        self._fd = take_lock(self.out / LOCK_NAME, lambda holder: (
            f"output directory {str(self.out)!r} is in use by another gpu-dedup run ({holder}); two runs cannot "
            "write one directory: wait for it to finish, or choose another -o"))

    # ------------------------------------------------------------------ manifest
    def _manifest(self) -> dict:
        try:
            data = json.loads((self.out / MANIFEST_NAME).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            log.warning("the manifest %s in %s is unreadable; files of earlier runs are treated as not "
                        "gpu_dedup's", MANIFEST_NAME, self.out)
            return {}
        return data if isinstance(data, dict) else {}

    def _write_manifest(self, manifest: dict) -> None:
        atomic_write_bytes(self.out / MANIFEST_NAME, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())

    def _sweep_temporaries(self) -> None:
        """Temporary files of the files this module writes at the top level, left by a killed run."""
        for name in (MANIFEST_NAME, SUCCESS_NAME):
            for p in self.out.glob(f".{name}.*.tmp"):
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ commit
    def verify(self, expected_rows: dict, recorded: dict | None = None, names=None) -> dict:
        """Check the staged outputs ``names`` (default: every output but the reports) before anything is
        published: present, the digest recorded when each was staged, Parquet footer and row count.
        Returns their digests (kept for :meth:`commit`, which checks only what this has not).

        ``expected_rows``: name -> rows each staged Parquet output must hold; ``recorded``:
        name -> digest taken when the file was staged (a mismatch means it changed since; with the file's
        stamp, :func:`~gpu_dedup.storage.atomic.written_digest`, an unchanged file is not read again)."""
        check_unchanged(self.shards)
        recorded = recorded or {}
        if names is None:
            names = [n for n in self.names + self.published if n not in (SUCCESS_NAME, REPORT_NAME, REPORT_HTML_NAME)]
        for name in names:
            staged = self.staging / name
            if not staged.is_file():
                raise OutputError(f"staged output {str(staged)!r} is missing; nothing was published: rerun "
                                  "(with --restart if it happens again)")
            # a file this run wrote and nobody touched since (same size, mtime, inode) is not read again
            digest = known_digest(staged, recorded.get(name)) or file_digest(staged)
            if name in recorded and {k: recorded[name].get(k) for k in ("size", "sha256")} != digest:
                raise OutputError(f"staged output {str(staged)!r} changed after it was written (size or SHA-256 "
                                  "differ); nothing was published: rerun with --restart")
            if name.lower().endswith(PARQUET_EXT):
                try:
                    rows = pq.read_metadata(source(staged)).num_rows  # a local file, or an object (URL)
                except (OSError, pa.ArrowException) as exc:
                    raise OutputError(f"staged output {str(staged)!r} is not a valid Parquet file ({exc}); nothing "
                                      "was published: rerun with --restart") from None
                if name in expected_rows and rows != expected_rows[name]:
                    raise OutputError(f"staged output {str(staged)!r} holds {rows} rows, expected "
                                      f"{expected_rows[name]}; nothing was published: rerun with --restart")
            self._verified[name] = digest if is_url(staged) else {**digest, **file_stamp(staged)}
        return {n: self._verified[n] for n in names}

    def commit(self, fingerprint: str, expected_rows: dict, recorded: dict | None = None) -> dict:
        """Publish the staged outputs (see the module doc), each verified (:meth:`verify`) unless it was
        since this run staged it; returns the manifest's file records."""
        names = self.names + [n for n in self.published if n != SUCCESS_NAME]
        done = self._verified
        # an object store has no stamp: what verify() checked moments ago in this run stands
        todo = [n for n in names if n not in done or
                not is_url(self.staging / n) and known_digest(self.staging / n, done[n]) is None]
        self.verify(expected_rows, recorded, todo)
        files = {n: {k: self._verified[n][k] for k in ("size", "sha256")} for n in names}
        previous = self._owned(self._manifest())
        self._had_previous = bool(previous)  # what an interrupted publication leaves beside the new outputs
        plan = {"state": "committing", "fingerprint": fingerprint, "files": files,
                "previous": {k: v for k, v in previous.items() if k not in files},
                # what each output name holds now (the earlier run's file): a later run finishing this commit
                # replaces only that, never a file put there meanwhile
                "replaced": {k: v for k, v in previous.items() if k in files}}
        self._write_manifest(plan)
        maybe_crash("commit:planned")
        self._own_commit = True
        try:
            files = self._apply(plan)
        finally:
            self._own_commit = False
        if plan["files"] and not files:  # abandoned: one of this run's own staged outputs was gone or differed
            raise OutputError(f"publishing the outputs in {str(self.out)!r} failed: an output this run staged and "
                              "verified was gone or differed when it was moved into place (did something else change "
                              "the output directory?); no _SUCCESS was written: rerun the same command")
        self.committed = True
        COMMITTED.outputs = str(self.out)
        maybe_crash("commit:done")
        return files

    def _apply(self, plan: dict) -> dict:
        """Move the planned files into place, drop the previous run's others, then manifest and _SUCCESS.
        Interrupted (Ctrl-C, SIGTERM) on the way, the directory is a mix of both runs without _SUCCESS, and
        the next run on it completes the commit: the message says so."""
        try:
            return self._publish(plan)
        except KeyboardInterrupt as exc:
            if isinstance(exc, Interrupted):
                raise
            held = "part of the new outputs and part of the previous ones" if self._had_previous else \
                "part of the new outputs"
            raise Interrupted(f"interrupted while publishing the outputs in {str(self.out)!r}: it holds {held}, "
                              "without _SUCCESS; rerun the same command (any run on that directory first completes "
                              "the commit)") from exc

    def _publish(self, plan: dict) -> dict:
        (self.out / SUCCESS_NAME).unlink(missing_ok=True)
        sweep = self._drop_checkpoints()  # beside the renames and the manifest's sync
        try:
            return self._move(plan, sweep)
        finally:
            sweep.join()

    def _drop_checkpoints(self) -> threading.Thread:
        """The checkpoints deleted on a thread of their own (large files: freeing their blocks takes a while):
        the commit's plan is in the manifest, so a run killed from here on finishes this commit and never resumes
        from them; their manifest goes first, so that a directory left half-deleted is no checkpoint at all."""
        work = self.work
        try:
            (work / CHECKPOINT_MANIFEST).unlink(missing_ok=True)
        except OSError:
            pass

        def drop() -> None:
            try:
                entries = list(os.scandir(work))
            except OSError:
                return
            for entry in entries:
                if entry.name == STAGED:
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    pass  # what is left goes with the directory (_move)

        thread = threading.Thread(target=drop, name="gpu_dedup-drop-checkpoints", daemon=True)
        thread.start()
        return thread

    def _move(self, plan: dict, sweep: threading.Thread) -> dict:
        files = plan["files"]
        for name, rec in files.items():
            staged, final = self.staging / name, self.out / name
            if staged.is_file():
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staged, final)
                maybe_crash("commit:renamed")
            elif not (final.is_file() and file_digest(final) == {k: rec[k] for k in ("size", "sha256")}):
                sweep.join()
                return self._abandon(plan)
            rec["mtime_ns"] = os.stat(final).st_mtime_ns
        for name, rec in plan["previous"].items():
            if name in files or name == SUCCESS_NAME:
                continue
            if self._through_link(name):  # a directory the user replaced with a link: not ours to delete in
                log.warning("%s was written by an earlier run but lies behind a symbolic link now; left in place",
                            self.out / name)
            elif self._unchanged(name, rec):
                (self.out / name).unlink()
                self._prune_dirs(name)
            elif os.path.lexists(self.out / name):
                log.warning("%s was written by an earlier run but changed since; left in place", self.out / name)
        self._write_manifest({"state": "complete", "fingerprint": plan["fingerprint"], "files": files})
        for folder in sorted({(self.out / name).parent for name in files} | {self.out}):
            sync_dir(folder)  # the renames above on the disk before _SUCCESS vouches for them
        sweep.join()  # (the checkpoints' deletion, beside the manifest and the syncs)
        if self.work.exists():
            shutil.rmtree(self.work)
        maybe_crash("commit:before-success")
        atomic_write_bytes(self.out / SUCCESS_NAME, f"{plan['fingerprint']}\n".encode())
        return files

    def _abandon(self, plan: dict) -> dict:
        if not self._own_commit:  # this run's own fails with its error (commit)
            log.warning("an interrupted commit in %s cannot be completed (a staged output is gone); its files are "
                        "kept as gpu_dedup's and the next run writes them again", self.out)
        owned = dict(plan["previous"])
        for name, rec in plan["files"].items():
            stamp = self._stamp(name)
            if stamp is not None:
                owned[name] = {**rec, **stamp}
        self._write_manifest({"state": "incomplete", "fingerprint": plan["fingerprint"], "files": {},
                              "previous": owned})
        remove_tree(self.work)
        return {}

    def _stamp(self, name: str) -> dict | None:
        """What tells later whether output ``name`` changed (its size and mtime), or None when it is not there."""
        if not os.path.lexists(self.out / name):
            return None
        st = os.stat(self.out / name)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}

    def _roll_forward(self, manifest: dict) -> None:
        log.warning("finishing the interrupted commit of an earlier run in %s", self.out)
        if "replaced" in manifest:  # (a plan written before this record: as before)
            for name, rec in manifest["files"].items():
                if self._staged_exists(name) and self._stamp(name) is not None and \
                        not self._as_recorded(name, manifest["replaced"].get(name), rec):
                    raise OutputError(
                        f"{str(self.out / name)!r} was put there after an interrupted run began publishing its "
                        f"outputs; finishing that commit would overwrite it: move it away, then rerun")
        self._apply(manifest)

    def _staged_exists(self, name: str) -> bool:
        return (self.staging / name).is_file()

    def _as_recorded(self, name: str, old: dict | None, new: dict) -> bool:
        """Whether output ``name`` is the earlier run's file ``old`` (or, moved already, the new one)."""
        return old is not None and self._unchanged(name, old)

    def _through_link(self, name: str) -> bool:
        """Whether a directory on the way from the output directory to ``name`` is a symbolic link."""
        parts = Path(name).parts[:-1]
        return any(os.path.islink(self.out / Path(*parts[:i + 1])) for i in range(len(parts)))

    def _prune_dirs(self, name: str) -> None:
        parent = (self.out / name).parent
        while parent != self.out and _inside(parent, self.out):
            try:
                parent.rmdir()
            except OSError:
                return
            parent = parent.parent


def replace_published(out, name: str, payload: bytes) -> None:
    """Rewrite ``name``, a file the complete run in ``out`` published (``gpu-dedup report`` renders
    report.html again), under the directory's lock: only when the manifest lists it and it is unchanged
    since; the manifest then records the new file, so the next run still owns it."""
    od = OutputDir(out, [])
    fd = take_lock(od.out / LOCK_NAME, lambda holder: (
        f"output directory {str(od.out)!r} is in use by a gpu-dedup run ({holder}); wait for it to finish"))
    try:
        manifest = od._manifest()
        rec = manifest.get("files", {}).get(name) if manifest.get("state") == "complete" else None
        if rec is None or (os.path.lexists(od.out / name) and not od._unchanged(name, rec)):
            raise OutputError(f"{str(od.out / name)!r} is not the unchanged output of a complete gpu_dedup run in "
                              f"{str(od.out)!r} (see its manifest {MANIFEST_NAME}); it is not overwritten: write the "
                              "page elsewhere with -o FILE, or rerun the run")
        atomic_write_bytes(od.out / name, payload)
        manifest["files"][name] = {**file_digest(od.out / name), "mtime_ns": os.stat(od.out / name).st_mtime_ns}
        od._write_manifest(manifest)
    finally:
        release_lock(od.out / LOCK_NAME, fd)


def take_lock(path: Path, busy) -> int:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created when missing) and write the holder
    (pid, host, start time) into it; returns its descriptor (see :func:`release_lock`).  Another process
    holding it: :class:`OutputError` with ``busy(holder)``.  Where ``flock`` is not supported the file's pid
    decides (a dead pid on this host is stale)."""
    for _ in range(10):  # the holder may unlink the file between our open and flock: retry on a new file
        try:
            # O_NOFOLLOW: a link at the lock's name is never written through (its target is not ours)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise OutputError(f"the lock file {str(path)!r} is a symbolic link; gpu_dedup keeps its own lock file "
                                  "there while it writes and never writes through a link: remove the link") from None
            mapped = write_error(path, exc)
            if mapped is exc:  # e.g. a directory in its place
                raise OutputError(f"cannot open the lock file {str(path)!r} ({exc.strerror}); gpu_dedup keeps a lock "
                                  "file there while it writes: move what is in its place away") from None
            raise mapped from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "unknown process"
            os.close(fd)
            raise OutputError(busy(holder)) from None
        except OSError as exc:  # no flock here (some network file systems): the holder's pid decides
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise write_error(path, exc) from None
            _check_pid_lock(fd, path, busy)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        return fd
    raise OutputError(f"could not lock {str(path)!r}: the lock file keeps changing; is another run starting there?")


def release_lock(path: Path, fd: int) -> None:
    """Remove the lock file ``path`` and release the lock held on ``fd`` (:func:`take_lock`)."""
    try:
        os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def _check_pid_lock(fd: int, path: Path, busy) -> None:
    text = os.read(fd, 4096).decode("utf-8", "replace")
    parts = text.split()
    if len(parts) >= 4 and parts[0] == "pid" and parts[1].isdigit():
        pid, host = int(parts[1]), parts[3].rstrip(",")
        if pid != os.getpid() and (host != socket.gethostname() or _pid_alive(pid)):
            os.close(fd)
            raise OutputError(f"{busy(text.strip())} (or delete {str(path)!r} if that run is gone)")


def check_output_path(out, inputs, read_back: str, what: str = "output directory", flag: str = "-o") -> None:
    """Refuse (exit 4), before anything is written, an output directory ``out`` that exists as a file or lies
    inside a directory among ``inputs`` (a path, or a list of them; globs and files are not directories), where
    a later run would read ``read_back``."""
    if is_url(out):  # only a run's output directory may be an object store (run/remote_outdir.py)
        raise OutputError(f"{what} {str(out)!r} is a URL; {flag} must be a local directory here (run outputs and "
                          "indexes may be in an object store, evaluate and tune outputs may not)")
    out = Path(out)
    _check_name_lengths(out, what, flag)
    _check_links(out, what, flag)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{what} {str(out)!r} exists and is not a directory; {flag} names a directory: choose "
                          "another path or move the file away")
    items = [inputs] if isinstance(inputs, (str, os.PathLike)) else (inputs or ())
    real = out.resolve()
    for item in items:
        if isinstance(item, (str, os.PathLike)) and os.path.isdir(item) and _inside(real, Path(item).resolve()):
            raise OutputError(f"{what} {str(out)!r} is inside the input directory {os.fspath(item)!r}: a later run "
                              f"would read {read_back}; choose {'an' if what[0] in 'aeiou' else 'a'} {what} outside "
                              "the inputs")


def _check_name_lengths(out: Path, what: str, flag: str) -> None:
    """A name on the way to ``out`` longer than the file system allows (255 bytes on most): an output error
    naming it, before anything is made (it was "cannot use ... check the path", exit 3)."""
    probe = out.absolute()
    while not os.path.isdir(probe) and probe.parent != probe:  # (Path.exists raises for a name too long)
        probe = probe.parent
    try:
        limit = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in out.parts:
        size = len(os.fsencode(part))
        if size > limit:
            shown = part if len(part) <= 40 else f"{part[:20]}...{part[-10:]}"
            raise OutputError(f"{what} {flag} holds the name {shown!r}, {size} bytes long; the file system allows "
                              f"{limit} bytes per name, so it cannot be made: choose a shorter {flag}")


def _check_links(out: Path, what: str, flag: str) -> None:
    """A symbolic link on the way to ``out`` that loops, or that points to nothing where a directory must be
    made: an output error naming it (the path cannot be a directory as given)."""
    try:
        out.resolve(strict=False)
    except (RuntimeError, OSError) as exc:  # a loop (RuntimeError before Python 3.13, OSError ELOOP since)
        raise OutputError(f"{what} {str(out)!r} goes through a looping symbolic link ({exc}); fix the link or "
                          f"choose another {flag}") from None
    probe = out
    while True:  # the nearest existing path: a link there must lead to a directory
        if os.path.lexists(probe):
            if os.path.islink(probe) and not os.path.exists(probe):
                raise OutputError(f"{what} {str(out)!r}: {str(probe)!r} is a symbolic link to {os.readlink(probe)!r}, "
                                  f"which does not exist, so no directory can be made there; create the link's target "
                                  f"(mkdir -p) or choose another {flag}")
            return
        if probe.parent == probe:
            return
        probe = probe.parent


def check_report_files(out, json_name: str, png_name: str, keys: tuple, inputs=None) -> None:
    """Before ``evaluate`` / ``tune`` write ``json_name`` and ``png_name`` into ``out``: refuse (exit 4) an
    existing file there that gpu_dedup did not write (its JSON lacks ``keys``; the picture counts as ours
    only beside our JSON, which is always written first), and an ``out`` inside an input directory (a
    later run would read the .json as an input shard)."""
    check_output_path(out, inputs, f"{json_name} as an input shard")
    out = Path(out)
    ours = False
    path = out / json_name
    if os.path.lexists(path):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            ours = isinstance(data, dict) and all(k in data for k in keys)
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise OutputError(f"{str(path)!r} exists and was not written by gpu_dedup; it would be overwritten: "
                              "choose another -o or move the file away")
    if os.path.lexists(out / png_name) and not ours:
        raise OutputError(f"{str(out / png_name)!r} exists and was not written by gpu_dedup (no {json_name} of "
                          "gpu_dedup beside it); it would be overwritten: choose another -o or move the file away")
