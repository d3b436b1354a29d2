"""Input identity: a cheap digest that changes whenever a shard is rewritten.

:func:`shard_identity` digests a file's size, modification time and content that
changes with any rewrite (a Parquet file's footer; the first and last 64 KiB of
any other file).  It is taken when the shard is discovered and checked again
before anything is published: a file replaced during a run fails the run instead
of ending in outputs that belong to neither version.  An object in a store (a URL)
is identified by its size and the token the store changes on every rewrite (the
ETag on S3, the generation on GCS), else by its modification time and the same bytes.
"""

from __future__ import annotations

import hashlib
import os

from gpu_dedup.errors import InputError
from gpu_dedup.storage.filesystems import RemotePath, is_url, read_range, remote_error

PARQUET_EXT = (".parquet", ".pq")

IDENTITY_BLOCK = 1 << 16  # bytes hashed at each end of a non-Parquet file
FOOTER_MAX = 1 << 22  # a Parquet footer larger than this is hashed by its last FOOTER_MAX bytes


def shard_identity(path: str) -> str:
    """Cheap digest of a file's identity: size, mtime and the bytes a rewrite changes (see module doc)."""
    if is_url(path):
        return _object_identity(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            h = hashlib.sha256(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
            size = st.st_size
            footer = 0
            if size >= 12 and path.lower().endswith(PARQUET_EXT):
                f.seek(size - 8)
                tail = f.read(8)
                if tail[4:] == b"PAR1":
                    footer = min(int.from_bytes(tail[:4], "little") + 8, size, FOOTER_MAX)
            if footer:
                f.seek(size - footer)
                h.update(f.read(footer))
            else:
                h.update(f.read(IDENTITY_BLOCK))
                if size > IDENTITY_BLOCK:
                    f.seek(max(IDENTITY_BLOCK, size - IDENTITY_BLOCK))
                    h.update(f.read(IDENTITY_BLOCK))
    except OSError as exc:
        raise InputError(f"cannot read input {path!r} ({exc.strerror}); check that it exists and is readable") \
            from None
    return h.hexdigest()[:32]


def _object_identity(url: str) -> str:
    """Size and rewrite token of an object; without a content-derived token, also the bytes at its ends."""
    try:
        st = RemotePath(url).stat()
        h = hashlib.sha256(f"{st.st_size}\0{st.st_mtime_ns}\0{st.token}\0".encode())
        if st.token == str(st.st_mtime_ns):  # no ETag / generation: the bytes a rewrite changes, as for a file
            h.update(read_range(url, 0, min(st.st_size, IDENTITY_BLOCK)))
            if st.st_size > IDENTITY_BLOCK:
                h.update(read_range(url, max(IDENTITY_BLOCK, st.st_size - IDENTITY_BLOCK), st.st_size))
    except Exception as exc:  # noqa: BLE001 - the store's errors become one InputError
        raise remote_error(url, exc, reading=True) from None
    return h.hexdigest()[:32]


def check_unchanged(shards) -> None:
    """Raise InputError when an input file changed since it was discovered (identity differs)."""
    for s in shards:
        if s.identity and s.format != "memory" and shard_identity(s.path) != s.identity:
            raise InputError(
                f"input shard {s.path!r} changed during the run (its size, modification time or content differ "
                "from when it was read); nothing was published for this run: rerun once the inputs are stable")
