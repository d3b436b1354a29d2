"""GPU backend: the CUDA kernels of ``gpu_dedup.kernels.cuda`` behind the CPU backend's API.

The pipeline is host-side today: every method takes host NumPy arrays /
:class:`~gpu_dedup.strings.StringBuffers`, copies what it needs to the device,
runs the kernels and returns host NumPy arrays with the same dtypes and shapes
as :class:`~gpu_dedup.backends.cpu.CPUBackend`, so results are interchangeable
(and tested to be bit-identical).  The text buffer of the last
``StringBuffers`` seen stays on the device, so the verify stage's repeated
``shingle_sets`` calls copy it once.

Array allocation goes through ``self.xp``: CuPy on a real device, NumPy when
the backend is built under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``),
where kernels accept host arrays.  That is how CI runs this very class
without a GPU (``tests/kernels/_cudasim_cases.py``).

Components: cuGraph's weakly connected components when cuGraph imports, else
:func:`components_xp` (label propagation with pointer jumping, on CuPy; the
same function runs on NumPy in the tests).  Labels are canonical either way:
the smallest node index of the component, as on the CPU.
"""

from __future__ import annotations

import logging

import numpy as np

from ..buckets import Buckets, Edges
from ..hashing import HashParams
from ..strings import StringBuffers

log = logging.getLogger("gpu_dedup")

SEGMENT_BYTES = 1 << 15  # a document is cut into segments of this many bytes (one block each)
SPAN = 1024  # byte positions hashed per round of a block (shared buffer of this many values)
PERM_CHUNK = 4096  # permutations per launch (shared memory: (chunk + span) * 8 bytes <= 48 KiB)
ITEM_THREADS = 256  # block size of the thread-per-item kernels


