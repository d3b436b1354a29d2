"""Shard discovery: files, directories and glob patterns -> a sorted list of :class:`Shard`.

Shards are Parquet files, JSON Lines files (optionally .gz/.bz2/.zst
compressed) or Arrow IPC files (``.arrow``, as Hugging Face's ``save_to_disk``
writes them), or one in-memory Arrow table (format ``memory``, see
:func:`memory_shard`: the DataFrame API's input, never written back).

**A dataset saved with save_to_disk** (a directory with ``state.json``,
``dataset_info.json`` and ``data-*.arrow`` files; a ``DatasetDict`` has one
such directory per split beside ``dataset_dict.json``) is read as the dataset
it holds: in a directory with a ``state.json``, the ``.arrow`` files it lists
(``_data_files``) and no others (a cache's ``cache-*.arrow`` is not part of
the dataset); the JSON metadata files are never read as JSON Lines.

**What a directory input reads.**  Walking a directory (or expanding a glob
pattern) reads the files with a shard extension and skips every file *and
directory* whose name starts with ``.`` or ``_`` (hidden files, ``_SUCCESS``,
Spark's ``_temporary``, gpu_dedup's own ``.gpu_dedup_*`` bookkeeping).  Symbolic
links to directories are followed (as a glob follows them; a link to a directory
that contains it is an error), a directory a pattern matches is walked (Spark's
``data.parquet/`` of part files), a file reached twice (through a link) is read
once, and a directory that cannot be read is an error naming it.  Whatever a
walk leaves out is listed (:class:`Shards`, report.json's ``inputs_skipped``)
and what looks like data among it -- files of another extension, shard files
behind a ``.`` or ``_`` name -- is named in a warning.  A directory below what
is given that holds a gpu_dedup run's outputs (its manifest) or the work of a
run under way is skipped whole and named in one warning: an earlier run's
outputs are never read as more input; named itself, such a directory's shards
are read, less the run's own files.  A file named explicitly
on the command line is read whatever its name (even one holding ``*``, ``?`` or
``[``).  Every input must be a regular file (symbolic links to one are
followed): a FIFO, socket or device, a broken or looping link and a file name
that is not valid UTF-8 are refused with a message naming the file.  An input URL (``s3://bucket/crawl/``, ``gs://...``, any fsspec URL) names an
object, a prefix (read as a directory is) or a glob (see
:func:`gpu_dedup.storage.filesystems.remote_inputs`).
"""

from __future__ import annotations

import errno
import glob
import json
import logging
import os
import stat
import sys
from dataclasses import dataclass, field, replace

import pyarrow as pa

from gpu_dedup.errors import InputError
from gpu_dedup.storage.filesystems import input_size, is_url, local_path, remote_inputs
from gpu_dedup.storage.identity import PARQUET_EXT, shard_identity

log = logging.getLogger("gpu_dedup")

JSONL_EXT = (".jsonl", ".json", ".ndjson")
COMPRESSED_EXT = (".gz", ".bz2", ".zst")
ARROW_EXT = (".arrow",)
SHARD_KINDS = ".parquet, .jsonl[.gz] or .arrow"  # how messages name the files read (.pq, .json, .ndjson too)
DATASET_STATE = "state.json"  # save_to_disk: the dataset's Arrow files (_data_files) and format
DATASET_METADATA = (DATASET_STATE, "dataset_info.json", "dataset_dict.json")  # a saved dataset's, never shards
# what marks a directory holding a gpu_dedup run's outputs: its manifest (written before anything is
# published) or the work directory of a run under way (run/outdir.py, run/checkpoint.py use these names)
RUN_MANIFEST = ".gpu_dedup_manifest.json"
RUN_WORK = ".gpu_dedup_checkpoint"
RUN_OUTPUT_REASON = ("directory: holds the outputs of a gpu_dedup run (its " + RUN_MANIFEST + " or " + RUN_WORK +
                     "); name it to read it")
RUN_FILES = ("duplicates.parquet", "report.json", "report.html")  # a run's own files beside its shards
RUN_FILE_REASON = "a file of the gpu_dedup run whose output this directory is, not a shard"


