"""CPU backend: Numba kernels (``gpu_dedup.kernels.hash_cpu``), NumPy arrays, SciPy graphs."""

from __future__ import annotations

import numba
import numpy as np

from gpu_dedup.backends import Backend
from gpu_dedup.backends.pages import small_pages
from gpu_dedup.backends.prepare import prepare as prepare_kernels
from gpu_dedup.backends.strings import RawText, StringBuffers, raw_arrow, string_buffers
from gpu_dedup.backends.textnorm import normalize_counted
from gpu_dedup.kernels import cosine_cpu as ck
from gpu_dedup.kernels.cosine_scalar import GAUSS8
from gpu_dedup.kernels.params import HashParams
from gpu_dedup.kernels.text_cpu import compact_left

FEATURE_GROUP = 1 << 22  # feature occurrences hashed and reduced at a time (64 MiB of them and their counts)


def balanced_tasks(lengths: np.ndarray, per_thread: int = 16) -> np.ndarray:
    """Split documents with these byte lengths into contiguous chunks of similar
    total bytes; returns chunk boundaries (int64, starts with 0, ends with n)."""
    n = lengths.shape[0]
    if n == 0:
        return np.zeros(1, np.int64)
    chunks = min(n, max(1, numba.get_num_threads() * per_thread))
    cum = np.cumsum(lengths.astype(np.int64) + 32)  # +32: per-document overhead
    cuts = np.searchsorted(cum, np.linspace(0, cum[-1], chunks + 1)[1:-1], side="right")
    return np.unique(np.concatenate(([0], cuts, [n]))).astype(np.int64)


def signature_values(sig) -> np.ndarray:
    """``sig`` as a C-contiguous uint32 matrix (signature values of hash family v2 are 32-bit)."""
    sig = np.asarray(sig)
    if sig.dtype != np.uint32:
        if sig.size and (sig.min() < 0 or sig.max() > 0xFFFFFFFF):
            raise ValueError(f"signature values must be 32-bit (hash family v2), got {sig.dtype} values up to "
                             f"{sig.max()}; recompute the signatures with this version")
        sig = sig.astype(np.uint32)
    return np.ascontiguousarray(sig)


