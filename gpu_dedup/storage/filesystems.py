"""Where shards and outputs live: a local path, or the URL of an object store (``s3://``, ``gs://``,
``az://``, any fsspec file system).

Local paths never pass through here: they keep their own code (memory maps, temporary file +
rename, ``flock``).  A URL names an object or a prefix of an fsspec file system; this module gives
the few operations the rest of gpu_dedup needs on one:

- :func:`is_url` tells them apart (``file://`` URLs are local paths);
- :class:`RemotePath` is a small pathlib look-alike for a URL (``/``, ``name``, ``parent``,
  ``exists``, ``stat``, ``read_bytes``, ``write_bytes``, ``unlink``, ``glob``), so call sites that
  join and test paths serve both;
- :func:`source` opens a URL for pyarrow's readers, :func:`read_buffer` reads a whole object
  (decompressed), :func:`put_bytes` writes one, :func:`digest` gives its size and SHA-256,
  :func:`remove_tree` deletes a prefix, :func:`remote_inputs` expands an input URL (an object, a
  prefix or a glob) into shard URLs.

**Writes.**  An object store publishes an object only when its upload completes (a single PUT,
or the completion of a multipart upload): :func:`put_bytes` is atomic there, as a temporary file
renamed into place is on a local disk.  A failing upload is aborted (its parts deleted) and raises
one clear error; a process killed during an upload leaves no object, only an incomplete multipart
upload, which the next run on the output directory aborts (:func:`abort_uploads`).  The SHA-256
of what was uploaded is stored with the object (S3 user metadata ``sha256``) so that verifying an
output does not download it again; on stores without it the object is read back and hashed.

Parts of a multipart upload are 64 MiB (``GPU_DEDUP_PART_BYTES`` sets another size, at least 5 MiB).

**Credentials and endpoints** come from the store's own configuration: for S3 the AWS chain
(``AWS_ACCESS_KEY_ID`` / ``AWS_PROFILE`` / instance roles; ``AWS_ENDPOINT_URL`` for MinIO and
other S3-compatible stores), for GCS the Google chain; any fsspec option can be set as an
environment variable ``FSSPEC_<PROTOCOL>_<OPTION>`` (e.g. ``FSSPEC_S3_ANON=true``).
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import hashlib
import os
import posixpath
import re
import signal
import sys
from dataclasses import dataclass

import pyarrow as pa

from gpu_dedup.errors import ConfigError, InputError, OutputError, ResourceError

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")
PART_BYTES = 64 << 20  # multipart upload part size (S3 needs at least 5 MiB but the last); GPU_DEDUP_PART_BYTES
MIN_PART_BYTES = 5 << 20
_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
             "abfss": "adlfs", "hf": "huggingface_hub"}
_EXTRAS = {"s3fs": "s3", "huggingface_hub": "hf"}  # gpu_dedup's extra that installs the package
READ_ONLY = ("http", "https", "hf")  # fsspec stores that cannot hold outputs (the Hub takes commits, not uploads)


def is_url(path) -> bool:
    """Whether ``path`` is a URL of an fsspec file system (``s3://bucket/key``); ``file://`` is local."""
    if isinstance(path, RemotePath):
        return True
    if not isinstance(path, str):
        return False
    m = _SCHEME.match(path)
    return m is not None and m.group(1).lower() != "file"


def local_path(path):
    """A ``file://`` URL as the local path it names; anything else as it is."""
    if isinstance(path, str) and path.lower().startswith("file://"):
        return path[len("file://"):]
    return path


def as_path(path):
    """A :class:`RemotePath` for a URL, a :class:`pathlib.Path` for anything else."""
    from pathlib import Path

    if isinstance(path, RemotePath):
        return path
    path = local_path(os.fspath(path) if not isinstance(path, str) else path)
    return RemotePath(path) if is_url(path) else Path(path)


def protocol(url: str) -> str:
    return _SCHEME.match(str(url)).group(1).lower()


def _install_hint(proto: str) -> str:
    package = _PACKAGES.get(proto)
    extra = f" (or gpu_dedup's {_EXTRAS[package]} extra: pip install 'gpu_dedup[{_EXTRAS[package]}]')" \
        if package in _EXTRAS else ""
    return f"pip install {package}{extra}" if package else f"install the fsspec implementation of {proto}://"


_FS: dict = {}


def filesystem(url: str):
    """(fsspec file system, path inside it) of ``url``; a missing package is one ConfigError."""
    proto = protocol(url)
    try:
        import fsspec
    except ImportError:
        raise ConfigError(f"{url!r} is a URL of an object store, which gpu_dedup reads and writes through fsspec; "
                          f"it is not installed: {_install_hint(proto)}") from None
    fs = _FS.get(proto)
    if fs is None:
        try:
            cls = fsspec.get_filesystem_class(proto)
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot use {url!r}: {exc}; {_install_hint(proto)}") from None
        try:  # listings are never cached: other processes (a rerun, Dask workers) write the same prefixes
            fs = cls(use_listings_cache=False)
        except TypeError:
            fs = cls()
        _FS[proto] = fs
    return fs, fs._strip_protocol(url)


def _join(url: str, name: str) -> str:
    return url + "/" + name


@dataclass(frozen=True)
class RemoteStat:
    st_size: int
    st_mtime_ns: int
    token: str  # what changes when the object is rewritten: its ETag (S3), generation (GCS), or mtime


class RemotePath:
    """A URL with the pathlib methods gpu_dedup uses on output and checkpoint paths (see the module doc).
    An object store has no directories: a "directory" is the prefix of the objects under it.

    **Keys are exact.**  An object store's key may hold ``//`` (``crawl//part-0.parquet``) or start with
    ``/``; such a key is another object than the one without, so a URL is never normalized: only one
    trailing ``/`` is dropped (``s3://b/out/`` is the prefix ``out``, as a local ``out/`` is the
    directory ``out``).  A URL that still ends in ``/`` after that (``s3://b/out//``: the prefix whose
    last component is empty) is refused (ConfigError): ``str()`` could not give it back, and it is
    almost always a typo for ``s3://b/out/``.  ``parent`` skips empty components (the parent of
    ``crawl//x`` is ``crawl``), as a local path's does; ``/`` and :meth:`relative_to` are exact."""

    __slots__ = ("url",)
    url: str  # the URL, exactly as given less one trailing slash (set once, in __init__)

    def __init__(self, url: str):
        url = url.url if isinstance(url, RemotePath) else str(url)
        proto = protocol(url)
        rest = url[len(proto) + 3:]
        if rest.endswith("/"):
            rest = rest[:-1]
        if rest.endswith("/"):
            fixed = f"{proto}://{rest.rstrip('/')}/"
            raise ConfigError(f"{url!r} ends in '//': it would name the prefix {rest!r} whose last path component "
                              f"is empty (object keys are used exactly as given, '//' included), which gpu_dedup "
                              f"cannot use as a directory; write it with one trailing slash ({fixed!r}) or name a "
                              "prefix below it")
        object.__setattr__(self, "url", f"{proto}://{rest}")

    def __setattr__(self, *_):  # immutable, as pathlib paths are
        raise AttributeError("RemotePath is immutable")

    # ---- names
    def __truediv__(self, name) -> "RemotePath":
        return RemotePath(_join(self.url, str(name)))

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"RemotePath({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    @property
    def name(self) -> str:
        return posixpath.basename(self.url.split("://", 1)[1])

    @property
    def stem(self) -> str:
        return posixpath.splitext(self.name)[0]

    @property
    def parent(self) -> "RemotePath":
        proto, rest = self.url.split("://", 1)
        head = rest.rsplit("/", 1)[0].rstrip("/") if "/" in rest else ""  # empty components skipped
        return RemotePath(f"{proto}://{head or rest}")

    @property
    def parents(self) -> list:
        out, p = [], self
        while p.parent != p:
            p = p.parent
            out.append(p)
        return out

    @property
    def fs(self):
        return filesystem(self.url)[0]

    @property
    def key(self) -> str:
        """The path inside the file system (``bucket/key`` for S3)."""
        return filesystem(self.url)[1]

    def resolve(self) -> "RemotePath":
        return self

    def relative_to(self, other: "RemotePath") -> str:
        prefix = other.url + "/"
        if not self.url.startswith(prefix):
            raise ValueError(f"{self.url!r} is not under {other.url!r}")
        return self.url[len(prefix):]

    # ---- queries
    def _info(self):
        try:
            return self.fs.info(self.key)
        except FileNotFoundError:
            return None

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        info = self._info()
        return info is not None and info.get("type") == "file"

    def is_dir(self) -> bool:
        """Whether objects lie under this prefix (an object store's directory)."""
        return any(list_level(self.url + "/"))  # one level listed, not the subtree

    def is_symlink(self) -> bool:
        return False

    def stat(self) -> RemoteStat:
        info = self._info()
        if info is None or info.get("type") != "file":
            raise FileNotFoundError(2, "no such object", self.url)
        return _stat(info)

    def glob(self, pattern: str) -> list:
        """Objects and prefixes directly under this prefix (keys exactly: ``crawl//x`` is under the prefix
        ``crawl/``'s empty-named one, not under ``crawl``) whose names match ``pattern`` (no ``**``)."""
        root = self.key + "/"
        files, dirs = list_level(self.url + "/")  # one level listed, not the subtree
        names = sorted({k[len(root):] for k in (*files, *dirs)})
        return [self / n for n in names if n and fnmatch.fnmatchcase(n, pattern)]

    def iterdir(self) -> list:
        return self.glob("*")

    # ---- reading and writing
    def read_bytes(self) -> bytes:
        return self.fs.cat_file(self.key)

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    def write_bytes(self, data: bytes) -> None:
        put_bytes(self, data)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.rm_file(self.key)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        """Nothing to make: an object store's prefixes exist while objects lie under them."""

    def rmdir(self) -> None:
        """Nothing to remove (see :meth:`mkdir`)."""


def _stat(info: dict) -> RemoteStat:
    token = (info.get("ETag") or info.get("etag") or info.get("generation") or info.get("md5Hash")
             or info.get("blob_id") or "")  # blob_id: the Hub's git blob of the file
    mtime = info.get("LastModified") or info.get("mtime") or info.get("updated") or info.get("last_modified")
    ns = 0
    if hasattr(mtime, "timestamp"):
        ns = int(mtime.timestamp() * 1e9)
    elif isinstance(mtime, (int, float)):
        ns = int(mtime * 1e9)
    return RemoteStat(int(info.get("size") or 0), ns, str(token or ns))


def info(url) -> RemoteStat:
    """Size, modification time and rewrite token of the object ``url``."""
    return RemotePath(str(url)).stat()


# --------------------------------------------------------------------------- errors


def remote_error(url, exc: BaseException, reading: bool) -> Exception:
    """One clear error (InputError reading, OutputError writing) for an object store's failure on ``url``."""
    text = str(exc).strip() or type(exc).__name__
    low = text.lower()
    err = InputError if reading else OutputError
    what = "read" if reading else "write"
    if isinstance(exc, (ConfigError, InputError, OutputError, ResourceError)):
        return exc
    if "bucket does not exist" in low or "nosuchbucket" in low:
        return err(f"cannot {what} {str(url)!r}: its bucket does not exist ({text}); check the URL, or create the "
                   "bucket first")
    if isinstance(exc, PermissionError) or "access denied" in low or "forbidden" in low or "403" in low:
        return err(f"cannot {what} {str(url)!r}: access denied ({text}); check the credentials (AWS_PROFILE, "
                   f"AWS_ACCESS_KEY_ID, ...) and that they may {what} this key")
    if "credentials" in low or "nocredentials" in type(exc).__name__.lower():
        return err(f"cannot {what} {str(url)!r}: no credentials for the store ({text}); configure them (e.g. "
                   "AWS_PROFILE or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY; FSSPEC_S3_ANON=true for a public "
                   "bucket)")
    if isinstance(exc, FileNotFoundError):
        return err(f"{str(url)!r} does not exist ({text}); check the URL")
    return err(f"cannot {what} {str(url)!r} ({type(exc).__name__}: {text}); check the URL, the credentials and the "
               "network, then rerun")


def _store_errors():
    """Exception classes a store's client raises besides OSError (botocore's), for mapping."""
    out = [OSError]
    try:
        import botocore.exceptions as be

        out += [be.BotoCoreError, be.ClientError]
    except ImportError:
        pass
    for name in ("httpx", "httpx2"):  # the Hugging Face Hub's HTTP clients: a failed connection is no OSError
        module = sys.modules.get(name)
        if module is not None and isinstance(getattr(module, "HTTPError", None), type):
            out.append(module.HTTPError)
    return tuple(out)


# --------------------------------------------------------------------------- reading


def source(path):
    """What pyarrow's readers take for ``path``: the local path itself, or a seekable file of a URL."""
    if not is_url(path):
        return path
    fs, key = filesystem(str(path))
    try:
        return fs.open(key, "rb")
    except _store_errors() as exc:
        raise remote_error(path, exc, reading=True) from None


_CODECS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}