@dataclass(frozen=True)
class Shard:
    path: str  # absolute path of the input file
    name: str  # relative output name
    format: str  # parquet | jsonl | memory
    rows: int = -1  # filled by read()
    size: int = 0  # bytes on disk (memory: bytes of the table)
    data: pa.Table | None = field(default=None, compare=False, repr=False)  # the table of a memory shard
    identity: str = field(default="", compare=False, repr=False)  # shard_identity() when discovered
    text: object = field(default=None, compare=False, repr=False)  # a memory shard's text column on the device

    def with_rows(self, rows: int) -> "Shard":
        return replace(self, rows=rows)


MEMORY_PATH = "<memory>"


def memory_shard(table: pa.Table, name: str = "memory", text=None) -> Shard:
    """A virtual shard over an in-memory Arrow table (read by :func:`read_columns`, never written).
    ``text``: its text column in device memory (a cuDF Series), kept out of ``table``."""
    return Shard(MEMORY_PATH, name, "memory", size=table.nbytes, data=table, text=text)


def _format_of(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path.lower()
    for ext in COMPRESSED_EXT:
        if name.endswith(ext):
            name = name[: -len(ext)]
    if name.endswith(PARQUET_EXT):
        return "parquet"
    if name.endswith(JSONL_EXT):
        return "jsonl"
    if name.endswith(ARROW_EXT) and name == path.lower():
        return "arrow"
    raise InputError(
        f"cannot tell the format of {path!r} from its extension; use .parquet, .jsonl[.gz] or .arrow, "
        "or set input.format to parquet, jsonl or arrow"
    )


def _is_shard_name(name: str) -> bool:
    low = name.lower()
    if os.path.basename(low) in DATASET_METADATA:
        return False
    if low.endswith(ARROW_EXT):
        return not _skipped(os.path.basename(low))
    for ext in COMPRESSED_EXT:
        if low.endswith(ext):
            low = low[: -len(ext)]
    return low.endswith(PARQUET_EXT + JSONL_EXT) and not _skipped(os.path.basename(low))


def _skipped(name: str) -> bool:
    """Hidden (``.``) and private (``_``: ``_SUCCESS``, ``_temporary``) names are skipped in directory walks."""
    return name.startswith((".", "_"))

def _checked_file(path: str, shown: str) -> int:
    """Size of the regular file ``path``; an InputError naming ``shown`` for anything else."""
    try:
        shown.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"input file name {shown!r} is not valid UTF-8; rename it (e.g. convmv -f latin1 -t utf8) "
                         "or move it out of the input directory") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        if os.path.islink(path):
            kind = "a looping symbolic link" if exc.errno == errno.ELOOP else "a broken symbolic link"
            raise InputError(f"input {shown!r} is {kind} ({exc.strerror}); fix or remove the link") from None
        raise InputError(f"cannot read input {shown!r} ({exc.strerror}); check that it exists and is readable") \
            from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise InputError(f"input {shown!r} is {kind}; gpu_dedup reads regular files only: write the data to a "
                         "file first, or move it out of the input directory")
    return st.st_size


class Shards(list):
    """The shards :func:`discover` found (a list), with ``skipped``: what the walks and patterns left out,
    one ``{"path", "reason"}`` per file or directory (listed in report.json as ``inputs_skipped``)."""

    def __init__(self, items=(), skipped=()):
        super().__init__(items)
        self.skipped = list(skipped)


def _skip_reason(path: str, is_dir: bool) -> str | None:
    name = os.path.basename(path)
    if _skipped(name):
        return "hidden or private name (starts with . or _)"
    if not is_dir and name.lower() in DATASET_METADATA:
        return METADATA_REASON
    if not is_dir and not _is_shard_name(name):
        return "not a shard file name (" + ", ".join(PARQUET_EXT + JSONL_EXT + ARROW_EXT) + \
            ", the JSON ones also compressed)"
    return None


METADATA_REASON = "metadata of a Hugging Face dataset saved with save_to_disk"


