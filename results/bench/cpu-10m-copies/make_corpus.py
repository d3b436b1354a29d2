"""10^7 short documents: 10 exact copies of 10^6 distinct 8-word texts (39 bytes), 160 Parquet shards of 62,500 rows,
ids c{k}:doc-{i:07d}, copy k of text i at row k * 10^6 + i.  python make_corpus.py OUT  (3.6 s, 392 MB)"""
import os, sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

out = sys.argv[1]; os.makedirs(out, exist_ok=True)
N, K, W = 1_000_000, 10, 8
rng = np.random.default_rng(7)
vocab = rng.integers(ord('a'), ord('z') + 1, size=(5000, 4), dtype=np.uint8)
words = rng.integers(0, 5000, size=(N, W))
txt = np.full((N, W, 5), ord(' '), np.uint8)
txt[:, :, :4] = vocab[words]
txt = txt.reshape(N, W * 5)[:, :-1]  # 39 bytes
L = txt.shape[1]
def digits(v, n):
    return ((v[:, None] // 10 ** np.arange(n - 1, -1, -1)) % 10 + ord('0')).astype(np.uint8)
rows_per = 62_500
for k in range(K):
    idm = np.empty((N, 14), np.uint8)
    idm[:, 0] = ord('c'); idm[:, 1] = ord('0') + k; idm[:, 2:7] = np.frombuffer(b':doc-', np.uint8)
    idm[:, 7:] = digits(np.arange(N), 7)
    for s in range(N // rows_per):
        a, b = s * rows_per, (s + 1) * rows_per
        n = b - a
        ids = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer((np.arange(n + 1) * 14).astype(np.int32)), pa.py_buffer(idm[a:b].tobytes())])
        texts = pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer((np.arange(n + 1) * L).astype(np.int64)), pa.py_buffer(txt[a:b].tobytes())])
        pq.write_table(pa.table({"id": ids, "text": texts}), f"{out}/c{k}-part-{s:05d}.parquet", compression="snappy")
print("ok")