def read_buffer(url: str) -> pa.Buffer:
    """The (decompressed, by the name's extension) bytes of the object ``url`` as an Arrow buffer."""
    fs, key = filesystem(url)
    try:
        raw = pa.py_buffer(fs.cat_file(key))
    except _store_errors() as exc:
        raise remote_error(url, exc, reading=True) from None
    codec = _CODECS.get(posixpath.splitext(key.lower())[1])
    if codec is None:
        return raw
    with pa.input_stream(pa.BufferReader(raw), compression=codec) as f:
        return f.read_buffer()


def open_stream(path):
    """An Arrow input stream of ``path``'s (decompressed) bytes, read as they are consumed."""
    if not is_url(path):
        return pa.input_stream(path, compression="detect")
    fs, key = filesystem(str(path))
    try:
        return pa.input_stream(fs.open(key, "rb"), compression=_CODECS.get(posixpath.splitext(key.lower())[1]))
    except _store_errors() as exc:
        raise remote_error(path, exc, reading=True) from None


def read_range(url: str, start: int, end: int) -> bytes:
    fs, key = filesystem(url)
    return fs.cat_file(key, start=start, end=end)


def input_size(url: str, shown: str) -> int:
    """Size of the object ``url``; an InputError naming ``shown`` when it is not one."""
    fs, key = filesystem(url)
    try:
        got = fs.info(key)
    except _store_errors() as exc:
        raise remote_error(shown, exc, reading=True) from None
    if got.get("type") != "file":
        raise InputError(f"input {shown!r} is not an object (a prefix?); give an object, a prefix ending in / or a glob")
    return int(got.get("size") or 0)