def saved_dataset_files(directory: str) -> list[str] | None:
    """The Arrow files a ``save_to_disk`` directory's ``state.json`` lists, as paths in ``directory``, in its
    order; None when ``directory`` holds no ``state.json`` (not a saved dataset).  A listed file that is
    missing is an InputError: the dataset was not saved whole."""
    state = os.path.join(directory, DATASET_STATE)
    if not os.path.isfile(state):
        return None
    try:
        with open(state, encoding="utf-8") as f:
            listed = [item["filename"] for item in json.load(f)["_data_files"]]
        paths = [os.path.join(directory, name) for name in listed]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{state!r} is not the state.json of a dataset saved with save_to_disk ({exc!r}); save "
                         "the dataset again, or move the file away to read the directory's shards") from None
    outside = [name for name in listed if os.path.isabs(name) or ".." in name.replace("\\", "/").split("/")]
    if outside:  # its kept rows would be written outside the output directory, under the same relative name
        raise InputError(f"the saved dataset in {directory!r} lists {outside[0]!r} in its state.json, a file outside "
                         "its directory; save the dataset again (Dataset.save_to_disk), or name its files as inputs")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise InputError(f"the saved dataset in {directory!r} lists {missing[0]!r} in its state.json, and it is not "
                         "there; the dataset was not saved whole: save it again (Dataset.save_to_disk)")
    return paths


def _in_split_order(root: str, files: list[str]) -> list[str]:
    """A saved ``DatasetDict`` (``root`` holds ``dataset_dict.json``): its splits' files in the order it lists
    the splits (``train`` before ``test``, as the dataset has them), not by name; any other walk as it is."""
    try:
        with open(os.path.join(root, "dataset_dict.json"), encoding="utf-8") as f:
            splits = json.load(f)["splits"]
    except (OSError, ValueError, KeyError, TypeError):
        return files
    if not isinstance(splits, list):
        return files
    rank = {str(name): i for i, name in enumerate(splits)}
    return sorted(files, key=lambda f: rank.get(os.path.relpath(f, root).split(os.sep)[0], len(rank)))


def _saved_datasets(files: list[str], skipped: list) -> list[str]:
    """``files`` (a walk's, sorted) where each directory holding a ``state.json`` gives the Arrow files it
    lists, in its order, in place of the Arrow files found there (the others are skipped, with the reason)."""
    out, listed_in = [], {}
    for f in files:  # one step per file
        d = os.path.dirname(f)
        if d not in listed_in:
            listed_in[d] = saved_dataset_files(d)
            if listed_in[d] is not None:
                out += listed_in[d]
        listed = listed_in[d]
        if listed is None or not f.lower().endswith(ARROW_EXT):
            out.append(f)
        elif f not in listed:
            skipped.append({"path": f, "reason": f"not listed in {os.path.join(d, DATASET_STATE)!r}: not part of "
                                                 "the saved dataset"})
    return out


def is_run_output(directory: str) -> bool:
    """Whether a local directory holds a gpu_dedup run's outputs (or the work of a run under way)."""
    return os.path.lexists(os.path.join(directory, RUN_MANIFEST)) or \
        os.path.lexists(os.path.join(directory, RUN_WORK))


def _run_tables(root: str, files: list, skipped: list) -> list:
    """``files`` less a run's own files (``duplicates.parquet``, ``report.json``) in ``root``, a run's output
    directory named as an input: its shards are read (a second pass over a run's output), its own files
    listed as skipped (and not named in the warning about skipped files that look like data)."""
    if not is_run_output(root):
        return files
    own = {os.path.join(root, n) for n in RUN_FILES}
    for entry in skipped:
        if entry["path"] in own:
            entry["reason"] = RUN_FILE_REASON
    skipped.extend({"path": f, "reason": RUN_FILE_REASON} for f in files if f in own)
    return [f for f in files if f not in own]