def signature_threads(num_perm: int) -> int:
    """Block size of the signature kernel: one permutation per thread, a warp multiple, 64..512."""
    return int(min(512, max(64, -(-num_perm // 32) * 32)))


def segment_table(starts: np.ndarray, ends: np.ndarray, seg_bytes: int):
    """Cut documents [starts[k], ends[k]) into segments of at most ``seg_bytes``:
    (document index, first byte, end byte) per segment; empty documents have none."""
    lengths = ends - starts
    nseg = (lengths + seg_bytes - 1) // seg_bytes
    seg_doc = np.repeat(np.arange(starts.shape[0], dtype=np.int64), nseg)
    within = np.arange(seg_doc.shape[0], dtype=np.int64) - np.repeat(np.cumsum(nseg) - nseg, nseg)
    lo = starts[seg_doc] + within * seg_bytes
    hi = np.minimum(lo + seg_bytes, ends[seg_doc])
    return seg_doc, lo.astype(np.int64), hi.astype(np.int64)


def sorted_unique_segments(xp, offsets, values):
    """Sort each segment ``values[offsets[k]:offsets[k+1]]`` and drop repeats; returns
    the CSR (offsets, values) of the distinct values.  Two stable sorts (by value,
    then by segment) instead of a per-segment loop; ``xp`` is NumPy or CuPy."""
    m = offsets.shape[0] - 1
    total = values.shape[0]
    seg = xp.searchsorted(offsets[1:], xp.arange(total, dtype=xp.int64), side="right")
    o1 = xp.argsort(values, kind="stable")
    o2 = xp.argsort(seg[o1], kind="stable")
    order = o1[o2]
    v = values[order]
    s = seg[order]
    keep = xp.ones(total, dtype=bool)
    if total > 1:
        keep[1:] = (v[1:] != v[:-1]) | (s[1:] != s[:-1])
    unique = xp.bincount(s[keep], minlength=m) if total else xp.zeros(m, dtype=xp.int64)
    out_offsets = xp.zeros(m + 1, dtype=xp.int64)
    out_offsets[1:] = xp.cumsum(unique)
    return out_offsets, v[keep]


def _minimum_at(labels, new, src, dst):
    """NumPy hooking step of :func:`components_xp`."""
    lu = labels[src]
    lv = labels[dst]
    m = np.minimum(lu, lv)
    for target in (lu, lv, src, dst):
        np.minimum.at(new, target, m)


def components_xp(xp, src, dst, n: int, hook=_minimum_at):
    """Connected components by min-label hooking and pointer jumping.

    Each sweep lowers, for every edge (u, v) with m = min(L[u], L[v]), the
    labels of u, v and of the roots L[u], L[v] to m (``hook``), then jumps
    pointers (L = L[L]) until every node points at a root.  Labels only
    decrease and always name a node of the same component; at the fixed point
    both ends of every edge share one root, the component's smallest node.
    """
    labels = xp.arange(n, dtype=xp.int64)
    if n == 0 or src.shape[0] == 0:
        return labels
    while True:
        new = labels.copy()
        hook(labels, new, src, dst)
        while True:
            jumped = new[new]
            if bool((jumped == new).all()):
                break
            new = jumped
        if bool((new == labels).all()):
            return labels
        labels = new


def buckets_xp(xp, band_hashes) -> tuple:
    """Device twin of :func:`gpu_dedup.buckets.buckets`: (band, hash, offsets, members) arrays of ``xp``."""
    n, num_bands = band_hashes.shape
    bands, hashes, sizes, members = [], [], [], []
    for band in range(num_bands if n else 0):  # one sort per band: O(bands) launches
        col = band_hashes[:, band]
        order = xp.argsort(col, kind="stable")  # stable: members ascend inside a bucket
        sorted_h = col[order]
        start = xp.ones(n, dtype=bool)
        start[1:] = sorted_h[1:] != sorted_h[:-1]
        starts = xp.flatnonzero(start)
        run = xp.diff(xp.concatenate((starts, xp.asarray([n], dtype=starts.dtype))))
        multi = run > 1
        if not bool(multi.any()):
            continue
        keep = multi[xp.cumsum(start) - 1]
        bands.append(xp.full(int(multi.sum()), band, dtype=xp.int32))
        hashes.append(sorted_h[starts[multi]])
        sizes.append(run[multi])
        members.append(order[keep].astype(xp.int64))
    if not bands:
        return (xp.zeros(0, dtype=xp.int32), xp.zeros(0, dtype=xp.uint64), xp.zeros(1, dtype=xp.int64),
                xp.zeros(0, dtype=xp.int64))
    sizes = xp.concatenate(sizes)
    offsets = xp.zeros(sizes.shape[0] + 1, dtype=xp.int64)
    offsets[1:] = xp.cumsum(sizes)
    return xp.concatenate(bands), xp.concatenate(hashes), offsets, xp.concatenate(members)


def star_edges_xp(xp, offsets, members):
    """Device twin of :func:`gpu_dedup.buckets.edges`: sorted distinct star edges (src, dst)."""
    if members.shape[0] == 0:
        e = xp.zeros(0, dtype=xp.int64)
        return e, e
    bucket = xp.searchsorted(offsets[1:], xp.arange(members.shape[0], dtype=xp.int64), side="right")
    center = members[offsets[:-1]][bucket]
    not_center = xp.ones(members.shape[0], dtype=bool)
    not_center[offsets[:-1]] = False
    src, dst = center[not_center], members[not_center]
    if src.shape[0] and max(int(src.max()), int(dst.max())) < 2**31:  # pack into one sortable key
        key = xp.unique((src << 32) | dst)
        return key >> 32, key & 0xFFFFFFFF
    from ..buckets import unique_pairs

    s, d = unique_pairs(_to_host(src), _to_host(dst))
    return xp.asarray(s), xp.asarray(d)


def _to_host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


class GPUBackend:
    """Same entry points, arguments and results as ``CPUBackend``; kernels on the device."""

    name = "gpu"

    def __init__(self, info: dict | None = None, *, xp=None, threads: int | None = None, span: int = SPAN,
                 seg_bytes: int = SEGMENT_BYTES, item_threads: int = ITEM_THREADS, max_blocks: int | None = None,
                 perm_chunk: int = PERM_CHUNK):
        from numba import config as numba_config
        from numba import cuda

        from gpu_dedup.kernels import cuda as kernels

        self.k = kernels
        self.simulator = bool(numba_config.ENABLE_CUDASIM)
        # small batches (a verify chunk, a few pairs) legitimately launch small grids
        numba_config.CUDA_LOW_OCCUPANCY_WARNINGS = False
        if xp is None:
            if self.simulator:
                xp = np
            else:
                import cupy as xp
        self.xp = xp
        self.info = dict(info or {})
        self.threads = threads  # None: signature_threads(num_perm)
        self.span = int(span)
        self.seg_bytes = int(seg_bytes)
        self.item_threads = int(item_threads)
        self.perm_chunk = int(perm_chunk)
        if self.simulator:
            self.device_name = "CUDA simulator"
            self.max_blocks = int(max_blocks or 4)
        else:
            device = cuda.get_current_device()
            name = device.name
            self.device_name = name.decode() if isinstance(name, bytes) else str(name)
            self.max_blocks = int(max_blocks or device.MULTIPROCESSOR_COUNT * 16)
        self._strings_dev = None

    # ------------------------------------------------------------------ plumbing

    @property
    def mode(self) -> str:
        where = f"CUDA kernels (numba-cuda) on {self.device_name}"
        if self.info.get("frames") == "cudf":
            frames = "cuDF installed (the pipeline still exchanges host pyarrow/NumPy frames with the backend)"
        else:
            frames = "pyarrow frames (cuDF not installed)"
        comps = "cuGraph components" if self._cugraph() is not None else "CuPy components"
        return f"gpu: {where}, {frames}, {comps}"

    def synchronize(self) -> None:
        """Wait for the device's queued work (for timings)."""
        if self.xp is not np:
            self.xp.cuda.Device().synchronize()

    def _dev(self, a, dtype=None):
        """A device copy (a real copy for NumPy too: the simulator writes every argument back)."""
        return self.xp.array(np.ascontiguousarray(a, dtype=dtype))

    @staticmethod
    def _host(a) -> np.ndarray:
        return _to_host(a)

    def _data(self, strings: StringBuffers):
        """Device copy of the text bytes, kept for the next call on the same buffers."""
        if self._strings_dev is None or self._strings_dev[0] is not strings.data:
            data = strings.data if strings.data.shape[0] else np.zeros(1, np.uint8)  # no zero-size arguments
            self._strings_dev = (strings.data, self._dev(data, np.uint8))
        return self._strings_dev[1]

    def _blocks(self, items: int, per_block: int = 1) -> int:
        return max(1, min(self.max_blocks, -(-items // per_block)))

    def _select(self, strings: StringBuffers, docs):
        if docs is None:
            docs = np.arange(len(strings), dtype=np.int64)
        docs = np.ascontiguousarray(docs, dtype=np.int64)
        return docs, strings.offsets[docs].astype(np.int64), strings.offsets[docs + 1].astype(np.int64)

    @staticmethod
    def _shingle_args(params: HashParams, shingle: str, ngram: int):
        return shingle == "word", np.int64(ngram), np.uint64(params.shingle_base), np.uint64(params.word_base)

    def _segments(self, starts, ends):
        seg_doc, lo, hi = segment_table(starts, ends, self.seg_bytes)
        return seg_doc.shape[0], (self._dev(seg_doc), self._dev(lo), self._dev(hi))

    def _count_pass(self, data, d_start, d_end, nseg, segs, sargs, threads):
        """Full-shingle counts and first token positions (count kernel)."""
        xp = self.xp
        counts = xp.zeros(d_start.shape[0], dtype=xp.int64)
        first = d_end.copy()
        if nseg:
            self.k.count_segments[self._blocks(nseg), threads](data, d_start, d_end, *segs, *sargs, counts, first)
        return counts, first

    def _short_values(self, data, d_start, d_end, first, short, sargs):
        xvals = self.xp.empty(short.shape[0], dtype=self.xp.uint64)
        if short.shape[0]:
            t = self.item_threads
            self.k.short_values[self._blocks(short.shape[0], t), t](short, data, d_start, d_end, first, *sargs, xvals)
        return xvals

    # ------------------------------------------------------------------ kernels

    def minhash(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None, docs=None):
        """Signatures (len(docs) x num_perm) and shingle counts of the selected documents."""
        out, counts = self.minhash_device(strings, params, shingle, ngram, num_perm, docs)
        return self._host(out), self._host(counts)

    def minhash_device(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None,
                       docs=None):
        """:meth:`minhash` with the results left on the device (``xp`` arrays)."""
        xp = self.xp
        num_perm = params.num_perm if num_perm is None else int(num_perm)
        docs, starts, ends = self._select(strings, docs)
        m = docs.shape[0]
        if m == 0 or num_perm == 0:
            return xp.empty((m, num_perm), dtype=params.signature_dtype), xp.zeros(m, dtype=xp.int64)
        data = self._data(strings)
        d_start, d_end = self._dev(starts), self._dev(ends)
        nseg, segs = self._segments(starts, ends)
        sargs = self._shingle_args(params, shingle, ngram)
        bits64 = params.hash_bits == 64
        a = self._dev(params.a[:num_perm], np.uint64)
        b = self._dev(params.b[:num_perm], np.uint64)
        out = xp.full((m, num_perm), params.prime, dtype=xp.uint64)
        counts = xp.zeros(m, dtype=xp.int64)
        first = d_end.copy()
        threads = self.threads or signature_threads(min(num_perm, self.perm_chunk))
        for p0 in range(0, num_perm, self.perm_chunk):  # one launch unless num_perm > perm_chunk
            p1 = min(num_perm, p0 + self.perm_chunk)
            whole = p0 == 0 and p1 == num_perm
            part = out if whole else xp.full((m, p1 - p0), params.prime, dtype=xp.uint64)
            c, f = (counts, first) if p0 == 0 else (xp.zeros(m, dtype=xp.int64), d_end.copy())
            if nseg:
                shared = (p1 - p0 + self.span) * 8
                self.k.minhash_segments[self._blocks(nseg), threads, 0, shared](
                    data, d_start, d_end, *segs, *sargs, a[p0:p1], b[p0:p1], bits64, np.int64(self.span), part, c, f
                )
            if not whole:
                out[:, p0:p1] = part
        short = xp.flatnonzero((counts == 0) & (first < d_end)).astype(xp.int64)
        if short.shape[0]:
            xvals = self._short_values(data, d_start, d_end, first, short, sargs)
            t = self.item_threads
            self.k.short_signatures[self._blocks(short.shape[0] * num_perm, t), t](short, xvals, a, b, bits64, out, counts)
        if not bits64:
            out = out.astype(xp.uint32)
        return out, counts

    def shingle_sets(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, docs=None):
        """Sorted distinct shingle values of each selected document, as CSR (offsets, values)."""
        xp = self.xp
        docs, starts, ends = self._select(strings, docs)
        m = docs.shape[0]
        if m == 0:
            return np.zeros(1, np.int64), np.zeros(0, np.uint64)
        data = self._data(strings)
        d_start, d_end = self._dev(starts), self._dev(ends)
        nseg, segs = self._segments(starts, ends)
        sargs = self._shingle_args(params, shingle, ngram)
        threads = self.threads or 128
        counts, first = self._count_pass(data, d_start, d_end, nseg, segs, sargs, threads)
        is_short = (counts == 0) & (first < d_end)
        raw_offsets = xp.zeros(m + 1, dtype=xp.int64)
        raw_offsets[1:] = xp.cumsum(counts + is_short.astype(xp.int64))
        raw = xp.empty(int(raw_offsets[-1]), dtype=xp.uint64)
        if nseg and raw.shape[0]:
            cursor = raw_offsets[:-1].copy()
            self.k.emit_segments[self._blocks(nseg), threads, 0, self.span * 8](
                data, d_start, d_end, *segs, *sargs, np.int64(self.span), cursor, raw
            )
        short = xp.flatnonzero(is_short).astype(xp.int64)
        if short.shape[0]:
            raw[raw_offsets[short]] = self._short_values(data, d_start, d_end, first, short, sargs)
        offsets, values = sorted_unique_segments(xp, raw_offsets, raw)
        return self._host(offsets), self._host(values)

    def jaccard_pairs(self, set_offsets, set_values, left, right) -> np.ndarray:
        e = len(left)
        if e == 0:
            return np.empty(0, np.float64)
        out = self.xp.empty(e, dtype=self.xp.float64)
        values = set_values if len(set_values) else np.zeros(1, np.uint64)
        t = self.item_threads
        self.k.jaccard_pairs[self._blocks(e, t), t](
            self._dev(set_offsets, np.int64), self._dev(values, np.uint64), self._dev(left, np.int64),
            self._dev(right, np.int64), out,
        )
        return self._host(out)

    def signature_similarity(self, sig, left, right) -> np.ndarray:
        e = len(left)
        if e == 0:
            return np.empty(0, np.float64)
        out = self.xp.empty(e, dtype=self.xp.float64)
        t = self.item_threads
        self.k.signature_similarity[self._blocks(e, t), t](
            self._dev(sig), self._dev(left, np.int64), self._dev(right, np.int64), out
        )
        return self._host(out)

    def band_hashes(self, sig, bands: int, rows: int, band_base: int) -> np.ndarray:
        n = sig.shape[0]
        if n == 0 or bands == 0:
            return np.empty((n, bands), np.uint64)
        out = self.xp.empty((n, bands), dtype=self.xp.uint64)
        t = self.item_threads
        self.k.band_hashes[self._blocks(n * bands, t), t](
            self._dev(sig), np.int64(bands), np.int64(rows), np.uint64(band_base), out
        )
        return self._host(out)

    def exact_hashes(self, strings: StringBuffers, base1: int, base2: int) -> np.ndarray:
        n = len(strings)
        if n == 0:
            return np.empty((0, 2), np.uint64)
        out = self.xp.empty((n, 2), dtype=self.xp.uint64)
        t = self.item_threads
        self.k.exact_hashes[self._blocks(n, t), t](
            self._dev(strings.offsets, np.int64), self._data(strings), np.uint64(base1), np.uint64(base2), out
        )
        return self._host(out)

    # ------------------------------------------------------------------ graphs and frames

    @staticmethod
    def _cugraph():
        try:
            import cugraph
        except Exception:
            return None
        return cugraph

    def _hook(self, labels, new, src, dst):
        t = self.item_threads
        self.k.hook_min[self._blocks(src.shape[0], t), t](labels, new, src, dst)

    def components(self, src, dst, n: int) -> np.ndarray:
        """Connected components; label = smallest node index in the component."""
        if n == 0:
            return np.zeros(0, np.int64)
        src = self._dev(src, np.int64)
        dst = self._dev(dst, np.int64)
        cugraph = None if self.simulator else self._cugraph()
        if cugraph is not None and src.shape[0]:
            try:
                return self._host(self._components_cugraph(cugraph, src, dst, n))
            except Exception as exc:  # pragma: no cover - needs cuGraph
                log.warning("cuGraph components failed (%s); using the CuPy implementation", exc)
        return self._host(components_xp(self.xp, src, dst, n, hook=self._hook))

    def _components_cugraph(self, cugraph, src, dst, n):  # pragma: no cover - needs cuGraph
        import cudf

        xp = self.xp
        g = cugraph.Graph(directed=False)
        g.from_cudf_edgelist(cudf.DataFrame({"src": src, "dst": dst}), source="src", destination="dst")
        wcc = cugraph.weakly_connected_components(g)
        wcc["root"] = wcc.groupby("labels")["vertex"].transform("min")
        labels = xp.arange(n, dtype=xp.int64)
        labels[xp.asarray(wcc["vertex"].values, dtype=xp.int64)] = xp.asarray(wcc["root"].values, dtype=xp.int64)
        return labels

    def buckets(self, band_hashes) -> Buckets:
        """Device grouping of an (n, bands) band-hash matrix; same result as ``gpu_dedup.buckets.buckets``."""
        band, hsh, offsets, members = buckets_xp(self.xp, self._dev(band_hashes, np.uint64))
        return Buckets(self._host(band), self._host(hsh), self._host(offsets), self._host(members))

    def edges(self, b: Buckets) -> Edges:
        """Device star edges; same result as ``gpu_dedup.buckets.edges``."""
        src, dst = star_edges_xp(self.xp, self._dev(b.offsets, np.int64), self._dev(b.members, np.int64))
        return Edges(self._host(src).astype(np.int64), self._host(dst).astype(np.int64))