def _exact_prefix(prefix: str) -> tuple:
    """(file system, protocol, ``bucket/key`` prefix) of a URL, with the trailing slashes fsspec's path stripping
    takes kept: the prefix the listings' keys must start with."""
    fs, stripped = filesystem(prefix)
    return fs, protocol(prefix), stripped + prefix[len(prefix.rstrip("/")):]


def list_objects(prefix: str) -> dict:
    """Every object whose key starts with ``prefix`` exactly (a URL; ``s3://b/crawl/`` lists ``crawl/x`` and
    ``crawl//y``, ``s3://b/crawl//`` only ``crawl//y``): path in the file system (``bucket/key``) -> the store's
    info.  fsspec's listings drop a path's trailing and (S3) leading slashes, so a prefix holding ``//`` would
    list other keys: S3 is listed by its exact prefix, other stores from the prefix less its trailing slashes,
    and every store's answer is kept to the keys that start with ``prefix``."""
    fs, proto, exact = _exact_prefix(prefix)
    try:
        if proto in ("s3", "s3a") and "/" in exact:
            bucket, _, sub = exact.partition("/")
            found = fs.find(bucket, prefix=sub, detail=True) if sub else fs.find(bucket, detail=True)
        else:
            found = fs.find(exact.rstrip("/") or exact, detail=True)
    except FileNotFoundError:
        return {}
    return {k: v for k, v in found.items() if k.startswith(exact) and v.get("type") == "file"}


