import sys, time, glob, json
import numpy as np, pyarrow.parquet as pq, pyarrow as pa
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.stages import vectors, projections
files = sorted(glob.glob("/work/corpora/text-100000-s0-16shards/part-*.parquet"))
texts = pa.concat_arrays([pq.read_table(f, columns=["text"]).column(0).combine_chunks() for f in files])
buf = string_buffers(texts)
vectors.document_frequencies(string_buffers(texts[:100]), "word", 3, 20)
vectors.term_vectors(string_buffers(texts[:100]), "word", 3, None)
projections.text_signatures(string_buffers(texts[:100]), 1024, 42, "word", 3, None)
t0 = time.perf_counter()
df, n = vectors.document_frequencies(buf, "word", 3, 20)
t1 = time.perf_counter()
idf = vectors.idf_table(df, n, 20)
sig = projections.text_signatures(buf, 1024, 42, "word", 3, idf)
t2 = time.perf_counter()
tv = vectors.term_vectors(buf, "word", 3, idf)
t3 = time.perf_counter()
dfc = vectors.document_frequencies(buf, "char", 5, 20)
t4 = time.perf_counter()
print(json.dumps({"arm": sys.argv[1], "df_word3": round(t1-t0, 3), "simhash": round(t2-t1, 3), "term_vectors_word3": round(t3-t2, 3), "df_char5": round(t4-t3, 3),
                  "sig_sum": int(sig.bits.sum() % 1000003), "tv": [int(tv.features.sum() % 1000003), float(tv.norms.sum())]}))
