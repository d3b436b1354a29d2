"""Deterministic planted-cluster corpora: the demo's sample and the benchmarks' generator.

Documents are sequences of pseudo-words drawn from a Zipf distribution over a
synthetic vocabulary, with sentence punctuation.  Some base documents get
near-duplicate variants made by random word substitutions, deletions and
insertions at a per-variant edit rate (rate 0 gives copies that are identical,
or identical after normalization when case changes are applied).  Everything
is vectorized over the token stream (text assembly is one compiled loop over
tokens): no Python loop over documents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ONSETS = ["", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z",
           "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "io", "y"]
_CODAS = ["", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ck"]


@dataclass(frozen=True)
class PlantedCorpus:
    table: pa.Table  # id (string), text (large_string), cluster (int64: planted cluster, -1 alone), variant_of
    edit_rate: np.ndarray  # per document (0 for bases and unique documents)

    @property
    def clusters(self) -> np.ndarray:
        return np.asarray(self.table.column("cluster"))


def vocabulary(size: int, seed: int = 0) -> list[bytes]:
    """``size`` distinct pseudo-words (deterministic)."""
    rng = np.random.default_rng(seed)
    words: dict[bytes, None] = {}
    while len(words) < size:
        m = size - len(words)
        syll = rng.integers(1, 4, m)
        for k in range(m):  # vocabulary setup: O(vocabulary), independent of corpus size
            parts = []
            for _ in range(syll[k]):
                parts.append(_ONSETS[rng.integers(len(_ONSETS))] + _VOWELS[rng.integers(len(_VOWELS))]
                             + _CODAS[rng.integers(len(_CODAS))])
            words.setdefault("".join(parts).encode(), None)
    return list(words)[:size]


def _mutate(tokens, doc_of, rates, vocab_size, rng):
    """Substitute / delete / insert words at per-document ``rates`` (a third each)."""
    u = rng.random(tokens.shape[0])
    r = rates[doc_of]
    sub = u < r / 3
    dele = (u >= r / 3) & (u < 2 * r / 3)
    ins = (u >= 2 * r / 3) & (u < r)
    primary = np.where(sub, rng.integers(0, vocab_size, tokens.shape[0]), tokens)
    pair = np.stack([primary, rng.integers(0, vocab_size, tokens.shape[0])], axis=1)
    mask = np.stack([~dele, ins], axis=1)
    new_tokens = pair[mask]
    new_doc_of = np.repeat(doc_of, mask.sum(axis=1))
    return new_tokens, new_doc_of


@numba.njit(cache=True)
def _fill_text(tokens, tok_start, sep_len, upper, word_bytes, word_off, word_len, out):
    """Write each token's word (capitalised if ``upper``) and separator at ``tok_start``."""
    for i in range(tokens.shape[0]):
        w = tokens[i]
        o = tok_start[i]
        src = word_off[w]
        for j in range(word_len[w]):
            out[o + j] = word_bytes[src + j]
        if upper[i] and word_len[w] > 0 and out[o] >= 97 and out[o] <= 122:
            out[o] -= 32
        o += word_len[w]
        if sep_len[i] == 2:
            out[o] = 46  # "."
            out[o + 1] = 32
        elif sep_len[i] == 1:
            out[o] = 32


def _assemble(tokens, doc_of, n_docs, vocab, sep_period, upper_first):
    """Build an Arrow large_string array from word ids (flat) and their document index."""
    word_bytes = np.frombuffer(b"".join(vocab), np.uint8)
    word_len = np.array([len(w) for w in vocab], np.int64)
    word_off = np.concatenate(([0], np.cumsum(word_len)[:-1]))
    # each token emits its word then a separator: ". " after sentence ends, " " otherwise,
    # nothing after a document's last token
    last = np.ones(tokens.shape[0], bool)
    last[:-1] = doc_of[1:] != doc_of[:-1]
    sep_len = np.where(last, 0, np.where(sep_period, 2, 1)).astype(np.int8)
    tok_len = word_len[tokens] + sep_len
    tok_start = np.concatenate(([0], np.cumsum(tok_len)[:-1]))
    out = np.empty(int(tok_len.sum()), np.uint8)
    _fill_text(tokens, tok_start, sep_len, upper_first, word_bytes, word_off, word_len, out)
    doc_bytes = np.bincount(doc_of, weights=tok_len, minlength=n_docs).astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(doc_bytes)))
    return pa.LargeStringArray.from_buffers(n_docs, pa.py_buffer(offsets), pa.py_buffer(out))