def list_level(prefix: str) -> tuple[dict, set]:
    """The objects directly under ``prefix`` (a URL ending in ``/``; keys exactly, as :func:`list_objects`) and
    the prefixes one level below it (``bucket/key`` without their trailing ``/``): one listing of that level,
    where :func:`list_objects` lists the whole subtree (a one-level glob over a prefix holding a million
    deeper objects listed them all).  S3: one delimited ListObjectsV2 of the exact prefix; other stores:
    their ``ls``, or the whole subtree cut to one level where the key holds ``//`` (their listings fold it)."""
    fs, proto, exact = _exact_prefix(prefix)
    files: dict = {}
    dirs: set = set()
    try:
        if proto in ("s3", "s3a") and "/" in exact:
            bucket, _, sub = exact.partition("/")
            kwargs = {"Bucket": bucket, "Prefix": sub, "Delimiter": "/"}
            while True:
                page = fs.call_s3("list_objects_v2", **kwargs)
                dirs.update(f"{bucket}/{p['Prefix'][:-1]}" for p in page.get("CommonPrefixes", []))
                for o in page.get("Contents", []):
                    name = f"{bucket}/{o['Key']}"
                    files[name] = {**o, "name": name, "type": "file", "size": o.get("Size", 0)}
                if not page.get("IsTruncated"):
                    break
                kwargs["ContinuationToken"] = page["NextContinuationToken"]
        elif "//" in exact:
            for k, v in list_objects(prefix).items():
                rel = k[len(exact):]
                if "/" in rel:
                    dirs.add(exact + rel.split("/", 1)[0])
                else:
                    files[k] = v
        else:
            for v in fs.ls(exact.rstrip("/") or exact, detail=True):
                name = v["name"].rstrip("/")
                if not name.startswith(exact) or "/" in name[len(exact):]:
                    continue
                if v.get("type") == "file":
                    files[name] = v
                else:
                    dirs.add(name)
    except FileNotFoundError:
        return {}, set()
    return files, dirs


