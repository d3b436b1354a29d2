"""An output directory in an object store (``-o s3://bucket/out/``): the rules of
:mod:`gpu_dedup.run.outdir` where there is no rename and no ``flock``.

An object store publishes an object whole or not at all, but cannot rename one, lock
one or make several appear at once.  The same guarantees as on a local disk are kept
this way:

- **Lock object.**  ``<out>/.gpu_dedup.lock`` is created only if absent (a conditional
  write: S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``; stores without one are
  written after finding none, then read back) and holds a random owner token, pid, host
  and start time.  A second run finds it and stops (exit 4) naming the holder.  A lock
  left by a killed run on this host (its pid is gone) is taken over; a lock of another
  host cannot be judged from here: the message says to delete the object if that run is
  gone.  The token is read back before the commit and before ``_SUCCESS``: a run whose
  lock was taken over publishes nothing.  The lock is deleted when the run ends.
- **Staged prefix.**  Every output (shards, ``duplicates.parquet``, ``report.json``,
  ``report.html``) and every checkpoint is uploaded under
  ``<out>/.gpu_dedup_checkpoint/``; a process killed in an upload leaves no object
  there, only an incomplete multipart upload, which the next run aborts.
- **Commit.**  Each staged object is verified (present; size and SHA-256 as recorded
  when it was uploaded, the SHA-256 kept in the object's metadata; Parquet: footer and
  row count read back), the plan is written to the manifest
  ``<out>/.gpu_dedup_manifest.json``, ``_SUCCESS`` is deleted, each staged object is
  copied to its name (a server-side copy) and checked, the previous run's objects this
  run does not produce are deleted, the staged prefix is deleted, the manifest is
  written as complete and **``_SUCCESS`` last**, holding the run's fingerprint.  While
  the commit runs, the prefix holds old and new objects and no ``_SUCCESS``: readers
  must wait for ``_SUCCESS`` (as Spark's and Hadoop's readers do).  A run killed during
  the commit is finished by the next run on the prefix, from any machine (the plan is
  in the manifest, the staged objects in the store).
- **Resume.**  Checkpoints live in the store beside the staged outputs, so rerunning
  the same command resumes, on this machine or another.
- **Ownership.**  The manifest records every object a run published (size, SHA-256 and
  the store's ETag or generation); an object at an output name that is not listed, or
  changed since, stops the run before anything is written (exit 4).  Nothing else under
  the prefix is touched.
- **Refused:** an output URL of a read-only store (``http://``, ``https://``), a glob as
  an output, an output prefix inside an input prefix, an object where the output
  "directory" would be.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from typing import Any

from gpu_dedup.errors import OutputError
from gpu_dedup.run.checkpoint import CHECKPOINT_DIR, maybe_crash
from gpu_dedup.run.outdir import (
    BOOKKEEPING,
    LOCK_NAME,
    MANIFEST_NAME,
    STAGED,
    SUCCESS_NAME,
    OutputDir,
    _pid_alive,
)
from gpu_dedup.storage.filesystems import (
    READ_ONLY,
    RemotePath,
    abort_uploads,
    copy,
    digest,
    filesystem,
    input_prefix,
    is_url,
    list_objects,
    protocol,
    put_bytes,
    put_exclusive,
    remote_error,
    remove_tree,
)

log = logging.getLogger("gpu_dedup")


class RemoteOutputDir(OutputDir):
    """The output "directory" (a prefix of an object store) of one run; see the module doc.  The interface of
    :class:`gpu_dedup.run.outdir.OutputDir` (a context manager holding the lock: here a lock object)."""

    out: Any  # a RemotePath: the interface of the local directory's Path that the base class uses
    _fd: Any  # the lock object's token while this run holds it

    @property
    def work(self) -> Any:  # a RemotePath (the base class's, typed as its Path)
        return self.out / CHECKPOINT_DIR

    def __init__(self, out, shards, inputs=(), *, duplicates: bool = True, shards_written: bool = True):
        if isinstance(inputs, (str, os.PathLike, RemotePath)):
            inputs = [inputs]
        super().__init__(str(out), shards, [str(i) if isinstance(i, RemotePath) else i for i in inputs or ()],
                         duplicates=duplicates, shards_written=shards_written)
        self.out = RemotePath(str(out))
        self.inputs = [str(i) for i in self.inputs]
        self.token = secrets.token_hex(16)  # ``_fd`` holds it while this run holds the lock object

    # ------------------------------------------------------------------ open / close
    # open(): the local directory's (collisions, lock, interrupted commit, foreign objects), with these steps
    def _sweep_temporaries(self) -> None:
        """What a killed run leaves in a store: incomplete multipart uploads, aborted."""
        aborted = abort_uploads(self.work)
        if aborted:
            log.info("aborted %d unfinished upload(s) of an interrupted run under %s", aborted, self.work)

    def close(self) -> None:
        if self._fd is None:
            return
        self._fd = None
        self._lock_object().release()

    # ------------------------------------------------------------------ checks
    def _check_collisions(self) -> None:
        out = self.out
        if protocol(out.url) in READ_ONLY:
            raise OutputError(f"output {out.url!r}: {protocol(out.url)}:// URLs are read-only; write the outputs to a "
                              "local directory or an object store (s3://, gs://, ...)")
        if any(c in out.url for c in "*?["):
            raise OutputError(f"output {out.url!r} is a glob pattern; -o names one directory or prefix")
        try:
            if out.is_file():
                raise OutputError(f"output {out.url!r} is an object, not a prefix; -o names a directory: choose "
                                  "another URL")
        except OutputError:
            raise
        except Exception as exc:  # noqa: BLE001 - a missing bucket, denied access: one message
            raise remote_error(out.url, exc, reading=False) from None
        for item in map(str, self.inputs):  # strings here (see __init__)
            # keys are exact (no '//' folded): the output's objects are read back by a later run of this input
            # when their keys start with the key prefix the input lists (s3://b/crawl/ lists crawl//x too;
            # s3://b/crawl// does not list crawl/out/).  A glob is not checked: what it matches is its own
            # (a run's outputs below it are skipped by discovery, as they are below a prefix)
            if is_url(item) and not any(c in item for c in "*?[") and (out.url + "/").startswith(input_prefix(item)):
                raise OutputError(f"output directory {out.url!r} is inside the input prefix {item!r}: a later run "
                                  "would read its outputs as inputs; choose an output outside the inputs")
        reserved = set(self.published) | set(BOOKKEEPING)
        for s in self.shards:
            if s.format == "memory":
                continue
            if s.name in reserved or s.name.split("/")[0] in BOOKKEEPING:
                raise OutputError(
                    f"input shard {s.path!r} would be written as {s.name!r}, a name gpu_dedup uses for its own "
                    f"output ({', '.join(self.published)}); rename the input object, or pass it inside a prefix")
            if str(out / s.name) == s.path:
                raise OutputError(f"output {str(out / s.name)!r} would overwrite input shard {s.path!r}; choose "
                                  "another output")
            if s.path.startswith(str(self.work) + "/"):
                raise OutputError(f"input shard {s.path!r} lies in gpu_dedup's work prefix of {out.url!r}; give "
                                  "the input shards themselves")

    def _listing(self) -> dict:
        """Every object under the output prefix: relative name -> info."""
        try:
            return _listing_under(self.out)
        except Exception as exc:  # noqa: BLE001 - a missing bucket, denied access: one message
            raise remote_error(self.out.url, exc, reading=False) from None

    def _check_foreign(self) -> None:
        manifest = self._manifest()
        owned = self._owned(manifest)
        for s in self.shards:
            if s.format != "memory" and s.path.startswith(self.out.url + "/") and \
                    s.path[len(self.out.url) + 1:] in owned:
                raise OutputError(
                    f"input shard {s.path!r} is an output of an earlier gpu_dedup run in {self.out.url!r}; the inputs "
                    "must not include the output prefix: narrow the input pattern or choose another -o")
        listing = self._listing()
        for name in self.names + self.published:
            if name not in listing:
                continue
            if name == SUCCESS_NAME and self._our_success(manifest):
                continue
            where = str(self.out / name)
            if name not in owned:
                raise OutputError(
                    f"{where!r} exists and was not written by gpu_dedup (it is not in the output prefix's manifest "
                    f"{MANIFEST_NAME}); the run would overwrite it: move it away or choose an empty output prefix")
            if not _same(listing[name], owned[name]):
                raise OutputError(
                    f"{where!r} changed after gpu_dedup wrote it (size or ETag differ from its manifest "
                    f"{MANIFEST_NAME}); the run would overwrite it: move it away, or delete it to let the run write "
                    "it again")

    # ------------------------------------------------------------------ lock
    def _lock_object(self) -> LockObject:
        return LockObject(self.out / LOCK_NAME, self.token, lambda who: (
            f"output prefix {self.out.url!r} is in use by another gpu-dedup run ({who}); two runs cannot write "
            "one output: wait for it to finish, or choose another -o"))

    def _lock_holder(self) -> dict:
        return self._lock_object().holder()

    def _lock(self) -> None:
        self._lock_object().take()
        self._fd = self.token

    def _check_lock(self) -> None:
        """Still ours?  (A run whose lock was deleted or taken over publishes nothing.)"""
        if not self._lock_object().held():
            raise OutputError(f"the lock object {str(self.out / LOCK_NAME)!r} of this run was deleted or taken over "
                              "by another run; nothing more was published: rerun when no other run uses this output")

    # ------------------------------------------------------------------ commit
    def commit(self, fingerprint: str, expected_rows: dict, recorded: dict | None = None) -> dict:
        """Verify the staged objects and publish them, ``_SUCCESS`` last (see the module doc): the local
        directory's commit (its reads and writes of a URL go to the store), while this run holds the lock."""
        self._check_lock()
        return super().commit(fingerprint, expected_rows, recorded)

    def _apply(self, plan: dict) -> dict:
        """Copy the planned objects to their names, delete the previous run's others, then manifest and _SUCCESS."""
        (self.out / SUCCESS_NAME).unlink(missing_ok=True)
        files = plan["files"]
        staged_now = {k[len(STAGED) + 1:] for k in _listing_under(self.work) if k.startswith(STAGED + "/")}
        for name, rec in files.items():
            staged, final = self.staging / name, self.out / name
            if name in staged_now:
                copy(staged, final)
                maybe_crash("commit:renamed")
            got = _info(final)
            size = None if got is None else got.get("size")  # 0: an empty shard (every line removed)
            if size is None or int(size) != rec["size"] or \
                    (name not in staged_now and digest(final)["sha256"] != rec["sha256"]):
                return self._abandon(plan)
            rec["token"] = _token(got)
        listing = self._listing()
        for name, rec in plan["previous"].items():
            if name in files or name == SUCCESS_NAME or name not in listing:
                continue
            if _same(listing[name], rec):
                (self.out / name).unlink(missing_ok=True)
            else:
                log.warning("%s was written by an earlier run but changed since; left in place", self.out / name)
        remove_tree(self.work)
        self._write_manifest({"state": "complete", "fingerprint": plan["fingerprint"], "files": files})
        maybe_crash("commit:before-success")
        self._check_lock()
        put_bytes(self.out / SUCCESS_NAME, f"{plan['fingerprint']}\n".encode())
        return files

    def _staged_exists(self, name: str) -> bool:
        return _info(RemotePath(str(self.staging / name))) is not None  # (staging is typed as a local Path)

    def _as_recorded(self, name: str, old: dict | None, new: dict) -> bool:
        """Whether object ``name`` is the earlier run's ``old``, or already the copy of this commit's ``new``."""
        got = _info(self.out / name)
        if got is None:
            return True
        if old is not None and _same(got, old):
            return True
        return digest(self.out / name) == {"size": new["size"], "sha256": new["sha256"]}

    def _stamp(self, name: str) -> dict | None:
        """Size and ETag (generation) of the object ``name``, or None when there is none."""
        got = _info(self.out / name)
        return None if got is None else {"size": int(got.get("size") or 0), "token": _token(got)}