def _walk(root: str, skipped: list) -> list[str]:
    """Shard files under ``root`` (sorted), following symbolic links to directories as a glob does; the
    files and directories left out are appended to ``skipped``.  An unreadable directory and a link to a
    directory that holds it (a loop) are errors naming them: a walk never reads less than it was given
    without saying so."""
    files = []
    stack = [(root, ())]
    while stack:  # one step per directory
        d, ancestors = stack.pop()
        try:
            st = os.stat(d)
            with os.scandir(d) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise InputError(f"cannot read directory {d!r} inside input {root!r} ({exc.strerror}); fix its "
                             "permissions, or move it out of the input directory") from None
        here = ancestors + ((st.st_dev, st.st_ino),)
        subdirs = []
        for e in entries:  # one step per directory entry
            path = os.path.join(d, e.name)
            try:
                is_dir = e.is_dir()  # follows a symbolic link
            except OSError:
                is_dir = False
            reason = _skip_reason(path, is_dir)
            if reason is not None:
                skipped.append({"path": path, "reason": ("directory: " if is_dir else "") + reason})
            elif is_dir and is_run_output(path):  # an earlier run's outputs are never read as more input
                skipped.append({"path": path, "reason": RUN_OUTPUT_REASON})
            elif is_dir:
                if e.is_symlink():
                    try:
                        target = os.stat(path)
                    except OSError:
                        target = None
                    if target is not None and (target.st_dev, target.st_ino) in here:
                        raise InputError(f"input directory {root!r} holds {path!r}, a symbolic link to a directory "
                                         "that contains it (a loop); remove the link, or pass the directories "
                                         "to read one by one")
                subdirs.append(path)
            else:
                files.append(path)  # regular or not: discover() checks it
        stack.extend((sd, here) for sd in reversed(subdirs))
    return _run_tables(root, sorted(files), skipped)


def _warn_skipped(skipped: list) -> None:
    """One warning naming the skipped files that look like data: visible files of another extension and
    shard files behind a hidden or private name (the rest, e.g. ``_SUCCESS`` or ``.git``, is expected);
    one naming the directories skipped as a run's outputs."""
    runs = list(dict.fromkeys(s["path"] for s in skipped if s["reason"] == RUN_OUTPUT_REASON))
    if runs:
        more = f" and {len(runs) - 5} more" if len(runs) > 5 else ""
        log.warning("skipped %d director%s inside the inputs holding the outputs of a gpu-dedup run (its %s): %s%s; "
                    "an earlier run's outputs are never read as more input: name such a directory explicitly "
                    "to read its shards", len(runs), "y" if len(runs) == 1 else "ies", RUN_MANIFEST,
                    ", ".join(repr(p) for p in runs[:5]), more)
    shown = [s["path"] for s in skipped if not s["reason"].startswith("directory") and s["reason"] != RUN_FILE_REASON
             and s["reason"] != METADATA_REASON and not os.path.basename(s["path"]).startswith(".gpu_dedup")
             and (not _skipped(os.path.basename(s["path"])) or _is_shard_name(os.path.basename(s["path"]).lstrip("._")))]
    if shown:
        more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
        log.warning("skipped %d input file(s) that are not read as shards: %s%s (only %s files are read, the JSON "
                    "ones also as .gz, .bz2 or .zst, and names starting with . or _ are skipped; report.json lists "
                    "every file skipped under inputs_skipped); name a file explicitly to read it whatever its name",
                    len(shown), ", ".join(repr(p) for p in shown[:5]), more,
                    ", ".join(PARQUET_EXT + JSONL_EXT + ARROW_EXT))


def _run_output_below(base: str, path: str, seen: dict) -> str | None:
    """The directory below ``base`` on the way to ``path`` (``path`` itself when a directory) that holds a
    run's outputs, or None; ``seen`` caches each directory's answer (a pattern's matches share them)."""
    rel = os.path.relpath(path, base)
    if rel == "." or rel.startswith(".."):
        return None
    parts = rel.split(os.sep)
    if not os.path.isdir(path):
        parts = parts[:-1]
    d = base
    for p in parts:
        d = os.path.join(d, p)
        if d not in seen:
            seen[d] = is_run_output(d)
        if seen[d]:
            return d
    return None