def output_name(rel: str) -> str:
    """The output name of a shard found at key ``rel`` below an input prefix: its path components less the empty
    ones (``//`` in a key), so that it is a relative path in any output directory, local or not (a leading
    ``/`` would make a local output path absolute).  Two keys that give one name are refused by discovery."""
    return "/".join(p for p in rel.split("/") if p)


def _glob_match(parts: list, pats: list) -> bool:
    """Whether key components ``parts`` match pattern components ``pats`` (``**``: any number of components,
    none too; an empty component is a component, as the store has it)."""
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_glob_match(parts[i:], pats[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and _glob_match(parts[1:], pats[1:])


def remote_inputs(item: str, is_shard_name, skipped, skipped_list=None, run_markers=None) -> list[tuple[str, str]]:
    """(URL, relative output name) of the shards an input URL names: the object itself; every shard
    object under a prefix (names starting with ``.`` or ``_`` skipped at any level); or a glob's
    matches (relative to the pattern's static prefix).  ``run_markers`` (manifest name, work directory
    name, reason, a run's own files, their reason): a prefix below the one given that holds a gpu_dedup
    run's outputs is skipped and appended to ``skipped_list`` with the reason, and so are, in the prefix
    given when it is one, the run's own files.

    Keys are used exactly as the store has them (``//`` and a leading ``/`` included, see
    :class:`RemotePath`): ``s3://b/crawl`` and ``s3://b/crawl/`` are the prefix ``crawl/``,
    ``s3://b/crawl//`` the prefix ``crawl//``; a pattern's components match the key's, ``**`` any number
    of them.  Output names are the keys below the prefix less empty components (:func:`output_name`)."""
    fs, key = filesystem(item)
    proto = protocol(item)
    skipped_list = [] if skipped_list is None else skipped_list

    def url(k: str) -> str:
        return f"{proto}://{k.lstrip('/')}"

    def outside_runs(keys: list, base: str, runs: set) -> list:
        """``keys`` less those below a run's output prefix under ``base`` (a directory's key, no trailing
        slash; listed once each) and, when ``base`` is one, less its own tables."""
        if run_markers is None:
            return keys
        reason, own = run_markers[2], run_markers[3]
        kept, named = [], set()
        for k in keys:
            parts = k[len(base) + 1:].split("/")
            under = next((base + "/" + "/".join(parts[:i]) for i in range(1, len(parts))
                          if base + "/" + "/".join(parts[:i]) in runs), None)
            if under is not None:
                if under not in named:
                    named.add(under)
                    skipped_list.append({"path": url(under), "reason": reason})
            elif base in runs and len(parts) == 1 and parts[0] in own:
                skipped_list.append({"path": url(k), "reason": run_markers[4]})
            else:
                kept.append(k)
        return kept

    def runs_in(listing) -> set:
        """The prefixes a listing shows holding a run's manifest or work directory."""
        if run_markers is None:
            return set()
        manifest, work = run_markers[0], run_markers[1]
        found = set()
        for k in listing:
            parts = k.split("/")
            for i, p in enumerate(parts[:-1] if parts else ()):
                if p == work:
                    found.add("/".join(parts[:i]))
            if parts and parts[-1] == manifest:
                found.add("/".join(parts[:-1]))
        return found

    def shown(k: str, base: str) -> bool:
        return not any(skipped(p) for p in k[len(base) + 1:].split("/"))

    try:
        if _glob.has_magic(key):
            static = key[: min(key.index(c) for c in "*?[" if c in key)]
            base = static[: static.rfind("/")]  # the directory the pattern's matches are named from
            pats = key[len(base) + 1:].split("/")
            if any("**" in p and p != "**" for p in pats):  # as fsspec's glob refused it
                raise InputError(f"input pattern {item!r} is not a pattern the store can expand ('**' inside a path "
                                 "component); write '**' as a whole path component, e.g. "
                                 "s3://bucket/crawl/**/*.parquet")
            if len(pats) == 1 and pats[0] != "**":  # one level (crawl/*.parquet): that level is listed, not the
                found, below = list_level(f"{proto}://{base}/")  # subtree (a run's work prefix shows as one)
                runs = runs_in(found) | ({base} if run_markers is not None and f"{base}/{run_markers[1]}" in below
                                         else set())
            else:
                found = list_objects(f"{proto}://{base}/")
                runs = runs_in(found)
            files = sorted(k for k in found if _glob_match(k[len(base) + 1:].split("/"), pats) and shown(k, base))
            files = outside_runs(files, base, runs)
            if not files:
                raise InputError(f"input pattern {item!r} matches no objects (names starting with . or _ are "
                                 "skipped, as are the outputs of gpu_dedup runs)")
            return [(url(k), output_name(k[len(base) + 1:])) for k in files]
        got = _info_or_none(fs, key)
        if got is not None and got.get("type") == "file" and not item.endswith("/"):
            return [(url(key), posixpath.basename(key))]
        root = key + item[len(item.rstrip("/")):][1:]  # s3://b/crawl/ -> b/crawl, s3://b/crawl// -> b/crawl/
        found = list_objects(f"{proto}://{root}/")
        files = sorted(k for k in found if is_shard_name(posixpath.basename(k)) and shown(k, root))
        files = outside_runs(files, root, runs_in(found))
        if not files:
            if not found and got is None:
                _check_bucket(fs, item, key)
                raise InputError(f"input {item!r} does not exist (no object and no objects under it); check the "
                                 "URL")
            raise InputError(f"input prefix {item!r} holds no .parquet, .jsonl[.gz] or .arrow objects (nor .pq, "
                             ".json, .ndjson; names starting with . or _ are skipped); point at the shard prefix")
        return [(url(k), output_name(k[len(root) + 1:])) for k in files]
    except InputError:
        raise
    except _store_errors() as exc:
        raise remote_error(item, exc, reading=True) from None


def input_prefix(item: str) -> str:
    """The exact key prefix (a URL ending in ``/``) of the objects an input URL may read: ``s3://b/crawl`` and
    ``s3://b/crawl/`` -> ``s3://b/crawl/``, ``s3://b/crawl//`` -> ``s3://b/crawl//`` (see :func:`remote_inputs`;
    a glob's static part up to its last ``/``)."""
    if _glob.has_magic(item):
        static = item[: min(item.index(c) for c in "*?[" if c in item)]
        return static[: static.rfind("/") + 1]
    return item if item.endswith("/") else item + "/"


def _info_or_none(fs, key):
    try:
        return fs.info(key)
    except FileNotFoundError:
        return None


def _check_bucket(fs, url, key) -> None:
    """A missing bucket named as such (listing a missing bucket's prefix may just be empty)."""
    bucket = key.split("/", 1)[0]
    try:
        fs.ls(bucket, detail=False)
    except FileNotFoundError as exc:
        raise remote_error(url, exc, reading=True) from None
    except _store_errors():
        pass


# --------------------------------------------------------------------------- writing


def _fault(point: str) -> None:
    """Fault injection for tests (as :func:`gpu_dedup.run.checkpoint.maybe_crash`): GPU_DEDUP_FAULT names it."""
    if os.environ.get("GPU_DEDUP_FAULT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _metadata_kwargs(proto: str, sha: str) -> dict:
    return {"Metadata": {"sha256": sha}} if proto in ("s3", "s3a") else {}


def part_bytes() -> int:
    """Bytes per part of a multipart upload: ``GPU_DEDUP_PART_BYTES`` (at least 5 MiB), else 64 MiB."""
    raw = os.environ.get("GPU_DEDUP_PART_BYTES")
    if not raw:
        return PART_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"GPU_DEDUP_PART_BYTES={raw!r} is not a number of bytes; give e.g. 67108864 (64 MiB)") \
            from None
    if value < MIN_PART_BYTES:
        raise ConfigError(f"GPU_DEDUP_PART_BYTES={value} is below the 5 MiB S3 needs for a part; give at least "
                          f"{MIN_PART_BYTES}")
    return value


def put_bytes(path, data, part_size: int | None = None) -> dict:
    """Upload ``data`` (bytes or an Arrow buffer) as the object ``path``: published whole or not at all
    (see the module doc); larger than a part (:func:`part_bytes`), as a multipart upload.  Returns its
    digest, ``{"size", "sha256"}``."""
    url = str(path)
    part = part_size or part_bytes()
    fs, key = filesystem(url)
    proto = protocol(url)
    view = memoryview(data)
    sha = hashlib.sha256(view).hexdigest()
    kwargs = _metadata_kwargs(proto, sha)
    try:
        if view.nbytes <= part:
            fs.pipe_file(key, bytes(view), **kwargs)
        else:
            f = fs.open(key, "wb", block_size=part, **kwargs)
            try:
                for lo in range(0, view.nbytes, part):
                    f.write(view[lo: lo + part])
                    _fault("upload:part")
                f.close()
            except BaseException:
                _discard(f)
                raise
    except _store_errors() as exc:
        raise _write_failure(url, exc) from None
    return {"size": view.nbytes, "sha256": sha}


def put_exclusive(path, data: bytes) -> bool:
    """Create the object ``path`` only if there is none: True when created, False when one exists.
    Atomic where the store has conditional writes (S3 ``If-None-Match``; GCS); elsewhere written
    only after finding none (a race the caller's read-back check closes)."""
    url = str(path)
    fs, key = filesystem(url)
    try:
        try:
            fs.pipe_file(key, data, mode="create")
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):  # no conditional writes here
            if _info_or_none(fs, key) is not None:
                return False
            fs.pipe_file(key, data)
            return True
    except _store_errors() as exc:
        raise _write_failure(url, exc) from None


def _discard(f) -> None:
    """Abort an unfinished upload (its parts are deleted) and keep the file from completing it later."""
    try:
        f.discard()
    except Exception:  # noqa: BLE001 - the original error is the one to report
        pass
    try:
        f.closed = True  # fsspec would complete the upload when the file object is collected
    except Exception:  # noqa: BLE001
        pass


def _write_failure(url, exc) -> Exception:
    mapped = remote_error(url, exc, reading=False)
    if isinstance(mapped, OutputError) and "access denied" not in str(mapped) and "bucket does not exist" \
            not in str(mapped):
        return OutputError(f"upload of {url!r} failed ({type(exc).__name__}: {str(exc).strip()}); it was aborted "
                           "and nothing was published for this run: check the network and the store, then rerun")
    return mapped


def digest(path) -> dict:
    """Size and SHA-256 of the object ``path``: the SHA-256 stored with it at upload when the store
    keeps it, else computed by reading the object."""
    url = str(path)
    fs, key = filesystem(url)
    try:
        got = fs.info(key)
        if protocol(url) in ("s3", "s3a"):
            meta = fs.metadata(key) or {}
            sha = meta.get("sha256")
            if sha:
                return {"size": int(got["size"]), "sha256": sha}
        h = hashlib.sha256()
        with fs.open(key, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return {"size": int(got["size"]), "sha256": h.hexdigest()}
    except FileNotFoundError:
        raise
    except _store_errors() as exc:
        raise remote_error(url, exc, reading=True) from None


def copy(src, dst) -> None:
    """Copy the object ``src`` to ``dst`` in one store (a server-side copy where the store has one)."""
    fs, skey = filesystem(str(src))
    _, dkey = filesystem(str(dst))
    try:
        fs.cp_file(skey, dkey)  # one object: copy() would expand a name holding [, * or ? as a pattern
    except _store_errors() as exc:
        raise _write_failure(str(dst), exc) from None


def remove_tree(path, missing_ok: bool = True) -> None:
    """Delete a directory tree: a local one (errors raised, a missing one too unless ``missing_ok``), or every
    object under a prefix."""
    if not is_url(path):
        import shutil

        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            if not missing_ok:
                raise
        return
    url = str(RemotePath(str(path)))
    fs, _ = filesystem(url)
    try:
        keys = sorted(list_objects(url + "/"))  # exactly the keys under it: fsspec's rm(recursive) would drop
        if protocol(url) in ("s3", "s3a"):       # a leading / (S3) and so delete another prefix's objects
            for lo in range(0, len(keys), 1000):  # one request per 1000 objects, each key exactly
                bucket = keys[lo].split("/", 1)[0]
                batch = [{"Key": k.split("/", 1)[1]} for k in keys[lo: lo + 1000]]
                got = fs.call_s3("delete_objects", Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
                if got.get("Errors"):
                    e = got["Errors"][0]
                    raise OSError(f"{e.get('Code')}: {e.get('Message')} ({e.get('Key')})")
        else:
            for k in keys:
                fs.rm_file(k)
    except FileNotFoundError:
        pass
    except _store_errors() as exc:
        raise remote_error(str(path), exc, reading=False) from None


def abort_uploads(prefix) -> int:
    """Abort the incomplete multipart uploads under ``prefix`` (S3): what a process killed during an
    upload leaves; returns how many.  Other stores: nothing to do."""
    url = str(prefix)
    if protocol(url) not in ("s3", "s3a"):
        return 0
    fs, key = filesystem(url)
    bucket, _, sub = key.partition("/")
    try:
        listed = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=sub.rstrip("/") + "/")
        uploads = listed.get("Uploads") or []
        for u in uploads:
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
        return len(uploads)
    except _store_errors():  # not permitted to list them: they expire by the bucket's lifecycle rules
        return 0


def table_bytes(write) -> pa.Buffer:
    """The bytes ``write(sink)`` writes to an in-memory Arrow sink (a Parquet file to upload)."""
    sink = pa.BufferOutputStream()
    write(sink)
    return sink.getvalue()


__all__ = ["list_objects", "list_level", "output_name", "input_prefix", "is_url", "as_path", "local_path", "RemotePath", "RemoteStat", "filesystem", "source", "read_buffer",
           "put_bytes", "put_exclusive", "digest", "copy", "remove_tree", "abort_uploads", "remote_inputs",
           "input_size", "remote_error", "info", "read_range", "table_bytes", "open_stream"]
