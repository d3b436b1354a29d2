"""Errors a user can act on: each message names the problem, the value and the fix.

Every class carries the process exit status ``gpu-dedup`` ends with when it
is raised (:data:`EXIT_CODES` is the documented table).
"""

import errno

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_OUTPUT = 4
EXIT_RESOURCES = 5
EXIT_TARGETS = 6
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a program whose output pipe was closed

EXIT_CODES = {
    EXIT_OK: "success: every output is written and verified, _SUCCESS marks the output directory",
    EXIT_INTERNAL: "internal error (a bug: please report it with the traceback printed by -v)",
    EXIT_USAGE: "usage or configuration error (bad option, config key or value, backend / Dask not available)",
    EXIT_INPUT: "bad input (missing, unreadable, corrupt or changed input files or columns)",
    EXIT_OUTPUT: "output conflict (output directory locked by another run, holds files gpu_dedup did not "
                 "write, collides with an input, or is not writable)",
    EXIT_RESOURCES: "out of resources (disk full, out of memory, Dask workers died)",
    EXIT_TARGETS: "evaluate --require-targets: the evaluation ran and a quality target was missed",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C / SIGINT / SIGTERM); rerun the same command to resume",
    EXIT_BROKEN_PIPE: "the reader of the output went away (e.g. gpu-dedup query ... | head); no message",
}


class GpuDedupError(Exception):
    """Base class of every error gpu_dedup raises on purpose."""

    exit_code = EXIT_USAGE


class ConfigError(GpuDedupError, ValueError):
    """An invalid configuration value or key."""

    exit_code = EXIT_USAGE


class InputError(GpuDedupError, ValueError):
    """Input data that cannot be processed as given (missing columns, corrupt shards, ...)."""

    exit_code = EXIT_INPUT


class OutputError(GpuDedupError, RuntimeError):
    """An output directory this run may not write: locked by another run, holding files gpu_dedup did
    not write where it would write, colliding with an input, or not writable."""

    exit_code = EXIT_OUTPUT


class BackendError(GpuDedupError, RuntimeError):
    """A backend that was asked for but cannot run here."""

    exit_code = EXIT_USAGE


class ResourceError(GpuDedupError, RuntimeError):
    """The job does not fit the resources it was given (e.g. a Dask worker's memory limit, a full disk)."""

    exit_code = EXIT_RESOURCES


class Interrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM at a moment where the default message ("the previous output is untouched") would be
    wrong: ``message`` says what the output directory holds and what to do."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


# ---------------------------------------------------------------- what this process has published


class Published:
    """What the run of this process has published, so that an error or an interrupt after its one commit point
    says so instead of "nothing was published": ``outputs`` (the output directory whose commit finished),
    ``index`` (the index the run builds or appends to, its manifest written after the outputs) and
    ``indexed`` (that manifest is written).  :func:`gpu_dedup.cli.main` starts each command afresh."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.outputs: str | None = None
        self.index: str | None = None
        self.indexed = False

    def message(self) -> str | None:
        """What an interrupt now means, or None before any output was published."""
        if self.outputs is None:
            return None
        where = f"the outputs in {self.outputs!r} were published and verified (_SUCCESS is there)"
        if self.index is not None and not self.indexed:
            return (f"interrupted after {where}, before this run's documents were added to the index "
                    f"{self.index!r}: rerun the same command to add them (it publishes the same outputs again)")
        also = f" and the index {self.index!r} holds this run's documents" if self.index is not None else ""
        return f"interrupted after the run completed: {where}{also}; nothing is left to do"


COMMITTED = Published()


def after_commit(exc: BaseException, outputs, index) -> "GpuDedupError":
    """The error to raise for ``exc`` (a failure adding the documents to ``index``) when the outputs in
    ``outputs`` are already published: its kind and detail, saying what was published and what to do."""
    if isinstance(exc, OSError):
        exc = write_error(index, exc)
    kind = type(exc) if isinstance(exc, GpuDedupError) else OutputError
    detail = str(exc)
    for said in ("; the partial file was removed and nothing was published", "; nothing was"):
        detail = detail.split(said)[0]  # what the message said of a run that had published nothing
    return kind(f"the outputs in {str(outputs)!r} were published and verified (_SUCCESS is there), but this run's "
                f"documents were not added to the index {str(index)!r}: {detail}; fix that and rerun the same "
                "command to add them (it publishes the same outputs again, deduplicated against the index as it is "
                "then)")


# ---------------------------------------------------------------- OS errors as one message


def read_error(path: str, exc: BaseException, message: str) -> Exception:
    """The error to raise for ``exc`` while reading ``path``: running out of memory (or disk) is the
    machine's limit, not the shard's fault; anything else is the shard's (``message``)."""
    if isinstance(exc, MemoryError):  # pa.ArrowMemoryError too
        return ResourceError(f"ran out of memory reading shard {path!r} ({exc}); the shard itself may be fine: "
                             "free memory, raise the memory limit, or split the input into smaller shards "
                             "(with --workers: lower cluster.block_rows)")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.ENOSPC):
        return ResourceError(f"out of resources reading shard {path!r} ({exc.strerror}); the shard itself may be "
                             "fine: free memory or disk space and rerun")
    return InputError(message)


def write_error(path, exc: OSError) -> Exception:
    """One clear error for an OS error writing ``path``: disk full, read-only or not permitted; else ``exc``."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "quota exceeded" in text.lower():
        return ResourceError(f"disk full writing {str(path)!r} ({exc.strerror or text}); the partial file was removed "
                             "and nothing was published for this run: free space (or choose another -o) and rerun")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only file system" in text \
            or "Permission denied" in text:
        return OutputError(f"cannot write {str(path)!r} ({exc.strerror or text}); the output directory must be "
                           "writable: choose another -o or fix its permissions")
    return exc
