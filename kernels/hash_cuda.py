"""CUDA outer loops (``numba.cuda.jit``) around the scalar twins.

The hash math is the one of :mod:`.hash_scalar`, compiled here with
``numba.cuda.jit(device=True)`` by :func:`.twin.compile_twins`; this module
only adds the GPU outer loops.  Under ``NUMBA_ENABLE_CUDASIM=1`` every kernel
runs in Numba's CUDA simulator, on NumPy arrays, which is how CI checks them
bit for bit against :mod:`.hash_cpu` without a GPU.

Strings are the Arrow (or cuDF) string buffers: ``data`` (uint8, UTF-8) and
per document ``doc_start`` / ``doc_end`` (int64 absolute byte positions into
``data``).  No text passes through Python objects.

Signature kernel design (``minhash_segments``)
----------------------------------------------
The CPU twin walks each document with a rolling hash, one thread per document.
On the GPU that would leave a warp waiting on its longest document and put a
1 MB document on a single thread, so the GPU kernel is organised around
*byte positions* and *permutations* instead:

* **Work items are segments**: each document is cut into segments of at most
  ``seg_bytes`` bytes (32 KiB by default).  A 10-byte document is one
  segment; a 1 MB document is 31 segments processed by 31 blocks on as many
  SMs.  One block takes one segment at a time and walks the segment list with
  a grid-stride loop, so 10 M documents are one launch with a grid sized to
  the device (a few blocks per SM), never a host loop.
* **Hash phase, parallel over positions**: the block walks its segment in
  rounds of ``span`` bytes; thread ``t`` takes the bytes ``t, t + blockDim,
  ...`` of the round.  A thread decides on its own whether a token starts at
  its byte (``scalar.char_start``: not a UTF-8 continuation byte that the
  previous lead byte consumes; ``scalar.word_start``: a non-space code point
  after a space or the document start), then hashes the ``n``-token shingle
  from there directly (``scalar.shingle_at``: the same Horner polynomial the
  rolling CPU loop maintains, so the value is bit-identical).  The 32-bit
  permutation keys of full shingles (``n`` tokens) are appended to a
  shared-memory buffer ``xs`` (uint32) through a shared atomic counter: bytes that start no token (UTF-8 continuation bytes,
  the inside of words) cost no permutation work at all.
* **Min phase, parallel over permutations**: after a barrier, thread ``t``
  owns permutations ``t, t + blockDim, ...`` and folds every value of ``xs``
  into its running minima, which live in shared memory (``sig``, uint32):
  one 32-bit multiply-add and a minimum per value (``scalar.permute``).  All
  threads read the same ``xs[i]`` at the same time (a shared-memory
  broadcast, no bank conflicts), and each minimum has a single owner, so the
  "reduction" needs no shuffles, no atomics and no tree: the block size is
  chosen as ``num_perm`` rounded up to a warp multiple, so every thread owns
  one permutation (two or more only past 512 permutations).  The counter of
  the round is double-buffered, so a round costs two barriers.
* **Merge**: a document's only segment stores its minima, count and first
  token position; the segments of a longer document merge theirs with
  ``atomicMin`` / ``atomicAdd`` / ``atomicMin``.
* **Short documents** (``0 < T < n`` tokens: exactly one shingle of all
  ``T`` tokens) have no full shingle, so after the main kernel they are the
  documents with count 0 and a first token: ``short_values`` hashes their one
  shingle from that token and ``short_signatures`` spreads it over the
  permutations.  ``T == 0`` documents keep ``SENTINEL`` (2**32 - 1).

Work per round is ``span`` shingle hashes over ``blockDim`` threads plus
(values in the round) x ``num_perm`` permutations over ``blockDim`` threads,
so a 10-byte document costs one short round (every thread still does useful
permutation work), a 1 MB document is spread over many blocks, and the only
per-document overhead is a few barriers.  Shingles are hashed directly
(``n`` token hashes and multiply-adds per shingle instead of the rolling 2),
which is small next to the ``num_perm`` permutations each shingle feeds.

Other kernels
-------------
``count_segments`` / ``emit_segments`` reuse the same position-parallel hash
phase to count and write every document's shingle values (with repeats) for
exact Jaccard; the backend sorts them per document (a stable sort by value,
then by document) and drops repeats.  ``band_hashes`` is a thread per
(document, band), ``exact_hashes`` a thread per document, ``jaccard_pairs``
and ``signature_similarity`` a thread per pair; all grid-stride.
"""

