"""Real corpora built from installed Debian packages, for evaluation.

Nothing here downloads anything: each loader reads files that Debian packages
install and writes them as one Parquet corpus (``id``, ``text`` and a few
metadata columns).  When the files are missing the error names the apt
package that installs them.

- ``debian-copyright``: one document per ``/usr/share/doc/<package>/copyright``
  file.  Packages built from one source ship the same or a nearly identical
  file, so the corpus is rich in exact and near duplicates.  ``license`` is the
  license short name of the machine-readable (DEP-5) ``Files: *`` paragraph,
  null for free-form files.
- ``debian-licenses``: one document per DEP-5 ``License:`` field that carries
  the license text, from every machine-readable copyright file; ``label`` is
  the canonicalized short name (see ``canonical_license``).  A labelled real
  set: texts sharing a label should be near duplicates of each other.
- ``debian-man``: one document per installed manual page
  (``/usr/share/man/**``, every language), troff requests and escapes
  stripped by vectorized regular expressions; ``.so`` redirects and symbolic
  links are left out.  Packages: ``manpages``, ``manpages-dev`` and the man
  pages of every installed package.

The per-file loop reads files (I/O); text clean-up runs on the whole Arrow
column at once.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_dedup.errors import ConfigError, InputError, OutputError

DOC_ROOT = "/usr/share/doc"
MAN_ROOT = "/usr/share/man"

DATASETS = {
    "debian-copyright": "copyright files of the installed Debian packages (/usr/share/doc/*/copyright)",
    "debian-licenses": "DEP-5 license texts from those copyright files, labelled by license short name",
    "debian-man": "installed manual pages (/usr/share/man), troff stripped",
}


def _read_text(path: str) -> str:
    with open(path, "rb") as f:
        raw = f.read()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", errors="replace")


def _fingerprint(names) -> str:
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- copyright files

_DEP5 = re.compile(r"^Format:\s*\S*copyright-format", re.IGNORECASE)


def _paragraphs(text: str) -> list[str]:
    return [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def _fields(paragraph: str) -> dict[str, str]:
    """DEP-5 / deb822 fields of one paragraph: {name: value with continuation lines}."""
    out: dict[str, str] = {}
    key = None
    for line in paragraph.splitlines():
        if line[:1] in (" ", "\t") and key is not None:
            body = line.strip()
            out[key] += "\n" + ("" if body == "." else body)
        elif ":" in line and not line.startswith("#"):
            key, _, value = line.partition(":")
            key = key.strip().lower()
            out[key] = value.strip()
        else:
            key = None
    return out


def canonical_license(name: str) -> str:
    """Canonical short name: lowercase; spaces, '_' and a trailing 'license' dropped;
    'gplv2+' -> 'gpl-2+', '-2.0' -> '-2', '-or-later' -> '+', 'x11'/'mit' -> 'expat'."""
    s = name.strip().lower().replace("_", " ")
    s = re.sub(r"\s+license$", "", s)
    s = re.sub(r"\s+", " ", s)
    s = re.sub(r"\b(a?gpl|lgpl|gfdl|mpl)v?-?(\d)", r"\1-\2", s)
    s = re.sub(r"(\d)\.0\b", r"\1", s)
    s = s.replace("-or-later", "+").replace("-only", "")
    s = re.sub(r"^(mit|x11)$", "expat", s)
    s = re.sub(r"bsd-(\d)-clause", r"bsd-\1-clause", s)
    return s


def _copyright_files(root: str) -> list[str]:
    paths = sorted((p for p in glob.glob(os.path.join(root, "*", "copyright")) if os.path.isfile(p)),
                   key=lambda p: os.path.basename(os.path.dirname(p)))  # by package name
    if not paths:
        raise InputError(
            f"no copyright files under {root}/*/copyright: this system keeps no package documentation "
            "(check /etc/dpkg/dpkg.cfg.d for path-exclude rules); install packages with "
            "'apt-get install <package>' or point root= at a directory laid out like /usr/share/doc"
        )
    return paths


def debian_copyright(root: str = DOC_ROOT) -> pa.Table:
    """One row per copyright file: id (package), text, license (DEP-5 'Files: *' license or null)."""
    paths = _copyright_files(root)
    texts, licenses = [], []
    for p in paths:  # one file read per package (I/O), then parsed once
        text = _read_text(p)
        texts.append(text)
        lic = None
        if _DEP5.search(text):
            for par in _paragraphs(text):
                f = _fields(par)
                if f.get("files", "").split()[:1] == ["*"] and "license" in f:
                    lic = f["license"].split("\n", 1)[0].strip() or None
                    break
        licenses.append(lic)
    ids = [os.path.basename(os.path.dirname(p)) for p in paths]
    return pa.table({"id": ids, "text": pa.array(texts, pa.large_string()), "license": pa.array(licenses, pa.string())})


def debian_licenses(root: str = DOC_ROOT, min_chars: int = 80) -> pa.Table:
    """One row per DEP-5 ``License:`` field whose text has at least ``min_chars`` characters.

    Columns: id (``package#k``), text (the license text), name (the short name
    as written), label (``canonical_license(name)``).
    """
    ids, texts, names = [], [], []
    for p in _copyright_files(root):
        text = _read_text(p)
        if not _DEP5.search(text):
            continue
        pkg = os.path.basename(os.path.dirname(p))
        k = 0
        for par in _paragraphs(text):
            f = _fields(par)
            if "license" not in f:
                continue
            name, _, body = f["license"].partition("\n")
            if len(body.strip()) < min_chars or not name.strip():
                continue
            ids.append(f"{pkg}#{k}")
            texts.append(body.strip())
            names.append(name.strip())
            k += 1
    if not ids:
        raise InputError(f"no machine-readable (DEP-5) license texts found under {root}/*/copyright")
    labels = [canonical_license(n) for n in names]
    return pa.table({"id": ids, "text": pa.array(texts, pa.large_string()), "name": names, "label": labels})


# ---------------------------------------------------------------- man pages

# requests whose arguments are text: the request name goes, the text stays
_TEXT_MACROS = ("SH", "SS", "TH", "B", "I", "BR", "BI", "IR", "IB", "RB", "RI", "IP", "TP", "SM", "SB", "UR", "MT",
                "Nm", "Nd", "Xr", "Fn", "Ft", "Fa", "Dv", "Er", "Ev", "Ar", "Fl", "Cm", "Pa", "Va", "Sh", "Ss", "It",
                "Op", "Li", "Ql", "Sy", "Em", "Dq", "Sq", "Pq", "Qo", "Qc")

# (pattern, replacement) applied in order to the whole column with Arrow's RE2; double quotes
# (argument grouping in requests) are dropped, like punctuation in the default normalization
_TROFF = [
    (r"(?m)^[.'][ \t]*\\\".*$", ""),  # comment lines
    (r"\\\".*", ""),  # trailing comments
    (r"(?m)^[.'][ \t]*(?:" + "|".join(sorted(_TEXT_MACROS, key=len, reverse=True)) + r")(?: |$)", ""),
    (r"(?m)^[.'][ \t]*[A-Za-z][A-Za-z0-9_]*.*$", ""),  # other requests (.PP, .nf, .br, .in 4, ...)
    (r"\\f(?:\[[^\]]*\]|\(..|.)", ""),  # font changes
    (r"\\s[+-]?\d", ""),  # size changes
    (r"\\\*(?:\[[^\]]*\]|\(..|.)", ""),  # predefined strings
    (r"\\\((?:em|en)", "-"),
    (r"\\\((?:lq|rq|dq)", '"'),
    (r"\\\(..", ""),  # other special characters
    (r"\\\[[^\]]*\]", ""),
    (r"\\[-e]", "-"),
    (r"\\[&|^%:cdu]", ""),
    (r"\\ ", " "),
    (r"\"", ""),
]


def strip_troff(texts: pa.Array) -> pa.Array:
    """Strip troff requests, comments and escapes from a whole string column at once."""
    out = texts
    for pattern, repl in _TROFF:
        out = pc.replace_substring_regex(out, pattern=pattern, replacement=repl)
    return out


def debian_man(root: str = MAN_ROOT) -> pa.Table:
    """One row per manual page: id (path under root), text (troff stripped), lang, section."""
    paths = sorted(p for p in glob.glob(os.path.join(root, "**", "man*", "*"), recursive=True)
                   if os.path.isfile(p) and not os.path.islink(p))
    if not paths:
        raise InputError(
            f"no manual pages under {root}: install some, e.g. 'apt-get install manpages manpages-dev man-db' "
            "(and check /etc/dpkg/dpkg.cfg.d for a path-exclude of /usr/share/man)"
        )
    raw = pa.array([_read_text(p) for p in paths], pa.large_string())  # file reads: I/O
    rel = [os.path.relpath(p, root) for p in paths]
    parts = [r.split(os.sep) for r in rel]
    lang = [x[0] if len(x) > 2 else "C" for x in parts]
    section = [x[-2][3:] for x in parts]
    redirect = np.asarray(pc.match_substring_regex(raw, pattern=r"^\s*\.so\s+\S+\s*$"), dtype=bool)
    keep = pa.array(~redirect)
    table = pa.table({"id": rel, "text": strip_troff(raw), "lang": lang, "section": section})
    return table.filter(keep)


LOADERS = {"debian-copyright": debian_copyright, "debian-licenses": debian_licenses, "debian-man": debian_man}


DATASET_MARK = b"gpu_dedup_dataset"  # Parquet schema metadata key of the files `dataset` writes (what it overwrites)
INFO_KEYS = ("dataset", "source_fingerprint", "documents")  # what marks a --info file `dataset` wrote


def _our_parquet(path: Path) -> bool:
    try:
        return DATASET_MARK in (pq.read_schema(path).metadata or {})
    except Exception:  # not Parquet, unreadable: not ours
        return False


def _our_info(path: Path) -> bool:
    import json

    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and all(k in data for k in INFO_KEYS)


def check_outputs(path, info=None) -> None:
    """Refuse, before the dataset is read (seconds to minutes), an ``-o`` or ``--info`` that would overwrite a file
    ``dataset`` did not write, that is a directory, or two options naming one file (exit 4 / 2).  ``-`` is
    standard output: nothing there to check."""
    if info == path == "-":
        raise ConfigError("-o - and --info - both name standard output; write the description to a file (e.g. "
                          "--info debian-man.json) or the dataset to a file (e.g. -o debian-man.parquet)")
    if info is not None and os.path.abspath(info) == os.path.abspath(path):
        raise ConfigError(f"-o and --info both name {str(path)!r}; give the description another name (e.g. "
                          f"{str(Path(path).with_suffix('.json'))!r})")
    fix = "choose another path or move the file away"
    for flag, where, ours, what in (("-o", path, _our_parquet, "a dataset file"),
                                    ("--info", info, _our_info, "a dataset description")):
        if where is None or where == "-":
            continue
        where = Path(where)
        if where.is_dir():
            raise OutputError(f"{flag} {str(where)!r} is a directory; give the file's name (e.g. "
                              f"{str(where / ('debian-man.parquet' if flag == '-o' else 'debian-man.json'))!r})")
        if os.path.lexists(where) and not ours(where):
            raise OutputError(f"{flag} {str(where)!r} exists and is not {what} gpu-dedup wrote; it is not "
                              f"overwritten: {fix}")
        parent = where.absolute().parent
        while not parent.exists() and parent != parent.parent:  # the directory it will be made in
            parent = parent.parent
        if not os.access(parent, os.W_OK):  # a read-only file system, or no permission: said before the reading
            raise OutputError(f"cannot write {flag} {str(where)!r}: {str(parent)!r} is not writable (read-only or "
                              "without permission); choose a path in a writable directory")


def build(name: str, path, **kwargs) -> dict:
    """Build dataset ``name`` as a Parquet file at ``path``; returns a description of it."""
    import tempfile

    if name not in LOADERS:
        raise InputError(f"unknown dataset {name!r}; choose one of {', '.join(LOADERS)}")
    check_outputs(path)
    table = LOADERS[name](**kwargs)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), DATASET_MARK: name.encode()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: an interrupted build leaves nothing; a name of its own, never another tool's .tmp file
    # (not storage.atomic: the command line reads DATASETS before the storage layer, and Numba, may load)
    fd, name_tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name_tmp)
    try:
        pq.write_table(table, tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    ids = table.column("id").to_pylist()
    return {
        "dataset": name,
        "description": DATASETS[name],
        "path": str(path),
        "documents": table.num_rows,
        "text_mb": round(pc.sum(pc.binary_length(table.column("text"))).as_py() / 2**20, 2) if table.num_rows else 0.0,
        "source_fingerprint": _fingerprint(ids),
        "installed_packages": _installed_packages(),
    }


def _umask() -> int:
    """The process's umask, read without changing it (mkstemp makes files 0600; the dataset is 0666 & ~umask)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _installed_packages() -> int | None:
    status = "/var/lib/dpkg/status"
    try:
        with open(status, encoding="utf-8", errors="replace") as f:
            return sum(1 for line in f if line.startswith("Status: install ok installed"))
    except OSError:
        return None
