"""Slow, independent pure-Python oracle of the gpu_dedup hashing specification.

This module re-implements hash family v2, specified in the docstrings of
``kernels/hash_scalar.py`` and ``kernels/params.py``, with plain Python ints and
``str`` only.  It deliberately imports nothing from ``gpu_dedup`` (nor NumPy):
it is the yardstick the kernels are measured against, so it must not share
their code or their bugs.  Speed is irrelevant; clarity is the point.

Summary of the specification as implemented here (all arithmetic mod 2**64
unless said otherwise):

* Parameters: splitmix64(seed) yields, in order, shingle_base, word_base,
  band_base (each ``(z & ~7) | 5``), exact_seed1, exact_seed2 (``z``), then
  one ``z`` per permutation: ``a_i = (z & 0xFFFFFFFF) | 1``, ``b_i = z >> 32``.
* ``mix64``: the splitmix64 finalizer.
* Text is UTF-8, decoded with ``errors="replace"``.
* Tokens: char mode ``mix64(ord(c) + 1)``; word mode (words = ``str.split()``)
  ``mix64(L + sum_j c_j * word_base**(j+1))`` over the little-endian 8-byte
  chunks ``c_j`` of the word's UTF-8 bytes (last chunk zero-padded), ``L``
  their count.
* Shingles: windows of ``n`` consecutive tokens; ``0 < T < n`` gives one
  shingle of all ``T`` tokens, ``T == 0`` none.  Value ``H`` = the Horner
  polynomial of the window's tokens in base ``shingle_base``.
* Signature: ``min (a_i * (H >> 32) + b_i) mod 2**32`` over the distinct
  values; ``2**32 - 1`` when there are none.
* Band hash: ``mix64`` of the Horner polynomial from ``band + 1`` over the
  band's 32-bit values in base ``band_base``.
* Exact key: ``(len, h1, h2)``, ``h = mix64(h ^ w)`` from ``h = exact_seed``
  over the little-endian 8-byte words ``w`` (last one zero-padded).
"""

from __future__ import annotations

from collections import deque

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
SENTINEL = M32


# ---------------------------------------------------------------- parameters


def _splitmix64(seed: int):
    state = seed % (1 << 64)
    while True:
        state = (state + 0x9E3779B97F4A7C15) % (1 << 64)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
        yield z ^ (z >> 31)


