"""Exact-duplicate stage: documents whose normalized text is byte-identical.

Each document gets a key (byte length, two 64-bit hash lanes: kernels/hash_scalar.py,
step 6); documents with equal keys form a group and the group's representative
is its best-ranked member.  Only representatives go on to the MinHash stages;
the others follow their representative's cluster.
"""

from __future__ import annotations

import numpy as np

from gpu_dedup.backends import array_module, distinct, get_backend, sorted_copy, stable_order, to_host
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.kernels.params import hash_params

NO_KEY = np.uint64(2**64 - 1)  # exact-key length of a row that matches nothing (a vector without a direction)


def stored_keys(keys: dict, null) -> np.ndarray:
    """The exact keys an index stores (n x 3, host): ``keys``' k0, k1, k2, with a null row's (``null``: bool per
    row, or None) set to match nothing: its key is the empty text's, which a dedup never matches to a null."""
    key = np.column_stack([to_host(keys["k0"]), to_host(keys["k1"]), to_host(keys["k2"])])
    if null is not None:
        key[np.asarray(to_host(null), bool), 0] = NO_KEY
    return key


def exact_keys(texts, seed: int = 42, backend="cpu") -> np.ndarray:
    """(n, 3) uint64 keys: byte length, hash 1, hash 2."""
    params = hash_params(seed, 0)
    buffers = texts if hasattr(texts, "offsets") else string_buffers(texts)
    hashes = get_backend(backend).exact_hashes(buffers, params.exact_seed1, params.exact_seed2)
    xp = array_module(hashes)  # device buffers give device keys
    return xp.column_stack([buffers.lengths.astype(xp.uint64), hashes])


def exact_groups(keys, ranks, eligible=None):
    """Representative of every document: the best-ranked document with the same key.

    Documents outside ``eligible`` (e.g. null texts) represent themselves.
    Array code of ``keys``' module (NumPy or CuPy).  A document whose first hash
    no other document shares is alone in its group (one unstable sort of that
    column finds them); the others, in document order, are grouped by stable
    sorts by rank, then by each key column, group starts by a running count.
    """
    xp = array_module(keys)
    n = keys.shape[0]
    rep = xp.arange(n, dtype=xp.int64)
    idx = rep if eligible is None else xp.flatnonzero(eligible)
    if idx.shape[0] < 2:
        return rep
    first = keys[idx, 1]
    by_first = stable_order(first)
    same = first[by_first[1:]] == first[by_first[:-1]]
    shared = xp.zeros(idx.shape[0], dtype=bool)
    shared[1:] |= same
    shared[:-1] |= same
    runs = _runs_are_groups(keys, ranks, idx[by_first[shared]])
    if runs is not None:
        at, heads = runs
        rep[at] = heads
        return rep
    idx = idx[sorted_copy(by_first[shared])]  # document order, as every document sorted would keep it
    if idx.shape[0] < 2:
        return rep
    k = xp.take(keys, idx, axis=0)
    order = stable_order(k[:, 0], k[:, 1], k[:, 2], ranks[idx])
    sk = xp.take(k, order, axis=0)
    new_group = xp.ones(order.shape[0], dtype=bool)
    new_group[1:] = xp.any(sk[1:] != sk[:-1], axis=1)
    head = xp.flatnonzero(new_group)[xp.cumsum(new_group) - 1]
    rep[idx[order]] = idx[order[head]]
    return rep


def _runs_are_groups(keys, ranks, pos):
    """Where the runs of equal first hash in ``pos`` (the documents sharing one, ordered by it, then in document
    order) are the groups themselves, each already in the full sort's order: (``pos``, the representative of
    each), else None.  That holds where within every run the length and the second hash are equal too and the
    ranks never fall, so the run's first document is its best-ranked (ties: the first in document order).  The
    usual case (a first-hash collision between different texts comes once in about 2**64 / n pairs), and it
    saves the sort by all four keys (three of them 64 bits wide: one radix sort each), 3 s of 10^7 documents
    that all have copies on 2 cores."""
    xp = array_module(keys)
    if pos.shape[0] < 2:
        return pos, pos
    k, r = xp.take(keys, pos, axis=0), ranks[pos]  # take: NumPy's row gather is 3x slower by fancy indexing
    new = xp.ones(pos.shape[0], dtype=bool)
    xp.not_equal(k[1:, 1], k[:-1, 1], out=new[1:])
    within = (k[1:, 0] == k[:-1, 0]) & (k[1:, 2] == k[:-1, 2]) & (r[1:] >= r[:-1])
    if not bool(xp.all(new[1:] | within)):
        return None
    return pos, pos[xp.flatnonzero(new)[xp.cumsum(new) - 1]]


