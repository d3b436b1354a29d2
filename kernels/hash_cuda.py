"""CUDA outer loops (``numba.cuda.jit``) around the scalar twins.

The hash math is the one of :mod:`.hash_scalar`, compiled here with
``numba.cuda.jit(device=True)`` by :func:`.twin.compile_twins`; this module
only adds the GPU outer loops.  Under ``NUMBA_ENABLE_CUDASIM=1`` every kernel
runs in Numba's CUDA simulator, on NumPy arrays, which is how CI checks them
bit for bit against :mod:`.hash_cpu` without a GPU.

Strings are the Arrow (or cuDF) string buffers: ``data`` (uint8, UTF-8) and
per document ``doc_start`` / ``doc_end`` (int64 absolute byte positions into
``data``).  No text passes through Python objects.

Signature kernel, warp per document (``minhash_warps``, the default)
--------------------------------------------------------------------
One warp signs one document segment (``GPUBackend.warp_seg_bytes``, 8 KiB by
default, so nearly every document is one segment); warps take segments with a
grid-stride loop and never wait for each other: after the launch's one block
barrier (loading a table of powers) the hot loop has only warp-level
primitives (ballot, shuffle, ``syncwarp``), no block barrier, no shared atomic.

* **Permutations in registers**: lane ``l`` owns permutations ``l, l + 32,
  ...``: ``per_lane = ceil(num_perm / 32)`` running minima, multipliers and
  offsets, in registers (``per_lane`` and the shingle mode are constants of the
  compiled variant, ``WARP_KERNELS``; 9 for 260 permutations, 4 for 128; up to
  16, i.e. 512 permutations a launch, more in several launches).  Folding a
  key is one 32-bit multiply-add and one minimum per permutation
  (``scalar.permute``); keys are read four at a time from a per-warp buffer
  in shared memory (a broadcast read), so each lane runs ``4 * per_lane``
  independent multiply-adds between two reads.
* **Each token hashed once**: the warp walks the segment in chunks of 32
  bytes, lane ``l`` at byte ``cur + l``; a lane decides alone whether a token
  starts there (``scalar.char_start`` / ``scalar.word_start``) and hashes that
  one token (``next_char`` / ``next_word``: the CPU's token hashes).  A ballot
  ranks the chunk's tokens.
* **Shingles from prefixes (two-phase hashing)**: with ``P_g`` the Horner value
  of the segment's first ``g`` tokens, the shingle of tokens ``i .. i+n-1`` is
  ``H = P_{i+n} - P_i * base**n`` (mod 2**64, exactly the CPU's value), so a
  char 24-gram costs what a 5-gram does.  The chunk's prefixes come from one
  additive warp scan (five shuffles): the token of rank ``r`` enters as
  ``t * base**-(r+1)`` (the base is odd, so invertible mod 2**64) and
  ``P = (P_before + scan) * base**(r+1)``.  A ring of the last ``ring_size``
  prefixes per warp in shared memory (a power of two above ``n + 32``) holds
  ``P_i`` for the windows that end in the chunk.  The 32-bit keys of the
  chunk's full shingles are appended to the warp's key buffer; once 32 or
  more wait, the warp folds them.
* **Segments**: a segment owns the shingles whose first token starts in it; it
  reads on past its end until those shingles are complete (``n - 1`` more
  tokens).  The document's first segment also reads until it has seen ``n``
  tokens, so it alone recognises a short document (``0 < T < n`` tokens: one
  shingle, the Horner value of all its tokens) and signs it, and it alone
  records the first token's position.  A document's only segment stores its
  minima and count; several segments merge theirs with ``atomicMin`` /
  ``atomicAdd``.  Empty documents keep ``SENTINEL`` and count 0.

Under the simulator (``NUMBA_ENABLE_CUDASIM=1``), which has no warp
primitives, ballot, shuffle and ``syncwarp`` are shared-memory exchanges
between block barriers, and the backend launches one warp per block, so a
block barrier is a warp barrier: the same kernel source runs, lane for lane.

Block kernel (``minhash_segments``, ``GPU_DEDUP_SIGNATURE_KERNEL=block``)
-------------------------------------------------------------------------
The first GPU signature kernel, kept for comparison with the warp kernel.
The CPU twin walks each document with a rolling hash, one thread per document.
On the GPU that would leave a warp waiting on its longest document and put a
1 MB document on a single thread, so this kernel is organised around
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

from .hash_scalar import I64, SENTINEL, U32, U64
from .compat_cuda import restore_numpy_aliases
from .twin import compile_twins, guard_cache

restore_numpy_aliases()  # before numba-cuda's first compile reads them

from numba import config as _numba_config  # noqa: E402
from numba import cuda, types  # noqa: E402

_SIMULATOR = bool(_numba_config.ENABLE_CUDASIM)

dev = compile_twins(cuda.jit(device=True))

_shingle_at = dev.shingle_at
_perm_key = dev.perm_key
_permute = dev.permute
_band_hash = dev.band_hash
_exact_hash = dev.exact_hash
_intersection = dev.sorted_intersection
_char_start = dev.char_start
_word_start = dev.word_start
_next_char = dev.next_char
_next_word = dev.next_word


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


# ----------------------------------------------------------------------------- signatures: warp per document
# (design in the module docstring: "Signature kernel, warp per document")

FULL_MASK = 0xFFFFFFFF
WARP = 32
KEY_SLOTS = 2 * WARP  # per-warp key buffer: up to 31 waiting keys plus one chunk's 32
POWERS = WARP + 1  # base**0 .. base**32 (and base**-0 .. base**-32)
PERMS_PER_LANE_MAX = 16  # register minima per lane: up to 512 permutations per launch

if _SIMULATOR:
    # The simulator has no warp intrinsics: each is an exchange through SIM_SCRATCH slots at the start of the
    # dynamic shared memory, between two block barriers.  The backend launches one warp per block there, so a
    # block barrier is a warp barrier; a warp primitive that not all 32 lanes reach hangs the simulated block,
    # as it would be undefined on a device.  (Not a static shared array: the simulator creates those on first
    # use without a lock, and 32 threads leaving a barrier together can each get their own.)
    SIM_SCRATCH = WARP

    @cuda.jit(device=True)
    def _syncwarp():
        cuda.syncthreads()

    @cuda.jit(device=True)
    def _ballot(pred):
        scratch = cuda.shared.array(0, dtype=types.uint64)
        lane = cuda.threadIdx.x
        scratch[lane] = U64(1) if pred else U64(0)
        cuda.syncthreads()
        mask = U64(0)
        for i in range(WARP):
            mask |= scratch[i] << U64(i)
        cuda.syncthreads()
        return U32(mask)

    @cuda.jit(device=True)
    def _shfl_up(v, d):
        scratch = cuda.shared.array(0, dtype=types.uint64)
        lane = cuda.threadIdx.x
        scratch[lane] = v
        cuda.syncthreads()
        got = scratch[lane - d] if lane >= d else v
        cuda.syncthreads()
        return got

    @cuda.jit(device=True)
    def _shfl(v, src):
        scratch = cuda.shared.array(0, dtype=types.uint64)
        scratch[cuda.threadIdx.x] = v
        cuda.syncthreads()
        got = scratch[src]
        cuda.syncthreads()
        return got
else:
    SIM_SCRATCH = 0

    @cuda.jit(device=True)
    def _syncwarp():
        cuda.syncwarp(FULL_MASK)

    @cuda.jit(device=True)
    def _ballot(pred):
        return U32(cuda.ballot_sync(FULL_MASK, pred))

    @cuda.jit(device=True)
    def _shfl_up(v, d):
        return U64(cuda.shfl_up_sync(FULL_MASK, I64(v), d))

    @cuda.jit(device=True)
    def _shfl(v, src):
        return U64(cuda.shfl_sync(FULL_MASK, I64(v), src))


@cuda.jit(device=True)
def _lanes_below(k):
    """Bit mask of the lanes below lane ``k`` (0 <= k <= 32)."""
    return (U64(1) << U64(k)) - U64(1)


def _warp_kernel(per_lane, word_mode):
    """The warp kernel for ``per_lane`` minima per lane (``32 * per_lane`` permutations at most) and one
    shingle mode: both are constants inside, so the minima, multipliers and offsets live in registers."""

    @cuda.jit(cache=True)
    def minhash_warps(data, doc_start, doc_end, seg_doc, seg_lo, seg_hi, n, base_n, word_base, word_base2, powers,
                      ring_size, a, b, out, counts, first):
        """Warp per segment (grid-stride).  ``powers``: base**0..32 then base**-0..-32 (mod 2**64); ``base_n``:
        base**n; ``ring_size``: a power of two >= n + 32.  Dynamic shared memory (uint64): the 66 powers,
        then per warp a ring of ``ring_size`` prefixes and ``KEY_SLOTS`` keys (after ``SIM_SCRATCH`` slots
        under the simulator).  ``a``, ``b``: 32 * per_lane
        (padding: a = 0, b = SENTINEL).  ``out`` starts at SENTINEL, ``counts`` at 0, ``first`` at ``doc_end``.
        """
        shared = cuda.shared.array(0, dtype=types.uint64)
        tid = cuda.threadIdx.x
        lane = tid & 31
        warp = tid >> 5
        for e in range(tid, 2 * POWERS, cuda.blockDim.x):
            shared[SIM_SCRATCH + e] = powers[e]
        cuda.syncthreads()  # the kernel's only block barrier: the warps are independent after it
        up = shared[SIM_SCRATCH:SIM_SCRATCH + POWERS]  # base**k
        down = shared[SIM_SCRATCH + POWERS:SIM_SCRATCH + 2 * POWERS]  # base**-k
        slot = SIM_SCRATCH + 2 * POWERS + warp * (ring_size + KEY_SLOTS)
        ring = shared[slot:slot + ring_size]  # Horner prefix of the first g tokens at g mod ring_size
        keys = shared[slot + ring_size:slot + ring_size + KEY_SLOTS]  # permutation keys waiting for the fold
        wrap = ring_size - 1
        num_perm = out.shape[1]
        below = _lanes_below(lane)
        ma = cuda.local.array(per_lane, types.uint32)
        mb = cuda.local.array(per_lane, types.uint32)
        mins = cuda.local.array(per_lane, types.uint32)
        for q in range(per_lane):  # lane holds permutations lane, lane + 32, ...
            ma[q] = a[q * WARP + lane]
            mb[q] = b[q * WARP + lane]
        warps = cuda.gridDim.x * (cuda.blockDim.x >> 5)
        for s in range(cuda.blockIdx.x * (cuda.blockDim.x >> 5) + warp, seg_doc.shape[0], warps):
            k = seg_doc[s]
            start = doc_start[k]
            end = doc_end[k]
            lo = seg_lo[s]
            hi = seg_hi[s]
            head = lo == start  # the document's first segment: it alone signs a short document, finds the first token
            for q in range(per_lane):
                mins[q] = SENTINEL
            _syncwarp()  # the previous segment's last reads of the ring and keys are done
            if lane == 0:
                ring[0] = U64(0)
            tokens = I64(0)  # tokens seen (starting at lo or after)
            owned = I64(-1)  # tokens starting in [lo, hi), once the walk has passed hi
            prefix = U64(0)  # Horner value of the tokens seen
            waiting = I64(0)  # keys in the buffer
            shingles = I64(0)  # full shingles owned by this segment
            mine = end  # the first token's position, on its lane
            cur = lo
            while True:
                done = cur >= end
                if not done and cur >= hi:  # past the segment: only the tokens that end its shingles are needed
                    need = owned + n - 1 if owned > 0 else I64(0)
                    if head and need < n:
                        need = n  # seeing n tokens tells a short document (fewer than n tokens) apart
                    done = tokens >= need
                if not done:
                    p = cur + lane
                    tok = False
                    t = U64(0)
                    if p < end:
                        if word_mode:
                            if _word_start(data, start, p, end):
                                t, _, _ = _next_word(data, p, end, word_base, word_base2)
                                tok = True
                        elif _char_start(data, start, p, end):
                            t, _ = _next_char(data, p, end)
                            tok = True
                    mask = U64(_ballot(tok))
                    c = I64(cuda.popc(mask))
                    r = I64(cuda.popc(mask & below))  # this lane's token is token tokens + r
                    # Horner prefixes by one additive scan: the token of rank r enters scaled by base**-(r+1)
                    u = t * down[r + 1] if tok else U64(0)
                    d = 1
                    for _ in range(5):
                        w = _shfl_up(u, d)
                        if lane >= d:
                            u += w
                        d *= 2
                    total = _shfl(u, WARP - 1)
                    g = tokens + r
                    here = (prefix + u) * up[r + 1]  # Horner value of tokens 0..g
                    if tok:
                        ring[(g + 1) & wrap] = here
                        if g == 0:
                            mine = p
                    if owned < 0 and cur + WARP >= hi:
                        owned = tokens + I64(cuda.popc(mask & _lanes_below(min(hi - cur, WARP))))
                    _syncwarp()
                    i = g + 1 - n  # the first token of the shingle that this lane's token ends
                    full = tok and i >= 0 and (owned < 0 or i < owned)
                    key = U64(0)
                    if full:
                        key = (here - ring[i & wrap] * base_n) >> U64(32)
                    kmask = U64(_ballot(full))
                    if full:
                        keys[waiting + I64(cuda.popc(kmask & below))] = key
                    fresh = I64(cuda.popc(kmask))
                    waiting += fresh
                    shingles += fresh
                    prefix = (prefix + total) * up[c]
                    tokens += c
                    cur += WARP
                elif head and tokens > 0 and tokens < n:  # a short document: one shingle of all its tokens
                    if lane == 0:
                        keys[waiting] = prefix >> U64(32)
                    waiting += 1
                    shingles = I64(1)
                _syncwarp()
                if waiting >= WARP or (done and waiting > 0):  # fold the waiting keys into the minima
                    padded = (waiting + 3) & ~3  # repeats of key 0 fill the last group of four: no minimum changes
                    if lane < padded - waiting:
                        keys[waiting + lane] = keys[0]
                    _syncwarp()
                    for e in range(0, padded, 4):
                        x0 = U32(keys[U64(e)])
                        x1 = U32(keys[U64(e + 1)])
                        x2 = U32(keys[U64(e + 2)])
                        x3 = U32(keys[U64(e + 3)])
                        for q in range(per_lane):
                            aq = ma[q]
                            bq = mb[q]
                            m = min(mins[q], _permute(x0, aq, bq), _permute(x1, aq, bq))
                            mins[q] = min(m, _permute(x2, aq, bq), _permute(x3, aq, bq))
                    waiting = I64(0)
                    _syncwarp()
                if done:
                    break
            whole = head and hi == end  # the document's only segment: no other writer
            for q in range(per_lane):
                j = q * WARP + lane
                if j < num_perm:
                    if whole:
                        out[k, j] = mins[q]
                    elif mins[q] < SENTINEL:
                        cuda.atomic.min(out, (k, j), mins[q])
            if lane == 0:
                if whole:
                    counts[k] = shingles
                elif shingles > 0:
                    cuda.atomic.add(counts, k, shingles)
            if head and mine < end:
                first[k] = mine

    return minhash_warps


# every variant exists from the import on (created, not compiled): guard_cache below sees their disk cache
WARP_KERNELS = {(per_lane, word): _warp_kernel(per_lane, word)
                for per_lane in range(1, PERMS_PER_LANE_MAX + 1) for word in (False, True)}


def warp_kernel(per_lane: int, word_mode: bool):
    """The warp kernel with ``per_lane`` minima per lane (1..PERMS_PER_LANE_MAX) for word or char shingles."""
    return WARP_KERNELS[(int(per_lane), bool(word_mode))]

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


@cuda.jit(cache=True)
def sort_segments(offsets, segs, values):
    """Sort ``values[offsets[k]:offsets[k + 1]]`` in place, ascending, for each segment ``k`` of ``segs``; block per
    segment (grid-stride): a bitonic sort in the dynamic shared array (uint64), which holds the segment's length
    rounded up to a power of two (the caller lists only segments that fit), padded with the largest uint64."""
    buf = cuda.shared.array(0, dtype=types.uint64)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    top = U64(0xFFFFFFFFFFFFFFFF)
    for i in range(cuda.blockIdx.x, segs.shape[0], cuda.gridDim.x):
        k = segs[i]
        lo = offsets[k]
        n = offsets[k + 1] - lo
        p = 1
        while p < n:
            p <<= 1
        for t in range(tid, p, nt):
            buf[t] = values[lo + t] if t < n else top
        cuda.syncthreads()
        size = 2
        while size <= p:
            stride = size >> 1
            while stride > 0:
                for t in range(tid, p >> 1, nt):  # the pair (a, a + stride) whose a has the stride's bit clear:
                    a = (t << 1) - (t & (stride - 1))  # t = q * stride + r gives a = 2 q stride + r (no division)
                    b = a + stride
                    x = buf[a]
                    y = buf[b]
                    if (x > y) == ((a & size) == 0):  # ascending runs where a's size bit is clear
                        buf[a] = y
                        buf[b] = x
                cuda.syncthreads()
                stride >>= 1
            size <<= 1
        for t in range(tid, n, nt):
            values[lo + t] = buf[t]
        cuda.syncthreads()  # buf is the next segment's


# kernels are cached on disk (NVVM takes seconds per kernel on a device); entries compiled from older sources go
guard_cache({**globals(), **{f"minhash_warps_{p}_{w}": f for (p, w), f in WARP_KERNELS.items()}}, __file__,
            sources=("hash_scalar.py", "text_scalar.py", "twin.py", "compat_cuda.py"))
