"""Slow, independent pure-Python oracle of the gpu_dedup hashing specification.

This module re-implements the specification written in the docstrings of
``kernels/scalar.py`` and ``gpu_dedup/hashing.py`` with plain Python ints and
``str`` only.  It deliberately imports nothing from ``gpu_dedup`` (nor NumPy):
it is the yardstick the kernels are measured against, so it must not share
their code or their bugs.  Speed is irrelevant; clarity is the point.

Summary of the specification as implemented here:

* Parameters: splitmix64(seed) yields, in order, shingle_base, word_base,
  band_base, exact_base1, exact_base2 (each ``2 + z % (P61 - 3)``), then for
  each permutation ``i`` the pair ``a_i = 1 + z % (P - 1)``, ``b_i = z % P``,
  ``P = P61`` (hash_bits 64) or ``P31`` (hash_bits 32).
* Text is UTF-8, decoded with ``errors="replace"``.
* Tokens: char mode ``ord(c) + 1``; word mode (words = ``str.split()``) the
  Horner polynomial of ``ord(c) + 1`` in base ``word_base`` mod P61 from 0.
* Shingles: windows of ``n`` consecutive tokens; ``0 < T < n`` gives one
  shingle of all ``T`` tokens, ``T == 0`` none.  Value = ``finalize61`` of the
  Horner polynomial of the window's tokens in base ``shingle_base`` mod P61.
* Signature: 64-bit ``min (a*x + b) % P61``; 32-bit ``x31 = x % P31`` then
  ``min (a*x31 + b) % P31``; sentinel ``P`` when there are no shingles.
* Band hash: Horner from ``band + 1`` over the band's rows in base
  ``band_base`` mod P61, then ``finalize61``.
* Exact key: ``(len, finalize61(H1), finalize61(H2))`` with ``H`` the Horner
  polynomials over the little-endian 4-byte words (+1, last word zero-padded)
  in bases exact_base1 / exact_base2 mod P61.
"""

from __future__ import annotations

from collections import deque

P61 = (1 << 61) - 1
P31 = (1 << 31) - 1
MASK64 = (1 << 64) - 1

FIN_C1 = 0x1243F6A8885A308D
FIN_C2 = 0x0B7E151628AED2A6


# ---------------------------------------------------------------- parameters


def _splitmix64(seed: int):
    state = seed % (1 << 64)
    while True:
        state = (state + 0x9E3779B97F4A7C15) % (1 << 64)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
        yield z ^ (z >> 31)


def params(seed: int, num_perm: int, hash_bits: int = 64) -> dict:
    """All hash constants derived from ``seed`` (plain ints / lists of ints)."""
    if hash_bits not in (32, 64):
        raise ValueError("hash_bits must be 32 or 64")
    rng = _splitmix64(seed)
    names = ("shingle_base", "word_base", "band_base", "exact_base1", "exact_base2")
    out = {name: 2 + next(rng) % (P61 - 3) for name in names}
    prime = P61 if hash_bits == 64 else P31
    a, b = [], []
    for _ in range(num_perm):
        a.append(1 + next(rng) % (prime - 1))
        b.append(next(rng) % prime)
    out["a"] = a
    out["b"] = b
    out["hash_bits"] = hash_bits
    out["num_perm"] = num_perm
    return out


# ---------------------------------------------------------------- scalar math


def finalize61(h: int) -> int:
    """The non-linear mixer of the spec, on Python ints (exact products)."""
    h = h ^ (h >> 31)
    h = (h * FIN_C1) % P61
    h = h ^ (h >> 29)
    h = (h * FIN_C2) % P61
    h = h ^ (h >> 32)
    if h >= P61:
        h -= P61
    return h


def horner(values, base: int, start: int = 0, mod: int = P61) -> int:
    h = start
    for v in values:
        h = (h * base + v) % mod
    return h


# ---------------------------------------------------------------- text


def decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _as_text(text) -> str:
    return decode(bytes(text)) if isinstance(text, (bytes, bytearray, memoryview)) else text


def word_hash(word: str, word_base: int) -> int:
    return horner((ord(c) + 1 for c in word), word_base)


def tokens(text, kind: str, word_base: int = 0) -> list[int]:
    text = _as_text(text)
    if kind == "char":
        return [ord(c) + 1 for c in text]
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
    """Finalized 61-bit shingle values in document order (with repeats).

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
            v = memo[w] = finalize61(horner(w, base))
        out.append(v)
    return out


def signature(text, kind: str, n: int, prm: dict, num_perm: int | None = None, hash_bits: int | None = None) -> list[int]:
    hash_bits = prm.get("hash_bits", 64) if hash_bits is None else hash_bits
    num_perm = len(prm["a"]) if num_perm is None else num_perm
    xs = set(shingle_values(text, kind, n, prm))
    prime = P61 if hash_bits == 64 else P31
    if hash_bits == 32:
        xs = {x % P31 for x in xs}
    sig = []
    for a, b in zip(prm["a"][:num_perm], prm["b"][:num_perm]):
        sig.append(min(((a * x + b) % prime for x in xs), default=prime))
    return sig


def band_hash(sig, band: int, rows: int, band_base: int) -> int:
    row_values = [int(v) for v in sig[band * rows : band * rows + rows]]
    assert len(row_values) == rows, "band out of range"
    return finalize61(horner(row_values, band_base, start=band + 1))


def band_hashes(sig, bands: int, rows: int, band_base: int) -> list[int]:
    return [band_hash(sig, k, rows, band_base) for k in range(bands)]


def exact_key(data: bytes, prm: dict) -> tuple[int, int, int]:
    data = bytes(data)
    words = [int.from_bytes(data[i : i + 4], "little") + 1 for i in range(0, len(data), 4)]
    return (
        len(data),
        finalize61(horner(words, prm["exact_base1"])),
        finalize61(horner(words, prm["exact_base2"])),
    )


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