# ---------------------------------------------------------------------------- partition functions
# (see gpu_dedup.run.contract: frames are dicts of equal-length arrays, one partition of a table)


def key_frame(docs: dict, keys: dict) -> dict:
    """The rows of one block that may form exact groups, with what grouping needs: ``row``, ``rank``,
    ``k0``..``k2`` (where every row may, the block's own columns: the grouping only reads them).  Rows without a
    key (a vector without direction: length NO_KEY) never group."""
    xp = array_module(docs["row"])
    keyed = docs["eligible"] & (keys["k0"] != xp.uint64(int(NO_KEY)))
    cols = {"row": docs["row"], "rank": docs["rank"], "k0": keys["k0"], "k1": keys["k1"], "k2": keys["k2"]}
    if bool(keyed.all()):  # every row (a corpus without null texts or indexed copies): the columns, not copies
        return cols
    pick = xp.flatnonzero(keyed)
    return {k: v[pick] for k, v in cols.items()}


def exact_copies(part: dict) -> dict:
    """Of the rows of one key partition (every row of a key is there): the ``row`` of each copy and the
    ``rep`` (row) of its group's best-ranked member."""
    xp = array_module(part["row"])
    keys = xp.column_stack([part["k0"], part["k1"], part["k2"]])
    rep = part["row"][exact_groups(keys, part["rank"])]
    copy = rep != part["row"]
    return {"row": part["row"][copy], "rep": rep[copy]}


def with_copies(docs: dict, copies: dict | None) -> dict:
    """A block's rows with column ``rep``: the row of its exact group's representative (itself if none)."""
    out = dict(docs)
    rep = docs["row"].copy()
    if copies is not None and copies["row"].shape[0]:
        rep[copies["row"] - docs["row"][0]] = copies["rep"]
    out["rep"] = rep
    return out


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def docs_frame(docs: dict, keys: dict | None, ranks: dict | None, prior, exact: bool) -> dict:
    """A block's rows with ``rank`` (keep policy; input order: the row), ``match`` (the indexed document
    it is an exact copy of, or -1) and ``eligible`` (may join an exact group of this run)."""
    xp = array_module(docs["row"])
    out = dict(docs)
    out["rank"] = ranks["rank"] if ranks is not None else docs["row"].copy()
    match = xp.full(docs["row"].shape[0], -1, dtype=xp.int64)
    if prior.active and exact and keys is not None and docs["row"].shape[0]:
        host = np.column_stack([to_host(keys["k0"]), to_host(keys["k1"]), to_host(keys["k2"])])
        match = xp.asarray(prior.exact_matches(host))
        match[docs["null"]] = -1
    out["match"] = match
    out["eligible"] = ~docs["null"] & (match < 0) if exact else xp.zeros(docs["row"].shape[0], dtype=bool)
    return out


def copies_and_reps(copies: dict) -> dict:
    """The exact groups of a key partition as rows to send to their blocks: each copy with its ``rep``, and
    each representative that has copies (``rep`` = -1 marks it)."""
    xp = array_module(copies["row"])
    reps = distinct(copies["rep"])
    return {"row": xp.concatenate((copies["row"], reps)),
            "rep": xp.concatenate((copies["rep"], xp.full(reps.shape[0], -1, dtype=xp.int64)))}


def groups_of(groups: dict, docs: dict) -> dict:
    """A block's rows ``docs`` with ``rep`` (exact representative row) and ``has_copies``, from the exact
    groups' rows routed to the block (``groups``: first, as a route's ``after`` step gets them)."""
    xp = array_module(docs["row"])
    is_copy = groups["rep"] >= 0
    out = with_copies(docs, {"row": groups["row"][is_copy], "rep": groups["rep"][is_copy]})
    has = xp.zeros(docs["row"].shape[0], dtype=bool)
    if docs["row"].shape[0]:
        has[groups["row"][~is_copy] - docs["row"][0]] = True
    out["has_copies"] = has
    return out


def no_groups(docs: dict) -> dict:
    out = dict(docs)
    out["rep"] = docs["row"].copy()
    out["has_copies"] = array_module(docs["row"]).zeros(docs["row"].shape[0], dtype=bool)
    return out


def exact_counts(docs: dict) -> dict:
    return {"copies": int((docs["rep"] != docs["row"]).sum()), "matched": int((docs["match"] >= 0).sum())}


def sign_rows(docs: dict) -> dict:
    """Rows that get a signature: representatives with text that are no copy of an indexed document."""
    xp = array_module(docs["row"])
    return {"row": docs["row"][xp.flatnonzero((docs["rep"] == docs["row"]) & ~docs["null"] & (docs["match"] < 0))]}