def discover(inputs, fmt: str = "auto", warn: bool = True) -> Shards:
    """Expand files, directories (recursively) and glob patterns into a sorted shard list
    (a list of Shard objects, e.g. memory shards, is returned as it is); see the module doc for
    what a directory input reads.  ``warn``: log what the walks skipped that looks like data (see
    :class:`Shards` for the full list)."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if isinstance(inputs, list) and inputs and all(isinstance(s, Shard) for s in inputs):
        return inputs if isinstance(inputs, Shards) else Shards(inputs)
    found: list[tuple[str, str]] = []  # (absolute path, relative name)
    skipped: list[dict] = []
    for item in inputs:
        item = local_path(str(item) if is_url(item) else os.fspath(item))
        if is_url(item):
            found += remote_inputs(item, _is_shard_name, _skipped, skipped_list=skipped,
                                   run_markers=(RUN_MANIFEST, RUN_WORK, RUN_OUTPUT_REASON, RUN_FILES, RUN_FILE_REASON))
        elif os.path.isdir(item):
            root = os.path.abspath(item)
            files = _in_split_order(root, _saved_datasets(_walk(root, skipped), skipped))
            if not files:
                raise InputError(
                    f"input directory {item!r} holds no {SHARD_KINDS} files (nor .pq, .json, .ndjson; "
                    "names starting with . or _ are skipped); point at the shard directory"
                )
            found += [(f, os.path.relpath(f, root)) for f in files]
        elif os.path.lexists(item):  # a file (or link), even when its name holds *, ? or [
            found.append((os.path.abspath(item), os.path.basename(item)))
        elif glob.has_magic(item):
            static = item[: min(item.index(c) for c in "*?[" if c in item)]
            base = os.path.abspath(os.path.dirname(static) if not static.endswith(os.sep) else static)
            files = []
            hidden_too = {"include_hidden": True} if sys.version_info >= (3, 11) else {}  # to list them as skipped
            runs: dict = {}  # directory under the pattern's base -> whether it holds a run's outputs
            named: set = set()  # those listed as skipped
            for f in sorted(glob.glob(item, recursive=True, **hidden_too)):  # one step per match
                rel = os.path.relpath(os.path.abspath(f), base)
                hidden = next((p for p in rel.split(os.sep) if _skipped(p)), None)
                run_dir = _run_output_below(base, os.path.abspath(f), runs)
                if hidden is not None:
                    skipped.append({"path": os.path.abspath(f), "reason": f"matched by {item!r} under a hidden or "
                                    f"private name ({hidden!r} starts with . or _)"})
                elif run_dir is not None:
                    if run_dir not in named:
                        named.add(run_dir)
                        skipped.append({"path": run_dir, "reason": RUN_OUTPUT_REASON})
                elif os.path.isdir(f):  # e.g. Spark's data.parquet/ directory of part files: read as a directory
                    files += _saved_datasets(_walk(os.path.abspath(f), skipped), skipped)
                else:
                    files.append(os.path.abspath(f))
            files = _run_tables(base, files, skipped)
            if not files:
                raise InputError(f"input pattern {item!r} matches no files (names starting with . or _ are skipped)")
            found += [(f, os.path.relpath(f, base)) for f in sorted(set(files))]
        else:
            raise InputError(f"input path {item!r} does not exist; give a file, a directory or a glob pattern")
    if not found:
        raise InputError("no input shards given")
    names: dict[str, str] = {}
    reals: dict[str, str] = {}
    shards = []
    for path, name in found:
        size = input_size(path, path) if is_url(path) else _checked_file(path, path)
        if name in names and names[name] != path:
            raise InputError(
                f"two inputs would be written under the same name {name!r}: {names[name]!r} and {path!r}; "
                "pass their common parent directory instead"
            )
        if name in names:
            continue  # the same file named twice
        real = path if is_url(path) else os.path.realpath(path)  # a key is exact: realpath would fold '//'
        if real in reals:  # one file reached twice (e.g. through a link to its directory): read once
            skipped.append({"path": path, "reason": f"the same file as {reals[real]!r}, which is read"})
            continue
        names[name], reals[real] = path, path
        shards.append(Shard(path, name, _format_of(path, fmt), size=size, identity=shard_identity(path)))
    if warn:
        _warn_skipped(skipped)
    return Shards(shards, skipped)

