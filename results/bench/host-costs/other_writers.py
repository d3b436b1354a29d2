"""The page reader (gpu_dedup.storage.pages.take_pages) against pyarrow's whole read, on Parquet files written by
polars, DuckDB and fastparquet (not gpu_dedup's dependencies: install them somewhere and set WRITERS_PATH)."""
import sys, os, itertools, numpy as np, pyarrow as pa, pyarrow.parquet as pq
sys.path.append(os.environ.get("WRITERS_PATH", ""))  # where polars, duckdb and fastparquet are installed
import polars as pl, duckdb, fastparquet, pandas as pd
from gpu_dedup.storage.pages import take_pages
rng = np.random.default_rng(0)
words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "", "zeta eta"]
n = 20000
texts = [" ".join(rng.choice(words, rng.integers(0, 80))) + f" {i}" for i in range(n)]
for i in rng.choice(n, 500, replace=False): texts[i] = None
rows = np.concatenate([rng.integers(0, n, 40), [0, n - 1, 5, 5]])
d = sys.argv[1] if len(sys.argv) > 1 else "writers"; os.makedirs(d, exist_ok=True)
files = []
df = pl.DataFrame({"id": np.arange(n), "text": texts})
for comp, stats, rg in itertools.product(["snappy", "zstd", "lz4", "gzip", "uncompressed", "brotli"], [True, False], [None, 3000]):
    p = f"{d}/polars-{comp}-{stats}-{rg}.parquet"; df.write_parquet(p, compression=comp, statistics=stats, row_group_size=rg, data_page_size=4096); files.append(p)
con = duckdb.connect()
con.register("t", df.to_arrow())
for comp in ["snappy", "zstd", "gzip", "uncompressed", "lz4", "brotli"]:
    for ver in ["V1", "V2"]:
        p = f"{d}/duckdb-{comp}-{ver}.parquet"
        con.execute(f"COPY t TO '{p}' (FORMAT parquet, COMPRESSION {comp}, ROW_GROUP_SIZE 7000, PARQUET_VERSION {ver})"); files.append(p)
pdf = pd.DataFrame({"id": np.arange(n), "text": texts})
for comp in ["SNAPPY", "GZIP", "ZSTD", None]:
    for enc in ["utf8", "infer"]:
        p = f"{d}/fastparquet-{comp}-{enc}.parquet"
        fastparquet.write(p, pdf, compression=comp, row_group_offsets=6000, stats=True, object_encoding=enc)
        files.append(p)
bad = 0
for p in files:
    got = take_pages(p, "text", rows)
    want = pq.read_table(p, columns=["text"]).column(0).combine_chunks().take(pa.array(rows))
    ok = got is not None and got.cast(pa.large_string()).to_pylist() == want.cast(pa.large_string()).to_pylist()
    if not ok: bad += 1
    print("ok " if ok else "BAD", "None" if got is None else "", os.path.basename(p), pq.ParquetFile(p).metadata.created_by[:40])
print("bad", bad, "of", len(files))
