"""GPU backend: the CUDA kernels of ``gpu_dedup.kernels.cuda`` behind the CPU backend's API.

The pipeline is host-side today: every method takes host NumPy arrays /
:class:`~gpu_dedup.backends.strings.StringBuffers`, copies what it needs to the device,
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
from dataclasses import dataclass

import numpy as np

from gpu_dedup.backends.cpu import signature_values
from gpu_dedup.backends.prepare import prepare as prepare_kernels
from gpu_dedup.backends.strings import StringBuffers
from gpu_dedup.backends.textnorm import slow_path
from gpu_dedup.kernels import text as text_kernel
from gpu_dedup.kernels.params import HashParams

log = logging.getLogger("gpu_dedup")

SEGMENT_BYTES = 1 << 15  # a document is cut into segments of this many bytes (one block each)
SPAN = 1024  # byte positions hashed per round of a block (shared buffer of this many values)
PERM_CHUNK = 8192  # permutations per launch (shared memory: (chunk + span) * 4 bytes <= 48 KiB)
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


def _to_host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


@dataclass
class DeviceText:
    """Normalized texts on the device (``xp`` arrays) and what it took to get them there."""

    offsets: object  # int64, n + 1, from 0
    chars: object  # uint8
    invalid_utf8: int  # documents that had ill-formed UTF-8
    slow_docs: int  # documents normalized on the host (an unstable code point, or repair first)
    bytes_to_host: int  # host<->device traffic of the fallback (bytes)
    bytes_to_device: int


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

    def prepare(self, cfg) -> float:
        """Compile the CUDA kernels a run with ``cfg`` launches, before the first stage (numba-cuda
        compiles a kernel at its first launch in each process), on a tiny sample; logs once when
        something compiles.  Returns the seconds spent.  Nothing to do under the simulator."""
        if self.simulator:
            return 0.0
        seconds, _ = prepare_kernels(self, cfg)
        self.synchronize()
        return seconds

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
        return (shingle == "word", np.int64(ngram), np.uint64(params.shingle_base), np.uint64(params.word_base),
                np.uint64(params.word_base2))

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
            return xp.empty((m, num_perm), dtype=xp.uint32), xp.zeros(m, dtype=xp.int64)
        data = self._data(strings)
        d_start, d_end = self._dev(starts), self._dev(ends)
        nseg, segs = self._segments(starts, ends)
        sargs = self._shingle_args(params, shingle, ngram)
        a = self._dev(params.a[:num_perm], np.uint32)
        b = self._dev(params.b[:num_perm], np.uint32)
        out = xp.full((m, num_perm), params.sentinel, dtype=xp.uint32)
        counts = xp.zeros(m, dtype=xp.int64)
        first = d_end.copy()
        threads = self.threads or signature_threads(min(num_perm, self.perm_chunk))
        for p0 in range(0, num_perm, self.perm_chunk):  # one launch unless num_perm > perm_chunk
            p1 = min(num_perm, p0 + self.perm_chunk)
            whole = p0 == 0 and p1 == num_perm
            part = out if whole else xp.full((m, p1 - p0), params.sentinel, dtype=xp.uint32)
            c, f = (counts, first) if p0 == 0 else (xp.zeros(m, dtype=xp.int64), d_end.copy())
            if nseg:
                shared = (p1 - p0 + self.span) * 4
                self.k.minhash_segments[self._blocks(nseg), threads, 0, shared](
                    data, d_start, d_end, *segs, *sargs, a[p0:p1], b[p0:p1], np.int64(self.span), part, c, f
                )
            if not whole:
                out[:, p0:p1] = part
        short = xp.flatnonzero((counts == 0) & (first < d_end)).astype(xp.int64)
        if short.shape[0]:
            xvals = self._short_values(data, d_start, d_end, first, short, sargs)
            t = self.item_threads
            self.k.short_signatures[self._blocks(short.shape[0] * num_perm, t), t](short, xvals, a, b, out, counts)
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
            self._dev(signature_values(sig)), self._dev(left, np.int64), self._dev(right, np.int64), out
        )
        return self._host(out)

    def band_hashes(self, sig, bands: int, rows: int, band_base: int) -> np.ndarray:
        """One 64-bit hash per band of ``rows`` uint32 signature values: (n, bands) uint64."""
        n = sig.shape[0]
        if n == 0 or bands == 0:
            return np.empty((n, bands), np.uint64)
        out = self.xp.empty((n, bands), dtype=self.xp.uint64)
        t = self.item_threads
        self.k.band_hashes[self._blocks(n * bands, t), t](
            self._dev(signature_values(sig)), np.int64(bands), np.int64(rows), np.uint64(band_base), out
        )
        return self._host(out)

    def exact_hashes(self, strings: StringBuffers, seed1: int, seed2: int) -> np.ndarray:
        """Two 64-bit lanes of the exact-duplicate key of every document: (n, 2) uint64."""
        n = len(strings)
        if n == 0:
            return np.empty((0, 2), np.uint64)
        out = self.xp.empty((n, 2), dtype=self.xp.uint64)
        t = self.item_threads
        self.k.exact_hashes[self._blocks(n, t), t](
            self._dev(strings.offsets, np.int64), self._data(strings), np.uint64(seed1), np.uint64(seed2), out
        )
        return self._host(out)

    # ------------------------------------------------------------------ text

    def _text_tables(self, form: str):
        """Device copies of the property table of ``form`` (once per backend and form)."""
        cache = self.__dict__.setdefault("_tables_dev", {})
        if form not in cache:
            stage1, stage2 = text_kernel.property_table(form)
            cache[form] = (self._dev(stage1, np.uint16), self._dev(stage2, np.uint64))
        return cache[form]

    def _gather(self, src_values, src, lengths, dst, dst_values) -> None:
        if src.shape[0]:
            self.k.gather_segments[self._blocks(src.shape[0]), self.item_threads](src_values, src, lengths, dst,
                                                                                  dst_values)

    def normalize(self, offsets, chars, cfg, valid=None) -> DeviceText:
        """Normalize device string buffers (``offsets`` int32/int64 n + 1, ``chars`` uint8, the
        layout of a cuDF / Arrow string column; ``valid``: optional bool mask, nulls read as
        empty) into new device buffers, byte-identical to the CPU's ``normalize_counted``.

        The one-pass kernel of ``kernels/text.py`` runs a thread per document; only the
        documents it hands back (an unstable code point, or ill-formed UTF-8 whose
        replacement does not fit) cross the bus, go through the host's slow path
        (``gpu_dedup.backends.textnorm.slow_path``: repair, utf8proc, the same kernel) and
        come back; their bytes are counted in the result.
        """
        xp = self.xp
        need = text_kernel.need_mask(cfg.unicode, cfg.lowercase)
        offsets = xp.asarray(offsets).astype(xp.int64)
        n = offsets.shape[0] - 1
        starts = xp.ascontiguousarray(offsets[:-1])
        ends = xp.ascontiguousarray(offsets[1:])
        if valid is not None:
            ends = xp.where(xp.asarray(valid, dtype=bool), ends, starts)
        if chars.shape[0] == 0:
            chars = xp.zeros(1, dtype=xp.uint8)  # no zero-size kernel arguments
        out = xp.empty(chars.shape[0], dtype=xp.uint8)
        lengths = xp.zeros(n, dtype=xp.int64)
        status = xp.zeros(n, dtype=xp.int64)
        if n:
            stage1, stage2 = self._text_tables(cfg.unicode)
            act = self._dev(text_kernel.ascii_actions(cfg.lowercase, cfg.punctuation, cfg.whitespace), np.int64)
            t = self.item_threads
            self.k.normalize_texts[self._blocks(n, t), t](
                chars, starts, ends, stage1, stage2, act, np.int64(need), bool(cfg.lowercase),
                bool(cfg.punctuation), bool(cfg.whitespace), out, starts, lengths, status)
        slow_mask = (status & (text_kernel.UNSTABLE | text_kernel.OVERFLOW)) != 0
        invalid = int(((~slow_mask) & ((status & text_kernel.INVALID) != 0)).sum())
        slow = xp.flatnonzero(slow_mask).astype(xp.int64)
        m = int(slow.shape[0])
        down = up = 0
        if m:
            seg_len = ends[slow] - starts[slow]
            seg_off = xp.zeros(m + 1, dtype=xp.int64)
            seg_off[1:] = xp.cumsum(seg_len)
            seg = xp.empty(max(1, int(seg_off[-1])), dtype=xp.uint8)
            self._gather(chars, starts[slow], seg_len, seg_off[:-1], seg)
            host_seg, host_off = self._host(seg)[: int(seg_off[-1])], self._host(seg_off)
            down = host_seg.nbytes + host_off.nbytes
            fb, fb_off, bad = slow_path(host_seg, host_off, cfg)
            invalid += bad
            fb_dev = self._dev(fb if fb.shape[0] else np.zeros(1, np.uint8), np.uint8)
            fb_off_dev = self._dev(fb_off, np.int64)
            up = fb.nbytes + fb_off.nbytes
            lengths[slow] = fb_off_dev[1:] - fb_off_dev[:-1]
        new_offsets = xp.zeros(n + 1, dtype=xp.int64)
        new_offsets[1:] = xp.cumsum(lengths)
        result = xp.empty(max(1, int(new_offsets[-1])), dtype=xp.uint8)
        ok = xp.flatnonzero(~slow_mask).astype(xp.int64)
        self._gather(out, starts[ok], lengths[ok], new_offsets[ok], result)
        if m:
            self._gather(fb_dev, fb_off_dev[:-1], lengths[slow], new_offsets[slow], result)
        return DeviceText(new_offsets, result[: int(new_offsets[-1])], invalid, m, down, up)

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