def planted_corpus(n_docs: int = 3000, n_clusters: int = 150, cluster_size=(2, 6), words=(60, 400),
                   edit_rate=(0.0, 0.1), vocab_size: int = 20000, seed: int = 0,
                   boilerplate_fraction: float = 0.0, boilerplate_identical: bool = False,
                   empty_fraction: float = 0.0) -> PlantedCorpus:
    """A corpus of ``n_docs`` documents with ``n_clusters`` planted near-duplicate clusters.

    Cluster sizes are uniform in ``cluster_size`` (inclusive); document lengths
    are log-uniform in ``words``; each variant's edit rate is uniform in
    ``edit_rate``.  ``boilerplate_fraction`` of the documents are one short
    boilerplate text with a distinct number appended (one giant near-duplicate
    bucket, for skew tests), or the very same text if ``boilerplate_identical``;
    ``empty_fraction`` of the documents are empty strings.  Boilerplate and
    empty documents have cluster ids ``n_clusters`` and ``n_clusters + 1``.
    """
    rng = np.random.default_rng(seed)
    vocab = vocabulary(vocab_size, seed)
    sizes = rng.integers(cluster_size[0], cluster_size[1] + 1, n_clusters) if n_clusters else np.zeros(0, int)
    n_boiler = int(round(boilerplate_fraction * n_docs))
    n_empty = int(round(empty_fraction * n_docs))
    n_variants = int((sizes - 1).sum())
    n_base = n_docs - n_variants - n_boiler - n_empty
    if n_base < n_clusters:
        raise ValueError(f"n_docs = {n_docs} is too small for {n_clusters} clusters of sizes {cluster_size}")
    # base documents
    lengths = np.exp(rng.uniform(np.log(words[0]), np.log(words[1]), n_base)).astype(np.int64)
    zipf = 1.0 / (np.arange(vocab_size) + 2.7) ** 1.07
    zipf /= zipf.sum()
    base_tokens = rng.choice(vocab_size, size=int(lengths.sum()), p=zipf)
    base_doc = np.repeat(np.arange(n_base), lengths)
    # variants of the first n_clusters bases
    src = np.repeat(np.arange(n_clusters), sizes - 1)
    rates = rng.uniform(edit_rate[0], edit_rate[1], n_variants)
    rates[rng.random(n_variants) < 0.15] = 0.0  # some exact (after normalization) copies
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    var_len = lengths[src]
    idx = np.repeat(starts[src], var_len) + (np.arange(int(var_len.sum())) - np.repeat(np.cumsum(var_len) - var_len, var_len))
    var_tokens, var_doc = _mutate(base_tokens[idx], np.repeat(np.arange(n_variants), var_len), rates, vocab_size, rng)
    tokens = np.concatenate([base_tokens, var_tokens])
    doc_of = np.concatenate([base_doc, var_doc + n_base])
    n_gen = n_base + n_variants
    sentence = rng.random(tokens.shape[0]) < 1 / 12
    upper = np.zeros(tokens.shape[0], bool)
    upper[0] = True
    upper[1:] = sentence[:-1] | (doc_of[1:] != doc_of[:-1])
    text = _assemble(tokens, doc_of, n_gen, vocab, sentence, upper)
    # case-only changes on a few exact copies (identical after normalization)
    shout = np.zeros(n_gen, bool)
    shout[n_base:] = (rates == 0) & (rng.random(n_variants) < 0.3)
    if shout.any():
        text = pc.if_else(pa.array(shout), pc.utf8_upper(text), text)
    cluster = np.full(n_gen, -1, np.int64)
    cluster[:n_clusters] = np.arange(n_clusters)
    cluster[n_base:] = src
    variant_of = np.full(n_gen, -1, np.int64)
    variant_of[n_base:] = src
    rate_all = np.concatenate([np.zeros(n_base), rates])
    if n_boiler:
        boiler = "Subscribe to our newsletter for the latest updates. All rights reserved. Terms of use apply. Item "
        if boilerplate_identical:
            nums = pa.repeat(pa.scalar("1000", pa.large_string()), n_boiler)
        else:
            nums = pc.cast(pa.array(rng.permutation(n_boiler) + 1000), pa.large_string())
        btext = pc.binary_join_element_wise(pa.scalar(boiler, pa.large_string()), nums, pa.scalar("", pa.large_string()))
        text = pa.concat_arrays([pc.cast(text, pa.large_string()), btext])
        cluster = np.concatenate([cluster, np.full(n_boiler, n_clusters, np.int64)])
        variant_of = np.concatenate([variant_of, np.full(n_boiler, -2, np.int64)])
        rate_all = np.concatenate([rate_all, np.zeros(n_boiler)])
    if n_empty:
        text = pa.concat_arrays([pc.cast(text, pa.large_string()), pa.repeat(pa.scalar("", pa.large_string()), n_empty)])
        cluster = np.concatenate([cluster, np.full(n_empty, n_clusters + 1, np.int64)])
        variant_of = np.concatenate([variant_of, np.full(n_empty, -3, np.int64)])
        rate_all = np.concatenate([rate_all, np.zeros(n_empty)])
    # shuffle so clusters are spread over the corpus and shards
    order = rng.permutation(n_docs)
    ids = pc.binary_join_element_wise(
        "doc-", pc.utf8_lpad(pc.cast(pa.array(np.arange(n_docs)), pa.string()), 7, "0"), ""
    )
    table = pa.table(
        {
            "id": ids,
            "text": pc.cast(text, pa.large_string()).take(pa.array(order)),
            "cluster": pa.array(cluster[order]),
            "variant_of": pa.array(variant_of[order]),
        }
    )
    return PlantedCorpus(table, rate_all[order])


