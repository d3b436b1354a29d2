"""Compile the scalar math of :mod:`.hash_scalar` for one target.

``compile_twins(jit)`` clones every function listed in
``scalar.DEVICE_FUNCTIONS`` into a fresh globals dict and wraps it with
``jit``; inside the clones, calls to other device functions resolve to their
compiled twins of the same target.  ``numba.njit`` and
``numba.cuda.jit(device=True)`` therefore compile the identical source.
"""

import types

from . import hash_scalar as scalar


def compile_twins(jit, module=scalar, special=None, replace=None):
    """Twins of ``module.DEVICE_FUNCTIONS`` compiled by ``jit``.

    ``special`` maps some names to another decorator (e.g. ``numba.njit(inline="always")`` for the
    per-token functions on the CPU); ``replace`` maps a name to a compiled function used instead of
    the scalar source, for a bit-level primitive a target has an instruction for (tests check the two
    agree on every input class).
    """
    namespace = dict(vars(module))
    compiled = dict(replace or {})
    special = special or {}
    for name in module.DEVICE_FUNCTIONS:
        if name in compiled:
            continue
        fn = getattr(module, name)
        clone = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__, fn.__closure__)
        clone.__qualname__ = fn.__qualname__
        clone.__doc__ = fn.__doc__
        compiled[name] = special.get(name, jit)(clone)
    namespace.update(compiled)
    return types.SimpleNamespace(**compiled)


def kernel_digest(names=None) -> str:
    """SHA-256 (hex) over kernel sources (all of them by default): changes whenever the math may."""
    import glob
    import hashlib
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    files = glob.glob(os.path.join(here, "*.py")) if names is None else [os.path.join(here, n) for n in names]
    for src in sorted(files):
        with open(src, "rb") as f:
            digest.update(os.path.basename(src).encode() + b"\0" + f.read())
    return digest.hexdigest()


def guard_cache(namespace: dict, module_file: str, sources=("hash_scalar.py", "twin.py")) -> None:
    """Drop stale on-disk cache entries of the kernels defined in ``module_file``.

    Numba invalidates a cached function only when its own source file changes,
    but these kernels inline twins compiled from ``hash_scalar.py``: an edit there
    would leave stale machine code in the cache.  A stamp file named after a
    digest of every kernel source sits in the cache directory; when it is
    missing, this module's cache entries are deleted before anything loads
    them, then the stamp is written.  ``sources``: the kernel files the module's
    kernels compile from besides itself.
    """
    import os

    stem = os.path.splitext(os.path.basename(module_file))[0]
    # what the module's kernels compile from besides the module itself (numba tracks that one)
    tag = f"gpu_dedup-{stem}-{kernel_digest(list(sources))[:16]}.stamp"
    bases: dict[str, list[str]] = {}
    for obj in namespace.values():
        cache = getattr(obj, "_cache", None)
        index_path = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        if index_path:
            bases.setdefault(os.path.dirname(index_path), []).append(os.path.basename(index_path)[: -len(".nbi")])
    for path, names in bases.items():
        stamp = os.path.join(path, tag)
        if os.path.exists(stamp):
            continue
        try:
            for entry in os.listdir(path):
                if entry.startswith(f"gpu_dedup-{stem}-") or any(
                    entry == f"{n}.nbi" or (entry.startswith(f"{n}-") and entry.endswith(".nbc")) for n in names
                ):
                    os.unlink(os.path.join(path, entry))
            with open(stamp, "w") as f:
                f.write("kernel sources digest; see gpu_dedup/kernels/twin.py:guard_cache\n")
        except OSError:  # read-only or racing cache directory: numba falls back to compiling
            pass
