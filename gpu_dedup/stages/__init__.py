"""Every pipeline stage as a plain function, for notebooks and custom pipelines.

The functions are the ones :func:`gpu_dedup.run.sequence.execute` chains (each module
is named after its stage); two helpers take a :class:`~gpu_dedup.Config` so a
notebook does not repeat the derived parameters.  Step by step::

    import numpy as np
    from gpu_dedup import Config, stages

    cfg = Config(backend="cpu")
    texts = stages.normalize(table["text"], cfg.normalize)        # normalize
    buf = stages.string_buffers(texts)                            # (offsets, bytes) view for the kernels
    ranks = np.arange(len(buf))                                   # select.keep = first
    rep = stages.exact_groups(stages.exact_keys(buf, cfg.minhash.seed), ranks)   # exact copies
    sig = stages.signatures(buf, cfg.minhash, backend="cpu")      # MinHash
    bk = stages.buckets(stages.bands(sig, cfg))                   # band hashes -> buckets
    edges = stages.verified_edges(bk, cfg, texts=buf)             # star edges, verified
    labels = stages.components(edges, len(buf))                   # clusters
    survivor = stages.survivors(labels, ranks)                    # one survivor per cluster

Every function takes ``backend`` (``"cpu"``, ``"gpu"`` or a backend object) and
returns host NumPy / Arrow data, so the same cells run on either.
"""

from __future__ import annotations

import numpy as np

from gpu_dedup.backends.strings import StringBuffers, string_buffers
from gpu_dedup.config import Config
from gpu_dedup.curves import error_areas, optimal_layout, s_curve
from gpu_dedup.kernels.params import hash_params
from gpu_dedup.stages.buckets import Buckets, buckets
from gpu_dedup.stages.components import components
from gpu_dedup.stages.edges import Centres, Edges, edges, star_rounds
from gpu_dedup.stages.exact import exact_groups, exact_keys
from gpu_dedup.stages.bands import band_hashes
from gpu_dedup.stages.minhash import Signatures, estimate_jaccard, signatures
from gpu_dedup.stages.normalize import normalize, repair_utf8
from gpu_dedup.stages.read import head, read
from gpu_dedup.stages.selection import (
    policy_ranks,
    ranks_from_keys,
    split_chains,
    survivors,
)
from gpu_dedup.stages.verify import (
    exact_similarity,
    pair_similarity,
    signature_similarity,
    verify,
)
from gpu_dedup.storage import memory_shard

__all__ = [
    "read", "head", "memory_shard", "normalize", "repair_utf8", "string_buffers", "StringBuffers",
    "exact_keys", "exact_groups", "signatures", "Signatures", "estimate_jaccard", "hash_params",
    "band_hashes", "bands", "s_curve", "optimal_layout", "error_areas",
    "buckets", "Buckets", "edges", "Edges", "star_rounds", "Centres", "verified_edges",
    "verify", "exact_similarity", "signature_similarity", "components",
    "policy_ranks", "ranks_from_keys", "survivors", "split_chains",
]


def bands(sig, cfg: Config = Config(), backend=None) -> np.ndarray:
    """(n, bands) band hashes of ``sig`` (a :class:`Signatures` or its value matrix) for
    ``cfg.layout`` and ``cfg.minhash``'s hash parameters."""
    values = sig.values if isinstance(sig, Signatures) else np.asarray(sig)
    b, r = cfg.layout
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm)
    return band_hashes(values, b, r, params, backend or cfg.backend)


def verified_edges(bk: Buckets, cfg: Config = Config(), *, texts=None, signatures=None, docs=None,
                   backend=None) -> Edges:
    """Candidate edges of ``bk`` (a star per bucket, re-starred ``cfg.lsh.star_rounds``
    times), scored by ``cfg.verify.method`` and kept at ``cfg.verify_threshold`` or above.

    Bucket members are rows of the band-hash (= signature) matrix.  ``texts``
    (StringBuffers of the normalized texts) is needed by ``exact``;
    ``signatures`` (values, all ``num_perm`` columns) by ``signature`` and
    ``none``.  ``docs``: the text row of each signature row, when signatures
    were computed for a subset (``signatures(..., docs=...)``); the edges are
    returned in text rows.
    """
    be = backend or cfg.backend
    rows = None if docs is None else np.asarray(docs, np.int64)
    buf = None if texts is None or hasattr(texts, "offsets") else string_buffers(texts)
    buf = texts if buf is None else buf
    values = signatures.values if isinstance(signatures, Signatures) else signatures

    def similarity(a, b):
        if rows is not None and cfg.verify.method == "exact":
            a, b = rows[a], rows[b]
        return pair_similarity(cfg, be, a, b, texts=buf, signatures=values)

    found = star_rounds(bk, similarity, cfg.verify_threshold, cfg.lsh.star_rounds,
                        keep_all=cfg.verify.method == "none").verified
    if rows is None:
        return found
    return Edges(rows[found.src], rows[found.dst], found.similarity)