from .hash_scalar import SENTINEL
from .compat_cuda import restore_numpy_aliases
from .twin import compile_twins, guard_cache

restore_numpy_aliases()  # before numba-cuda's first compile reads them

from numba import cuda, types  # noqa: E402

dev = compile_twins(cuda.jit(device=True))

_shingle_at = dev.shingle_at
_perm_key = dev.perm_key
_permute = dev.permute
_band_hash = dev.band_hash
_exact_hash = dev.exact_hash
_intersection = dev.sorted_intersection


@cuda.jit(device=True)
def _hash_round(data, start, end, p0, p1, word_mode, n, base, word_base, word_base2, keys, xs, state, slot, first):
    """Hash phase of one round: append the full shingles starting in [p0, p1) to
    ``xs`` (slot counter ``state[slot]``): their 32-bit permutation keys if
    ``keys``, else their 64-bit values.  Returns the thread's first token."""
    for p in range(p0 + cuda.threadIdx.x, p1, cuda.blockDim.x):
        h, m, token = _shingle_at(data, start, p, end, word_mode, n, base, word_base, word_base2)
        if token:
            if p < first:
                first = p
            if m == n:
                i = cuda.atomic.add(state, slot, 1)
                if keys:
                    xs[i] = _perm_key(h)
                else:
                    xs[i] = h
    return first


@cuda.jit(cache=True)
def minhash_segments(data, doc_start, doc_end, seg_doc, seg_lo, seg_hi, word_mode, n, base, word_base, word_base2,
                     a, b, span, out, counts, first):
    """Block per segment (grid-stride).  Dynamic shared memory: (num_perm + span) uint32.

    ``out`` (docs x num_perm, uint32) must start at ``SENTINEL``, ``counts`` at 0
    and ``first`` at ``doc_end``; afterwards ``counts`` holds the number of full
    shingles and ``first`` the first token position of each document.
    """
    dyn = cuda.shared.array(0, dtype=types.uint32)
    state = cuda.shared.array(4, dtype=types.int64)  # [0], [1]: round counters; [2]: values; [3]: first token
    num_perm = a.shape[0]
    sig = dyn[:num_perm]
    xs = dyn[num_perm:]
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for s in range(cuda.blockIdx.x, seg_doc.shape[0], cuda.gridDim.x):
        k = seg_doc[s]
        start = doc_start[k]
        end = doc_end[k]
        for j in range(tid, num_perm, nt):
            sig[j] = SENTINEL
        if tid == 0:
            state[0] = 0
            state[1] = 0
            state[2] = 0
            state[3] = end
        cuda.syncthreads()
        mine = end
        slot = 0
        for p0 in range(seg_lo[s], seg_hi[s], span):
            mine = _hash_round(data, start, end, p0, min(p0 + span, seg_hi[s]), word_mode, n, base, word_base,
                               word_base2, True, xs, state, slot, mine)
            cuda.syncthreads()
            cnt = state[slot]
            if tid == 0:
                state[2] += cnt
                state[1 - slot] = 0  # the next round's counter; nobody touches it before the barrier below
            for j in range(tid, num_perm, nt):
                aj = a[j]
                bj = b[j]
                m = sig[j]
                for i in range(cnt):
                    v = _permute(xs[i], aj, bj)
                    if v < m:
                        m = v
                sig[j] = m
            cuda.syncthreads()
            slot = 1 - slot
        if mine < end:
            cuda.atomic.min(state, 3, mine)
        cuda.syncthreads()
        whole = seg_lo[s] == start and seg_hi[s] == end  # the document's only segment: no other writer
        for j in range(tid, num_perm, nt):  # each thread reads only the minima it owns
            v = sig[j]
            if whole:
                out[k, j] = v
            elif v < SENTINEL:
                cuda.atomic.min(out, (k, j), v)
        if tid == 0:  # only thread 0 reads state before the next segment's barrier
            if whole:
                counts[k] = state[2]
                first[k] = state[3]
            else:
                if state[2] > 0:
                    cuda.atomic.add(counts, k, state[2])
                if state[3] < end:
                    cuda.atomic.min(first, k, state[3])


