"""Errors a user can act on: each message names the problem, the value and the fix."""


class GpuDedupError(Exception):
    """Base class of every error gpu_dedup raises on purpose."""


class ConfigError(GpuDedupError, ValueError):
    """An invalid configuration value or key."""


class InputError(GpuDedupError, ValueError):
    """Input data that cannot be processed as given (missing columns, corrupt shards, ...)."""


class BackendError(GpuDedupError, RuntimeError):
    """A backend that was asked for but cannot run here."""


class ResourceError(GpuDedupError, RuntimeError):
    """The job does not fit the resources it was given (e.g. a Dask worker's memory limit)."""
