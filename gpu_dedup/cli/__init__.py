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
import threading

from gpu_dedup.cli.commands import cmd_bench_own_parser
from gpu_dedup.cli.parser import build_parser, unrecognized
from gpu_dedup.errors import (
    COMMITTED,
    EXIT_BROKEN_PIPE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    ConfigError,
    GpuDedupError,
    InputError,
    ResourceError,
)

log = logging.getLogger("gpu_dedup")


class _AbandonedGather(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" for Dask's ``AllExit``: the client's gather
    raises it in the waiting tasks it abandons when the main thread stops waiting (Ctrl-C, SIGTERM, an
    error), and nobody retrieves it; a traceback per block of work, of no use to anyone."""

    def filter(self, record) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and type(exc).__name__ == "AllExit"
                    and str(record.msg).startswith("Task exception was never retrieved"))


def _setup_logging(verbosity: int, quiet: bool) -> None:
    import os

    # -q: nothing but errors (a run's own failure is one line on stderr, printed by main, not logged).  gpu_dedup's
    # own lines at INFO (-v: DEBUG); other libraries' only from WARNING (-v: INFO), so that matplotlib's font cache
    # or Dask's workers do not narrate a run
    level = logging.ERROR if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    others = logging.ERROR if quiet else (logging.INFO if verbosity > 0 else logging.WARNING)
    fresh = not logging.getLogger().handlers  # a caller that configured logging (a test, an application) keeps it
    logging.basicConfig(level=others, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    if fresh:
        log.setLevel(level)
    from gpu_dedup.run.progress import attach_to_handlers

    attach_to_handlers()  # log lines wipe a live progress line first (terminal)
    for noisy in ("numba", "distributed", "bokeh", "tornado", "botocore", "aiobotocore", "s3fs", "fsspec", "gcsfs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _AbandonedGather) for f in asyncio_log.filters):
        asyncio_log.addFilter(_AbandonedGather())
    if verbosity == 0:
        # Dask sets its loggers' levels when it is imported (by --workers / --scheduler runs, later): ask it for
        # WARNING there, in this process and in the worker processes, which inherit the environment; -v shows all
        # (-q: ERROR); a local cluster's workers and scheduler log at that level too (run/cluster/connection.py)
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error" if quiet else "warning")
        from gpu_dedup.run.quiet import quiet_shuffles

        quiet_shuffles()


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


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit does not raise BrokenPipeError again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a caller's StringIO): nothing to flush
        pass


def _check_environment() -> None:
    """Environment variables gpu_dedup's libraries read, checked before they fail deep inside a run."""
    import os

    threads = os.environ.get("NUMBA_NUM_THREADS")
    if threads is not None and not (threads.isdigit() and int(threads) > 0):
        raise ConfigError(f"NUMBA_NUM_THREADS = {threads!r} is not a positive number of threads; unset it (Numba "
                          f"then uses every core, {os.cpu_count()} here) or set it to a number from 1 up")


_interrupt = {"signal": None, "acknowledged": False, "redelivered": 0}


def _signal_to_interrupt(signum, frame):  # SIGTERM ends a run as Ctrl-C does: checkpoints stay consistent
    _interrupt["signal"] = signum
    if not logging.getLogger("gpu_dedup").isEnabledFor(logging.DEBUG):  # -v: everything; else the stop is one line
        logging.getLogger("distributed").setLevel(logging.ERROR)  # not "worker still alive, killing" while closing
    raise KeyboardInterrupt


def _unraisable(previous):
    """``sys.unraisablehook`` that delivers an interrupt again when Python swallowed it: a signal handler
    runs between any two bytecodes of the main thread, also inside a garbage-collector callback (Dask's
    GCDiagnosis) or a ``__del__``, where an exception cannot propagate and is only printed ("Exception
    ignored in ..."); the run then went on to exit 0.  The signal is sent again a moment later from another
    thread, until the main thread takes it; other unraisable exceptions go to the previous hook."""

    def hook(unraisable):
        exc_type = unraisable.exc_type
        if exc_type is None or not issubclass(exc_type, KeyboardInterrupt) or _interrupt["signal"] is None:
            return previous(unraisable)
        if not _interrupt["acknowledged"]:
            _interrupt["redelivered"] += 1
            delay = min(0.01 * 2 ** min(_interrupt["redelivered"], 6), 0.5)  # 20 ms, then longer: callbacks end
            timer = threading.Timer(delay, _redeliver, (_interrupt["signal"],))
            timer.daemon = True
            timer.start()

    return hook


def _redeliver(signum) -> None:
    import os

    if not _interrupt["acknowledged"]:
        os.kill(os.getpid(), signum)


INTERRUPTED_RUN = ("interrupted; completed stages are checkpointed and the previous complete output (if any) is "
                   "untouched: rerun the same command to resume")
# what an interrupt means for the commands that only read, or write one file at their end
_READS = "; it only reads: the index, the inputs and every file are as they were: run it again"
INTERRUPTED = {
    "cmd_query": "interrupted before every query was answered" + _READS,
    "cmd_index_info": "interrupted" + _READS,
    "cmd_config": "interrupted" + _READS,
    "cmd_report": "interrupted; the page was not written (report.json and any earlier page are as they were): run "
                  "it again",
    # they write their results at their end, each file whole or not at all; nothing resumes
    "cmd_evaluate": "interrupted before the evaluation's results were written (any earlier ones are as they were): "
                    "run it again",
    "cmd_tune": "interrupted before the comparison's results were written (any earlier ones are as they were): run "
                "it again",
    "cmd_dataset": "interrupted before the dataset's file was written (an earlier one is as it was): run it again",
    # a build keeps no checkpoints (its run works in a temporary directory): there is nothing to resume
    "cmd_index_build": "interrupted; no index was left (a build writes it whole or not at all): rerun the same "
                       "command",
}


def main(argv=None) -> int:
    if argv is None:  # the gpu-dedup process itself (not a caller's main([...])): SIGTERM as Ctrl-C, from the start
        signal.signal(signal.SIGTERM, _signal_to_interrupt)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell ignores it
            signal.signal(signal.SIGINT, _signal_to_interrupt)
        sys.unraisablehook = _unraisable(sys.unraisablehook)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and getattr(args, "func", None) is not cmd_bench_own_parser:
        unrecognized(parser, args, rest)
    if rest:
        args.bench_args = rest
    _setup_logging(args.verbose, args.quiet)
    COMMITTED.reset()
    try:
        _refuse_empty_paths(args)
        _check_environment()
        if argv is None:  # the gpu-dedup process itself, gpu_dedup's own: its Arrow memory pool too
            from gpu_dedup.storage.pool import use_preferred_pool

            use_preferred_pool()
        code = args.func(args)
        if _interrupt["signal"] is not None and not _interrupt["acknowledged"]:
            # the interrupt was raised where a library caught it (an optional import's ``except:``) and the
            # command went on to its end: what it printed or wrote is whole
            _interrupt["acknowledged"] = True
            log.warning("%s came while the command started and was lost inside a library; the command went on "
                        "and completed: its results are whole", signal.Signals(_interrupt["signal"]).name)
        return code
    except GpuDedupError as exc:
        return _fail(str(exc), exc.exit_code)
    except BrokenPipeError:  # the reader of stdout went away (e.g. `| head -2`): no message, the shell's status
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt as exc:
        _interrupt["acknowledged"] = True
        return _fail(getattr(exc, "message", None) or COMMITTED.message() or
                     INTERRUPTED.get(getattr(args.func, "__name__", ""), INTERRUPTED_RUN), EXIT_INTERRUPTED)
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


def console() -> None:
    """The ``gpu-dedup`` command (and ``python -m gpu_dedup``): :func:`main`, then the process ends as soon as
    its work is done and flushed.

    Once a run has loaded its compiled kernels, the interpreter's own teardown (freeing every module and
    Numba's and LLVM's state) takes 0.3 to 1 s, longer than the stages of a small run.  The exit handlers
    still run (a Dask cluster is closed, temporary directories are removed, logs are flushed); only that
    teardown is skipped, and only when no other non-daemon thread is alive (otherwise Python exits as
    usual, joining it).  Outputs are committed, synced and closed before :func:`main` returns."""
    import atexit
    import os

    from gpu_dedup.run.clock import count_process_start  # standard library only: nothing heavy imported yet

    count_process_start()  # a run's report books the interpreter's start and the imports as its "startup"
    code = main()
    code = 0 if code is None else code if isinstance(code, int) else 1
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if run_exit_handlers is None or others:
        sys.exit(code)
    run_exit_handlers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said there
            pass
    os._exit(code)


__all__ = ["main", "build_parser", "console"]