def write_shards(table: pa.Table, directory, shards: int = 4, fmt: str = "parquet", prefix: str = "part",
                 row_group_rows: int | None = None) -> list:
    """Split ``table`` into ``shards`` contiguous files in ``directory``; returns their paths.

    ``row_group_rows`` caps the rows of a Parquet row group (default: pyarrow's)."""
    import os

    import pyarrow.parquet as pq

    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    paths = []
    for i in range(shards):  # one step per shard file
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        if fmt == "parquet":
            path = os.path.join(directory, f"{prefix}-{i:05d}.parquet")
            pq.write_table(part, path, row_group_size=row_group_rows)
        else:  # pyarrow has no JSON writer
            path = os.path.join(directory, f"{prefix}-{i:05d}.jsonl")
            part.to_pandas().to_json(path, orient="records", lines=True, force_ascii=False)
        paths.append(path)
    return paths


# ---------------------------------------------------------------- planted embeddings (similarity: cosine)


@dataclass(frozen=True)
class PlantedEmbeddings:
    vectors: np.ndarray  # (n, dim) float32, unit rows
    cluster: np.ndarray  # int64 per row: planted cluster id, -1 alone
    to_centre: np.ndarray  # float64 per row: planted cosine to its cluster's centre (1 for centres and singles)

    def table(self, column: str = "emb", fixed_size: bool = True) -> pa.Table:
        """An Arrow table (id, ``column``, cluster): ``fixed_size_list<float32>`` or ``list<float32>``."""
        n, d = self.vectors.shape
        flat = pa.array(self.vectors.reshape(-1), pa.float32())
        emb = (pa.FixedSizeListArray.from_arrays(flat, d) if fixed_size
               else pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * d), flat))
        ids = pc.binary_join_element_wise(
            "vec-", pc.utf8_lpad(pc.cast(pa.array(np.arange(n)), pa.string()), 8, "0"), "")
        return pa.table({"id": ids, column: emb, "cluster": pa.array(self.cluster)})