def params(seed: int, num_perm: int) -> dict:
    """All hash constants derived from ``seed`` (plain ints / lists of ints)."""
    rng = _splitmix64(seed)
    out = {}
    for name in ("shingle_base", "word_base", "band_base"):
        z = next(rng)
        out[name] = z - z % 8 + 5
    out["exact_seed1"] = next(rng)
    out["exact_seed2"] = next(rng)
    a, b = [], []
    for _ in range(num_perm):
        z = next(rng)
        a.append(z % (1 << 32) | 1)
        b.append(z // (1 << 32))
    out["a"] = a
    out["b"] = b
    out["num_perm"] = num_perm
    return out


# ---------------------------------------------------------------- scalar math


def mix64(z: int) -> int:
    """The splitmix64 finalizer on Python ints."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return z ^ (z >> 31)


def horner(values, base: int, start: int = 0) -> int:
    h = start
    for v in values:
        h = (h * base + v) % (1 << 64)
    return h


# ---------------------------------------------------------------- text


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _as_text(text) -> str:
    return decode(bytes(text)) if isinstance(text, (bytes, bytearray, memoryview)) else text


def word_hash(word: str, word_base: int) -> int:
    """Token of one word: its UTF-8 bytes in 8-byte little-endian chunks, weighted by powers of word_base."""
    data = word.encode("utf-8")
    w = len(data)
    for j in range(0, len(data), 8):
        chunk = int.from_bytes(data[j : j + 8], "little")
        w += chunk * pow(word_base, j // 8 + 1, 1 << 64)
    return mix64(w % (1 << 64))


def tokens(text, kind: str, word_base: int = 0) -> list[int]:
    text = _as_text(text)
    if kind == "char":
        return [mix64(ord(c) + 1) for c in text]
    if kind == "word":
        return [word_hash(w, word_base) for w in text.split()]
    raise ValueError(f"unknown shingle kind {kind!r}")


def _units(text: str, kind: str) -> list[str]:
    if kind == "char":
        return list(text)
    if kind == "word":
        return text.split()
    raise ValueError(f"unknown shingle kind {kind!r}")


def _windows(items: list, n: int) -> list[tuple]:
    """Token windows by the spec's rule (short documents: one window of all)."""
    t = len(items)
    if t == 0:
        return []
    if t < n:
        return [tuple(items)]
    return [tuple(items[i : i + n]) for i in range(t - n + 1)]


def shingle_strings(text, kind: str, n: int) -> set[str]:
    """Shingles as strings, independent of any hashing (for exact Jaccard)."""
    text = _as_text(text)
    sep = "" if kind == "char" else " "
    return {sep.join(w) for w in _windows(_units(text, kind), n)}


def shingle_values(text, kind: str, n: int, prm: dict) -> list[int]:
    """64-bit shingle values in document order (with repeats).

    Each window is evaluated directly by Horner (not rolling); identical
    windows are memoized, which changes nothing but the running time.
    """
    toks = tokens(text, kind, prm["word_base"])
    base = prm["shingle_base"]
    memo: dict[tuple, int] = {}
    out = []
    for w in _windows(toks, n):
        v = memo.get(w)
        if v is None:
            v = memo[w] = horner(w, base)
        out.append(v)
    return out


def permute(x: int, a: int, b: int) -> int:
    return (a * x + b) % (1 << 32)


def signature(text, kind: str, n: int, prm: dict, num_perm: int | None = None) -> list[int]:
    num_perm = len(prm["a"]) if num_perm is None else num_perm
    keys = {h >> 32 for h in shingle_values(text, kind, n, prm)}
    return [min((permute(x, a, b) for x in keys), default=SENTINEL)
            for a, b in zip(prm["a"][:num_perm], prm["b"][:num_perm])]


def band_hash(sig, band: int, rows: int, band_base: int) -> int:
    row_values = [int(v) for v in sig[band * rows : band * rows + rows]]
    assert len(row_values) == rows, "band out of range"
    return mix64(horner(row_values, band_base, start=band + 1))


def band_hashes(sig, bands: int, rows: int, band_base: int) -> list[int]:
    return [band_hash(sig, k, rows, band_base) for k in range(bands)]


def exact_key(data: bytes, prm: dict) -> tuple[int, int, int]:
    data = bytes(data)
    h1, h2 = prm["exact_seed1"], prm["exact_seed2"]
    for i in range(0, len(data), 8):
        w = int.from_bytes(data[i : i + 8], "little")
        h1 = mix64(h1 ^ w)
        h2 = mix64(h2 ^ w)
    return len(data), h1, h2


def exact_representatives(keys, ranks, eligible=None) -> list[int]:
    """Each document's representative: the eligible document of the same key with the lowest (rank, index);
    an ineligible document represents itself."""
    n = len(keys)
    ok = [True] * n if eligible is None else [bool(e) for e in eligible]
    best: dict = {}
    for i in range(n):
        key = tuple(int(x) for x in keys[i])
        if ok[i] and (key not in best or (ranks[i], i) < (ranks[best[key]], best[key])):
            best[key] = i
    return [best[tuple(int(x) for x in keys[i])] if ok[i] else i for i in range(n)]


def jaccard(text_a, text_b, kind: str, n: int) -> float:
    x = shingle_strings(text_a, kind, n)
    y = shingle_strings(text_b, kind, n)
    union = len(x | y)
    return len(x & y) / union if union else 0.0


# ---------------------------------------------------------------- graphs


def connected_components(n: int, edges) -> list[int]:
    """Label of each node = smallest node index of its component (BFS)."""
    adj = [[] for _ in range(n)]
    for u, v in edges:
        u, v = int(u), int(v)
        adj[u].append(v)
        adj[v].append(u)
    labels = [-1] * n
    for s in range(n):  # ascending: the first unlabeled node is its component's minimum
        if labels[s] >= 0:
            continue
        labels[s] = s
        queue = deque([s])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if labels[v] < 0:
                    labels[v] = s
                    queue.append(v)
    return labels
