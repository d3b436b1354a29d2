import time, sys
import numpy as np
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.stages import vectors, projections
b = string_buffers(["hello world foo bar", "a b c d e"])
t = time.perf_counter()
df, n = vectors.document_frequencies(b, "word", 3, 10); t1 = time.perf_counter()
idf = vectors.idf_table(df, n, 10)
projections.text_signatures(b, 1024, 42, "word", 3, idf); t2 = time.perf_counter()
vectors.term_vectors(b, "word", 3, idf); t3 = time.perf_counter()
vectors.text_status(b, "word", 3); t4 = time.perf_counter()
print(sys.argv[1], f"df {t1-t:.1f} simhash {t2-t1:.1f} tv {t3-t2:.1f} status {t4-t3:.1f}")