class LockObject:
    """A lock in an object store: the object ``path``, created only if absent (a conditional write) and holding
    a random owner ``token``, pid, host and start time.  :meth:`take` stops (``OutputError``, exit 4) with
    ``busy(holder)`` while another run holds it; a lock left by a run on this host whose pid is gone is taken
    over; one of another host cannot be judged from here (the message says to delete it if that run is gone)."""

    def __init__(self, path: RemotePath, token: str, busy):
        self.path, self.token, self.busy = path, token, busy

    def holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            return {"holder": "unreadable lock object"}
        return data if isinstance(data, dict) else {}

    def held(self) -> bool:
        """Whether this token still holds the lock (not deleted nor taken over meanwhile)."""
        return self.holder().get("token") == self.token

    def take(self) -> None:
        body = json.dumps({"token": self.token, "pid": os.getpid(), "host": socket.gethostname(),
                           "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode()
        for _ in range(5):
            if put_exclusive(self.path, body):
                if self.held():
                    return
                continue  # another run wrote it in the same moment (a store without conditional writes)
            holder = self.holder()
            if not holder:
                continue  # released meanwhile: try again
            who = (f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"
                   if "pid" in holder else holder.get("holder", "unknown"))
            pid = holder.get("pid")
            if holder.get("host") == socket.gethostname() and isinstance(pid, int) and pid != os.getpid() \
                    and not _pid_alive(pid):
                log.warning("taking over the lock %s of a run that is gone (%s)", self.path, who)
                self.path.unlink(missing_ok=True)
                continue
            raise OutputError(f"{self.busy(who)}; if that run is gone (killed on another machine), delete the lock "
                              f"object {str(self.path)!r}")
        raise OutputError(f"could not take the lock object {str(self.path)!r}: it keeps changing; is another run "
                          "starting there?")

    def release(self) -> None:
        try:
            if self.held():
                self.path.unlink(missing_ok=True)
        except Exception:  # noqa: BLE001 - closing after a failure: the failure is what the user sees
            log.debug("could not remove the lock object %s", self.path, exc_info=True)


def _token(info: dict) -> str:
    return str(info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
               or info.get("LastModified") or info.get("mtime") or "")


def _same(info: dict, rec: dict) -> bool:
    """An object is as the manifest recorded it: same size and ETag (generation)."""
    size = info.get("size")  # 0: an empty shard
    return size is not None and int(size) == rec.get("size") and _token(info) == rec.get("token")


def _info(path: RemotePath):
    fs, key = filesystem(path.url)
    try:
        return fs.info(key)
    except FileNotFoundError:
        return None


def _listing_under(prefix: RemotePath) -> dict:
    """The objects under ``prefix``: name relative to it -> the store's info."""
    root = prefix.key + "/"  # exactly: an output prefix s3://b/x//o lists x//o/..., never x/o/...
    return {k[len(root):]: v for k, v in list_objects(prefix.url + "/").items()}
