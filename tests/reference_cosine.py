"""Slow pure-Python oracle of cosine dedup (random projections, SimHash), written from the
specification in ``kernels/cosine_scalar.py`` and ``gpu_dedup/stages/{projections,vectors}.py``.

Python ints (exact, unbounded) and floats only: no NumPy, no Numba.  Tests
compare every stage function against it on small inputs.
"""

from __future__ import annotations

import math
from collections import Counter
from statistics import NormalDist

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
NGRAM_MUL = 0x9FB21C651E98DF25
IDF_SCALE = 256


def fmix64(z: int) -> int:
    z &= M64
    z ^= z >> 33
    z = (z * 0xFF51AFD7ED558CCD) & M64
    z ^= z >> 33
    z = (z * 0xC4CEB9FE1A85EC53) & M64
    z ^= z >> 33
    return z


def seed_key(seed: int) -> int:
    return fmix64(seed + GOLDEN)


def gauss8() -> list[int]:
    nd = NormalDist()
    return [2 * math.floor(16.0 * nd.inv_cdf((b + 0.5) / 256.0)) + 1 for b in range(256)]


GAUSS8 = gauss8()


def entry(key: int, j: int, seed: int) -> int:
    """Hyperplane ``j``'s entry at coordinate ``key``."""
    z = fmix64(key ^ seed_key(seed))
    h = fmix64(z + (j // 8 + 1) * GOLDEN)
    return GAUSS8[(h >> (8 * (j % 8))) & 255]


def hyperplanes(dim: int, bits: int, seed: int) -> list[list[int]]:
    """R[i][j] for dimension i and hyperplane j."""
    return [[entry(i, j, seed) for j in range(bits)] for i in range(dim)]


def quantize(row) -> tuple[list[int], int]:
    """(integers in [-127, 127], status 0 ok / 1 zero / 2 NaN-inf) of one float32 row (floats)."""
    if any(not math.isfinite(v) for v in row):
        return [0] * len(row), 2
    s = max((abs(v) for v in row), default=0.0)
    if s == 0.0:
        return [0] * len(row), 1
    scale = 127.0 / s
    return [round(v * scale) for v in row], 0  # round(): half to even, as rint


def signature_bits(row, bits: int, seed: int, planes=None) -> tuple[list[int], int]:
    """(bit j = [sum_i R[i][j] q_i >= 0] for j < bits, status); bits all 0 when status != 0."""
    q, status = quantize(row)
    if status:
        return [0] * bits, status
    planes = planes or hyperplanes(len(row), bits, seed)
    return [1 if sum(planes[i][j] * q[i] for i in range(len(q))) >= 0 else 0 for j in range(bits)], 0


def pack(bitlist) -> list[int]:
    """Bit j at bit j % 64 of word j // 64."""
    words = [0] * ((len(bitlist) + 63) // 64)
    for j, b in enumerate(bitlist):
        if b:
            words[j // 64] |= 1 << (j % 64)
    return words


def unpack(words, nbits: int) -> list[int]:
    return [(words[j // 64] >> (j % 64)) & 1 for j in range(nbits)]


def band_value(words, band: int, rows: int) -> int:
    bitlist = unpack(words, len(words) * 64)
    return sum(bitlist[band * rows + i] << i for i in range(rows))


def band_hash(value: int, band: int) -> int:
    return fmix64(value + (band + 1) * GOLDEN)


def band_hashes(words, bands: int, rows: int) -> list[int]:
    return [band_hash(band_value(words, b, rows), b) for b in range(bands)]


def hamming(a_words, b_words) -> int:
    return sum(bin(a ^ b).count("1") for a, b in zip(a_words, b_words))


def hamming_cosine(a_words, b_words, nbits: int) -> float:
    return math.cos(math.pi * hamming(a_words, b_words) / nbits)


def cosine(u, v) -> float:
    """Exact cosine (correctly rounded sums of the exact float products); 0 with a zero vector."""
    dot = math.fsum(a * b for a, b in zip(u, v))
    nu = math.sqrt(math.fsum(a * a for a in u))
    nv = math.sqrt(math.fsum(b * b for b in v))
    return dot / (nu * nv) if nu > 0 and nv > 0 else 0.0


def collision_probability(s: float) -> float:
    return 1.0 - math.acos(max(-1.0, min(1.0, s))) / math.pi


def cosine_s_curve(s: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - collision_probability(s) ** rows) ** bands


def groups(hashes_per_row, valid=None) -> set:
    """Buckets as a set of (band, frozenset(rows)) with >= 2 members."""
    out: dict = {}
    for i, hs in enumerate(hashes_per_row):
        if valid is not None and not valid[i]:
            continue
        for b, h in enumerate(hs):
            out.setdefault((b, h), []).append(i)
    return {(b, frozenset(rows)) for (b, _h), rows in out.items() if len(rows) >= 2}


# ---------------------------------------------------------------- text


def tokens(text: str, shingle: str) -> list[int]:
    if shingle == "char":
        return [ord(c) + 1 for c in text]
    out = []
    for word in text.split():  # str.split(): runs of str.isspace, as the kernel's is_space
        h = FNV_OFFSET
        for c in word:
            h = ((h ^ (ord(c) + 1)) * FNV_PRIME) & M64
        out.append(h)
    return out


def window_hash(window) -> int:
    g = 0
    for t in window:
        g = (g * NGRAM_MUL + t) & M64
    return fmix64(g)


def features(data: bytes, shingle: str, n: int) -> list[int]:
    """Feature hashes (with repeats, in order) of a UTF-8 document."""
    toks = tokens(data.decode("utf-8", errors="replace"), shingle)
    if not toks:
        return []
    if len(toks) < n:
        return [window_hash(toks)]
    return [window_hash(toks[i:i + n]) for i in range(len(toks) - n + 1)]


def document_frequencies(docs, shingle: str, n: int, bits: int) -> list[int]:
    df = [0] * (1 << bits)
    for d in docs:
        for f in set(features(d, shingle, n)):
            df[f >> (64 - bits)] += 1
    return df


def idf_weights(df, documents: int) -> list[int]:
    return [round(IDF_SCALE * (math.log((1.0 + documents) / (1.0 + c)) + 1.0)) for c in df]


def term_vector(data: bytes, shingle: str, n: int, idf=None, bits: int = 0) -> dict:
    tf = Counter(features(data, shingle, n))
    if idf is None:
        return {f: float(c) for f, c in tf.items()}
    return {f: float(c * idf[f >> (64 - bits)]) for f, c in tf.items()}


def sparse_cosine(u: dict, v: dict) -> float:
    dot = math.fsum(w * v[f] for f, w in u.items() if f in v)
    nu = math.sqrt(math.fsum(w * w for w in u.values()))
    nv = math.sqrt(math.fsum(w * w for w in v.values()))
    return dot / (nu * nv) if nu > 0 and nv > 0 else 0.0


def simhash(vector: dict, bits: int, seed: int) -> list[int]:
    """Bit j = [sum_f w_f R(f, j) >= 0] over the integer weights of ``vector``."""
    acc = [0] * bits
    for f, w in vector.items():
        wi = int(w)
        for j in range(bits):
            acc[j] += wi * entry(f, j, seed)
    return [1 if a >= 0 else 0 for a in acc]