@cuda.jit(cache=True)
def count_segments(data, doc_start, doc_end, seg_doc, seg_lo, seg_hi, word_mode, n, base, word_base, word_base2,
                   counts, first):
    """Full-shingle count and first token position per document (``counts`` from 0,
    ``first`` from ``doc_end``); block per segment, no shared memory."""
    for s in range(cuda.blockIdx.x, seg_doc.shape[0], cuda.gridDim.x):
        k = seg_doc[s]
        start = doc_start[k]
        end = doc_end[k]
        mine = end
        full = 0
        for p in range(seg_lo[s] + cuda.threadIdx.x, seg_hi[s], cuda.blockDim.x):
            h, m, token = _shingle_at(data, start, p, end, word_mode, n, base, word_base, word_base2)
            if token:
                if p < mine:
                    mine = p
                if m == n:
                    full += 1
        if full > 0:
            cuda.atomic.add(counts, k, full)
        if mine < end:
            cuda.atomic.min(first, k, mine)


@cuda.jit(cache=True)
def emit_segments(data, doc_start, doc_end, seg_doc, seg_lo, seg_hi, word_mode, n, base, word_base, word_base2, span,
                  cursor, values):
    """Write every full shingle value of each document into ``values`` at
    ``cursor[k]`` onwards (``cursor`` starts at the document's offset; order
    within a document is arbitrary, the caller sorts).  Block per segment;
    dynamic shared memory: ``span`` uint64."""
    xs = cuda.shared.array(0, dtype=types.uint64)
    state = cuda.shared.array(3, dtype=types.int64)  # [0], [1]: round counters; [2]: reserved output position
    tid = cuda.threadIdx.x
    for s in range(cuda.blockIdx.x, seg_doc.shape[0], cuda.gridDim.x):
        k = seg_doc[s]
        start = doc_start[k]
        end = doc_end[k]
        if tid == 0:
            state[0] = 0
            state[1] = 0
        cuda.syncthreads()
        slot = 0
        for p0 in range(seg_lo[s], seg_hi[s], span):
            _hash_round(data, start, end, p0, min(p0 + span, seg_hi[s]), word_mode, n, base, word_base, word_base2,
                        False, xs, state, slot, end)
            cuda.syncthreads()
            cnt = state[slot]
            if tid == 0:
                state[1 - slot] = 0
                if cnt > 0:
                    state[2] = cuda.atomic.add(cursor, k, cnt)  # one global atomic per round
            cuda.syncthreads()
            at = state[2]
            for i in range(tid, cnt, cuda.blockDim.x):
                values[at + i] = xs[i]
            cuda.syncthreads()  # xs and state[2] are reused by the next round
            slot = 1 - slot


@cuda.jit(cache=True)
def short_values(short, data, doc_start, doc_end, first, word_mode, n, base, word_base, word_base2, out):
    """out[i] = the one shingle value of short document ``short[i]`` (fewer than n
    tokens, first token at ``first[short[i]]``); thread per document."""
    for i in range(cuda.grid(1), short.shape[0], cuda.gridsize(1)):
        k = short[i]
        h, m, token = _shingle_at(data, doc_start[k], first[k], doc_end[k], word_mode, n, base, word_base, word_base2)
        out[i] = h


@cuda.jit(cache=True)
def short_signatures(short, xvals, a, b, out, counts):
    """Signature rows of short documents from their one shingle; thread per (document, permutation)."""
    num_perm = a.shape[0]
    for t in range(cuda.grid(1), short.shape[0] * num_perm, cuda.gridsize(1)):
        i = t // num_perm
        j = t - i * num_perm
        k = short[i]
        out[k, j] = _permute(_perm_key(xvals[i]), a[j], b[j])
        if j == 0:
            counts[k] = 1


@cuda.jit(cache=True)
def band_hashes(sig, bands, rows, band_base, out):
    """out[k, band] = band_hash(sig[k], band); thread per (document, band)."""
    for t in range(cuda.grid(1), sig.shape[0] * bands, cuda.gridsize(1)):
        k = t // bands
        band = t - k * bands
        out[k, band] = _band_hash(sig[k], band, rows, band_base)


