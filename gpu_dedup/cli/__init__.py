"""Command line: ``gpu-dedup run | demo | config | evaluate | tune | dataset | index | query | report | bench``.

``parser`` builds the argument parser, ``commands`` holds one function per
subcommand; :func:`main` runs one and turns every error a user can cause into
one line and an exit status (:data:`gpu_dedup.errors.EXIT_CODES`).
"""

from __future__ import annotations

import errno
import logging
import signal
import sys

from gpu_dedup.cli.commands import cmd_bench_own_parser
from gpu_dedup.cli.parser import build_parser, unrecognized
from gpu_dedup.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    ConfigError,
    GpuDedupError,
    InputError,
    ResourceError,
)

log = logging.getLogger("gpu_dedup")


class _ShuffleChatter(logging.Filter):
    """Drops the two lines Dask's P2P shuffle logs at WARNING for every shuffle it starts and ends
    (normal operation: ``Shuffle <id> initialized by task ...`` and ``... deactivated due to stimulus``;
    18 of them in a two-worker run).  Every other shuffle message, its errors included, passes."""

    ROUTINE = ("Shuffle %s initialized by task", "Shuffle %s deactivated due to stimulus")

    def filter(self, record) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))


def _setup_logging(verbosity: int, quiet: bool) -> None:
    import os

    # -q: nothing but errors (a run's own failure is one line on stderr, printed by main, not logged)
    level = logging.ERROR if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from gpu_dedup.run.progress import attach_to_handlers

    attach_to_handlers()  # log lines wipe a live progress line first (terminal)
    for noisy in ("numba", "distributed", "bokeh", "tornado", "botocore", "aiobotocore", "s3fs", "fsspec", "gcsfs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if verbosity == 0:
        # Dask sets its loggers' levels when it is imported (by --workers / --scheduler runs, later): ask it for
        # WARNING there, in this process and in the worker processes, which inherit the environment; -v shows all
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        shuffle = logging.getLogger("distributed.shuffle._scheduler_plugin")
        if not any(isinstance(f, _ShuffleChatter) for f in shuffle.filters):
            shuffle.addFilter(_ShuffleChatter())


def _fail(message: str, code: int) -> int:
    print(f"gpu-dedup: error: {message}", file=sys.stderr)
    return code


def _os_error(exc: OSError, output=None) -> GpuDedupError | None:
    """An OS error a user can act on (disk full, read-only, missing file) as one clear error; else None.
    ``output``: the command's output path, named when the error does not say which file (Arrow's writers)."""
    from gpu_dedup.errors import write_error

    where = exc.filename if exc.filename is not None else (f"a file in {output}" if output else "a file")
    mapped = write_error(where, exc)
    if mapped is not exc:
        return mapped
    if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
        return InputError(f"cannot use {str(where)!r} ({exc.strerror}); check the path")
    if exc.errno == errno.ENOMEM:
        return ResourceError(f"out of memory ({exc.strerror}); free memory or split the input")
    return None


# path arguments an empty string must not stand for (-c "" is allowed: the default config)
PATH_OPTIONS = {"output": "-o", "index_out": "--index-out", "against": "--against", "index": "INDEX"}


def _refuse_empty_paths(args) -> None:
    """An empty path (often an unset shell variable, -o "$OUT") would mean the current directory; refuse it."""
    for attr, flag in PATH_OPTIONS.items():
        value = getattr(args, attr, None)
        if value == "":
            dot = f"{flag} ." if flag.startswith("-") else "."
            raise ConfigError(f"{flag} is given the empty path {value!r} (an unset shell variable?); give a path "
                              f"({dot} for the current directory)")


def _signal_to_interrupt(signum, frame):  # SIGTERM ends a run as Ctrl-C does: checkpoints stay consistent
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and getattr(args, "func", None) is not cmd_bench_own_parser:
        unrecognized(parser, args, rest)
    if rest:
        args.bench_args = rest
    _setup_logging(args.verbose, args.quiet)
    if argv is None:  # the gpu-dedup process itself (not a caller's main([...])): SIGTERM as Ctrl-C
        signal.signal(signal.SIGTERM, _signal_to_interrupt)
    try:
        _refuse_empty_paths(args)
        return args.func(args)
    except GpuDedupError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted; completed stages are checkpointed and the previous complete output (if any) is "
                     "untouched: rerun the same command to resume", EXIT_INTERRUPTED)
    except MemoryError as exc:
        return _fail(f"out of memory ({exc or 'allocation failed'}); free memory, split the input into smaller "
                     "shards or use --workers with a lower cluster.block_rows", ResourceError.exit_code)
    except OSError as exc:
        mapped = _os_error(exc, getattr(args, "index_out", None) or getattr(args, "output", None))
        if mapped is None:
            raise
        if args.verbose:
            log.debug("details", exc_info=True)
        return _fail(str(mapped), mapped.exit_code)
    except Exception:
        log.critical("internal error (a bug in gpu_dedup; please report it with this traceback):", exc_info=True)
        return EXIT_INTERNAL


__all__ = ["main", "build_parser"]
