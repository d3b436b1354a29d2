"""Normalize text before hashing: Unicode form, case, punctuation, whitespace.

The definition (``kernels/text_scalar.py``): ill-formed UTF-8 becomes U+FFFD per
maximal subpart, then utf8proc's Unicode form (``pyarrow.compute.utf8_normalize``)
and lowercase (``utf8_lower``), then punctuation removal (category P, the
pinned table of ``kernels/unicode_tables.py``) and whitespace collapsing (the
code points of ``str.isspace``).

One kernel (``kernels.text_scalar.normalize_text``, the same source compiled for the
CPU by ``kernels/text_cpu.py`` and for CUDA in ``kernels/hash_cuda.py``) does all of
it in one pass for every document whose code points are all *stable* under the
configured form (ASCII and most real text; see ``tools/gen_unicode_props.py``).
Only the other documents take the slow path: repaired, sent through utf8proc,
then through the same kernel with the Unicode steps off.  The written shards
keep the original bytes.  The host code lives in ``gpu_dedup.backends.textnorm``
(the GPU backend's ``normalize`` falls back on it); this module is the stage's
public face.
"""

from gpu_dedup.backends.textnorm import (
    clean,
    normalize,
    normalize_counted,
    raw_buffers,
    repair_utf8,
)

__all__ = ["normalize", "normalize_counted", "repair_utf8", "clean", "raw_buffers"]