@cuda.jit(cache=True)
def exact_hashes(offsets, data, seed1, seed2, out):
    """out[k] = exact_hash of document k's bytes (two 64-bit lanes); thread per document."""
    for k in range(cuda.grid(1), offsets.shape[0] - 1, cuda.gridsize(1)):
        h1, h2 = _exact_hash(data, offsets[k], offsets[k + 1], seed1, seed2)
        out[k, 0] = h1
        out[k, 1] = h2


@cuda.jit(cache=True)
def jaccard_pairs(set_offsets, values, left, right, out):
    """Exact Jaccard of sorted unique shingle sets per (left, right) pair; two empty sets give 0."""
    for e in range(cuda.grid(1), left.shape[0], cuda.gridsize(1)):
        i = left[e]
        j = right[e]
        xs = set_offsets[i]
        xe = set_offsets[i + 1]
        ys = set_offsets[j]
        ye = set_offsets[j + 1]
        inter = _intersection(values, xs, xe, values, ys, ye)
        union = (xe - xs) + (ye - ys) - inter
        if union > 0:
            out[e] = inter / union
        else:
            out[e] = 0.0


@cuda.jit(cache=True)
def signature_similarity(sig, left, right, out):
    """Fraction of equal signature values per (left, right) pair; thread per pair."""
    num_perm = sig.shape[1]
    for e in range(cuda.grid(1), left.shape[0], cuda.gridsize(1)):
        i = left[e]
        j = right[e]
        same = 0
        for p in range(num_perm):
            if sig[i, p] == sig[j, p]:
                same += 1
        out[e] = same / num_perm


@cuda.jit(cache=True)
def hook_min(labels, new, src, dst):
    """Hooking step of label propagation: for each edge (u, v) with
    m = min(labels[u], labels[v]), lower new[u], new[v], new[labels[u]] and
    new[labels[v]] to m (atomicMin); thread per edge."""
    for e in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        u = src[e]
        v = dst[e]
        lu = labels[u]
        lv = labels[v]
        m = lu if lu < lv else lv
        cuda.atomic.min(new, lu, m)
        cuda.atomic.min(new, lv, m)
        cuda.atomic.min(new, u, m)
        cuda.atomic.min(new, v, m)


# ----------------------------------------------------------------------------- text normalization
# The one-pass normalization of kernels/text_scalar.py (the CPU compiles the same source in text_cpu.py).

from . import text_scalar as _text  # noqa: E402

tdev = compile_twins(cuda.jit(device=True), module=_text)
_normalize_text = tdev.normalize_text


@cuda.jit(cache=True)
def normalize_texts(data, doc_start, doc_end, stage1, stage2, ascii_action, need, lowercase, remove_punct,
                    collapse_ws, out, out_start, lengths, status):
    """Thread per document (grid-stride): ``kernels.text_scalar.normalize_text`` of document k into
    ``out[out_start[k]:]`` (room: its input length); bytes written and status per document."""
    for k in range(cuda.grid(1), doc_start.shape[0], cuda.gridsize(1)):
        n, s = _normalize_text(data, doc_start[k], doc_end[k], stage1, stage2, ascii_action, need, lowercase,
                               remove_punct, collapse_ws, out, out_start[k])
        lengths[k] = n
        status[k] = s


@cuda.jit(cache=True)
def gather_segments(src_values, src, lengths, dst, dst_values):
    """dst_values[dst[k]:dst[k] + lengths[k]] = src_values[src[k]:...]; block per segment
    (grid-stride), the block's threads copy consecutive bytes (coalesced)."""
    for k in range(cuda.blockIdx.x, src.shape[0], cuda.gridDim.x):
        s = src[k]
        d = dst[k]
        for i in range(cuda.threadIdx.x, lengths[k], cuda.blockDim.x):
            dst_values[d + i] = src_values[s + i]


# kernels are cached on disk (NVVM takes seconds per kernel on a device); entries compiled from older sources go
guard_cache(globals(), __file__, sources=("hash_scalar.py", "text_scalar.py", "twin.py", "compat_cuda.py"))
