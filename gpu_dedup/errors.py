"""Errors a user can act on: each message names the problem, the value and the fix.

Every class carries the process exit status ``gpu-dedup`` ends with when it
is raised (:data:`EXIT_CODES` is the documented table).
"""

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_INPUT = 3
EXIT_OUTPUT = 4
EXIT_RESOURCES = 5
EXIT_TARGETS = 6
EXIT_INTERRUPTED = 130

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