class CPUBackend(Backend):
    name = "cpu"
    normalizes_while_reading = True  # each batch of text normalized as the read stage reads it

    def __init__(self):
        from gpu_dedup.kernels import hash_cpu as kernels

        self.k = kernels
        self.xp = np

    @property
    def mode(self) -> str:
        return f"cpu: numba kernels on {numba.get_num_threads()} threads, pyarrow/numpy frames"

    def prepare(self, cfg) -> float:
        """Load (or, the first time after install, compile) exactly the kernels a run with ``cfg`` calls;
        logs once when something compiles.  Returns the seconds spent (see ``backends/prepare.py``)."""
        seconds, _ = prepare_kernels(self, cfg)
        return seconds

    @staticmethod
    def normalize_column(column, cfg):
        """Normalized texts of a string column as host :class:`StringBuffers`, and the number of
        documents with ill-formed UTF-8 (the GPU backend's ``normalize_column`` on the host)."""
        if isinstance(column, RawText):
            column = raw_arrow(column)
        norm, invalid = normalize_counted(column, cfg)
        return string_buffers(norm), invalid

    @staticmethod
    def _select(strings: StringBuffers, docs):
        if docs is None:
            docs = np.arange(len(strings), dtype=np.int64)
        docs = np.ascontiguousarray(docs, dtype=np.int64)
        lengths = strings.offsets[docs + 1] - strings.offsets[docs]
        return docs, balanced_tasks(lengths)

    @staticmethod
    def _shingle_args(params: HashParams, shingle: str, ngram: int):
        return (
            shingle == "word",
            np.int64(ngram),
            np.uint64(params.shingle_base),
            np.uint64(params.shingle_base_pow(ngram)),
            np.uint64(params.word_base),
            np.uint64(params.word_base2),
        )

    def minhash(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, num_perm=None, docs=None):
        """Signatures (len(docs) x num_perm, uint32) and shingle counts of the selected documents."""
        num_perm = params.num_perm if num_perm is None else num_perm
        docs, tasks = self._select(strings, docs)
        out = np.empty((docs.shape[0], num_perm), np.uint32)
        counts = np.empty(docs.shape[0], np.int64)
        kernel = self.k.minhash_word if shingle == "word" else self.k.minhash_char
        kernel(strings.offsets, strings.data, docs, tasks, *self._shingle_args(params, shingle, ngram)[1:],
               params.a[:num_perm], params.b[:num_perm], out, counts)
        return out, counts

    def shingle_sets(self, strings: StringBuffers, params: HashParams, shingle: str, ngram: int, docs=None):
        """Sorted distinct shingle values of each selected document, as CSR (offsets, values).

        One pass hashes, sorts and deduplicates: each task of documents writes its sets one after another
        into its share of a buffer sized for every document's most possible values (``shingle_room``; the
        pages past what a task writes are never touched), then the tasks' runs are moved together in place."""
        docs, tasks = self._select(strings, docs)
        args = self._shingle_args(params, shingle, ngram)[1:]
        word = shingle == "word"
        kernel = self.k.shingle_values_word if word else self.k.shingle_values_char
        m = docs.shape[0]
        room = np.zeros(m + 1, np.int64)
        np.cumsum(self.k.shingle_room(strings.offsets[docs + 1] - strings.offsets[docs], word), out=room[1:])
        raw = small_pages(int(room[-1]), np.uint64)  # written in order, a task's share each
        counts = np.empty(m, np.int64)
        written = np.empty(tasks.shape[0] - 1, np.int64)
        kernel(strings.offsets, strings.data, docs, tasks, *args, room, raw, counts, written)
        offsets = np.zeros(m + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        compact_left(raw, room[tasks[:-1]], written, offsets[tasks[:-1]])  # the tasks' runs, together
        return offsets, raw[: int(offsets[-1])]

    def jaccard_pairs(self, set_offsets, set_values, left, right) -> np.ndarray:
        out = np.empty(len(left), np.float64)
        self.k.jaccard_pairs(set_offsets, set_values, np.asarray(left, np.int64), np.asarray(right, np.int64), out)
        return out

    def signature_similarity(self, sig, left, right) -> np.ndarray:
        out = np.empty(len(left), np.float64)
        self.k.signature_similarity(sig, np.asarray(left, np.int64), np.asarray(right, np.int64), out)
        return out

    def band_hashes(self, sig, bands: int, rows: int, band_base: int) -> np.ndarray:
        """One 64-bit hash per band of ``rows`` uint32 signature values: (n, bands) uint64."""
        out = np.empty((sig.shape[0], bands), np.uint64)
        self.k.band_hashes(signature_values(sig), np.int64(bands), np.int64(rows), np.uint64(band_base), out)
        return out

    def exact_hashes(self, strings: StringBuffers, seed1: int, seed2: int) -> np.ndarray:
        """Two 64-bit lanes of the exact-duplicate key of every document: (n, 2) uint64."""
        out = np.empty((len(strings), 2), np.uint64)
        self.k.exact_hashes(strings.offsets, strings.data, np.uint64(seed1), np.uint64(seed2), out)
        return out

    # ---- cosine (random projections): kernels/cosine_cpu.py
    @staticmethod
    def simhash_text(strings: StringBuffers, docs, bits: int, key: int, word_mode: bool, ngram: int, use_idf: bool,
                     table, shift):
        """SimHash words (len(docs), bits / 64) and feature occurrences of texts ``docs``."""
        docs = np.ascontiguousarray(docs, np.int64)
        out = np.zeros((docs.shape[0], bits // 64), np.uint64)
        count = np.zeros(docs.shape[0], np.int64)
        ck.simhash_docs(strings.offsets, strings.data, docs, ck.tasks_for(strings.offsets, docs), word_mode,
                        int(ngram), np.uint64(key), use_idf, table, shift, GAUSS8, out, count)
        return out, count

    @staticmethod
    def text_features(strings: StringBuffers, docs, word_mode: bool, ngram: int):
        """Sorted distinct feature hashes (rule 6) of texts ``docs`` with their counts, as CSR (offsets int64,
        features uint64, tf int64)."""
        docs = np.ascontiguousarray(docs, np.int64)
        n = docs.shape[0]
        occ = np.zeros(n + 1, np.int64)
        ck.feature_occurrences(strings.offsets, strings.data, docs, ck.tasks_for(strings.offsets, docs), word_mode,
                               int(ngram), occ[1:])
        np.cumsum(occ, out=occ)
        # Hashed and reduced a group of documents at a time (about FEATURE_GROUP occurrences), each group's
        # distinct features appended to arrays sized for every occurrence: only the distinct prefix is ever
        # written, so memory holds the distinct features plus one group's occurrences.
        feat = np.empty(int(occ[-1]), np.uint64)
        tf = np.empty(int(occ[-1]), np.int64)
        offsets = np.zeros(n + 1, np.int64)
        cuts = np.searchsorted(occ, np.arange(FEATURE_GROUP, int(occ[-1]), FEATURE_GROUP), side="right") - 1
        done = 0
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, n]):  # a few groups, not per document
            if hi <= lo:
                continue
            group = docs[lo:hi]
            g_occ = occ[lo:hi + 1] - occ[lo]
            alone = lo == 0 and hi == n  # one group: reduced in the output arrays themselves
            g_feat, g_tf = (feat, tf) if alone else (np.empty(int(g_occ[-1]), np.uint64), np.empty(int(g_occ[-1]), np.int64))
            distinct = np.zeros(hi - lo + 1, np.int64)
            ck.feature_sets(strings.offsets, strings.data, group, ck.tasks_for(strings.offsets, group), word_mode,
                            int(ngram), g_occ, g_feat, g_tf, distinct[1:])
            np.cumsum(distinct, out=distinct)
            ck.compact_sets(g_occ, distinct, g_feat, g_tf)
            c = int(distinct[-1])
            if not alone:
                feat[done:done + c] = g_feat[:c]
                tf[done:done + c] = g_tf[:c]
            offsets[lo + 1:hi + 1] = done + distinct[1:]
            done += c
        feat, tf = feat[:done], tf[:done]
        return offsets, feat, tf

    @staticmethod
    def sparse_norms(offsets, features, weights) -> np.ndarray:
        """L2 norms (rule 8, sparse) of CSR term vectors."""
        out = np.empty(offsets.shape[0] - 1, np.float64)
        ck.sparse_norms(offsets, features, weights, out)
        return out

    @staticmethod
    def sparse_cosine_pairs(offsets, features, weights, norms, left, right) -> np.ndarray:
        """Exact cosine (rule 8, sparse) of CSR rows ``left[p]`` and ``right[p]``."""
        left = np.ascontiguousarray(left, np.int64)
        right = np.ascontiguousarray(right, np.int64)
        out = np.empty(left.shape[0], np.float64)
        ck.sparse_cosine_pairs(offsets, features, weights, norms, left, right, out)
        return out

    @staticmethod
    def row_norms(vectors) -> np.ndarray:
        x = np.ascontiguousarray(vectors, dtype=np.float32)
        out = np.empty(x.shape[0], np.float64)
        ck.row_norms(x, out)
        return out

    @staticmethod
    def cosine_pairs(vectors, norms, left, right) -> np.ndarray:
        left = np.ascontiguousarray(left, np.int64)
        right = np.ascontiguousarray(right, np.int64)
        out = np.empty(left.shape[0], np.float64)
        ck.cosine_pairs(np.ascontiguousarray(vectors, dtype=np.float32), np.ascontiguousarray(norms), left, right, out)
        return out

    @staticmethod
    def hamming_pairs(bits, left, right) -> np.ndarray:
        left = np.ascontiguousarray(left, np.int64)
        right = np.ascontiguousarray(right, np.int64)
        out = np.empty(left.shape[0], np.int64)
        ck.hamming_pairs(np.ascontiguousarray(bits), left, right, out)
        return out

    def components(self, src, dst, n: int) -> np.ndarray:
        """Connected components; label = smallest node index in the component."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        if n == 0:
            return np.zeros(0, np.int64)
        graph = coo_matrix((np.ones(len(src), np.int8), (src, dst)), shape=(n, n)).tocsr()
        _, labels = connected_components(graph, directed=False)
        # scipy numbers components 0..k-1; the first index holding label c is its smallest node
        _, first = np.unique(labels, return_index=True)
        return first.astype(np.int64)[labels]


def create() -> CPUBackend:
    return CPUBackend()