def _unit_rows(rng, n: int, dim: int) -> np.ndarray:
    g = rng.standard_normal((n, dim))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


def planted_embeddings(n: int = 100_000, dim: int = 256, n_clusters: int = 10_000, cluster_size=(2, 6),
                       to_centre=(0.9, 1.0), anisotropy: float = 0.0, seed: int = 0,
                       block: int = 65_536) -> PlantedEmbeddings:
    """``n`` unit vectors in ``dim`` dimensions with ``n_clusters`` planted clusters of perturbed copies.

    Each cluster has a centre ``c`` (a random unit vector, itself a row) and
    ``size - 1`` members ``u = a c + sqrt(1 - a**2) g`` with ``g`` a random
    unit vector orthogonal to ``c`` and ``a`` uniform in ``to_centre``, so
    ``cos(u, c) = a`` exactly and two members meet at about ``a1 * a2``
    (the default spreads pairs over [0.81, 1], across a 0.9 threshold).
    Cluster sizes are uniform in ``cluster_size``; the other rows are random
    unit vectors.  ``anisotropy`` in [0, 1) mixes a shared direction ``mu``
    into every centre and single row (``sqrt(1 - a) g + sqrt(a) mu``,
    renormalized), as real embeddings share a mean direction: unrelated rows
    then meet at cosine about ``anisotropy`` instead of 0.  Rows are shuffled.
    Generated in blocks of ``block`` rows (float64 work arrays stay small);
    no Python loop over rows.
    """
    if not 0.0 <= anisotropy < 1.0:
        raise ValueError(f"anisotropy = {anisotropy} must be in [0, 1)")
    if not -1.0 <= to_centre[0] <= to_centre[1] <= 1.0:
        raise ValueError(f"to_centre = {to_centre} must be an interval inside [-1, 1]")
    rng = np.random.default_rng(seed)
    sizes = rng.integers(cluster_size[0], cluster_size[1] + 1, n_clusters) if n_clusters else np.zeros(0, np.int64)
    members = int((sizes - 1).sum())
    singles = n - n_clusters - members
    if singles < 0:
        raise ValueError(f"n = {n} is too small for {n_clusters} clusters of sizes {cluster_size}")
    mu = _unit_rows(rng, 1, dim)[0]
    out = np.empty((n, dim), np.float32)
    heads = n_clusters + singles  # centres first, then single rows, then members
    for lo in range(0, heads, block):  # n / block steps
        hi = min(lo + block, heads)
        g = _unit_rows(rng, hi - lo, dim)
        if anisotropy > 0:
            g = np.sqrt(1.0 - anisotropy) * g + np.sqrt(anisotropy) * mu[None, :]
            g /= np.linalg.norm(g, axis=1, keepdims=True)
        out[lo:hi] = g
    owner = np.repeat(np.arange(n_clusters), sizes - 1)
    a = rng.uniform(to_centre[0], to_centre[1], members)
    for lo in range(0, members, block):  # members / block steps
        hi = min(lo + block, members)
        c = out[owner[lo:hi]].astype(np.float64)
        c /= np.linalg.norm(c, axis=1, keepdims=True)
        g = rng.standard_normal((hi - lo, dim))
        g -= np.sum(g * c, axis=1, keepdims=True) * c
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        u = a[lo:hi, None] * c + np.sqrt(1.0 - a[lo:hi, None] ** 2) * g
        out[heads + lo:heads + hi] = u / np.linalg.norm(u, axis=1, keepdims=True)
    cluster = np.concatenate([np.arange(n_clusters), np.full(singles, -1), owner]).astype(np.int64)
    cos_c = np.concatenate([np.ones(heads), a])
    order = rng.permutation(n)
    return PlantedEmbeddings(out[order], cluster[order], cos_c[order])
