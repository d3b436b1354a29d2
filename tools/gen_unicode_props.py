"""Generate ``kernels/unicode_props.py``: which code points the normalization kernel handles alone.

Run from the repository root (a maintainer tool; not part of the installed package)::

    pip install unicodedata2==17.0.1        # Unicode 17.0.0, the version pyarrow 26's utf8proc implements
    python tools/gen_unicode_props.py       # needs Python 3.11 (its unicodedata is Unicode 14.0.0)

The kernel (``kernels/text_scalar.py``) normalizes a document by itself only when every
code point of it is *stable* for the configured form: the form maps the code
point to itself and it can never compose with or reorder against a neighbour
that is stable too.  Everything else goes through utf8proc (pyarrow), which
stays the definition.  Stable for a form F (NFC, NFKC, NFD, NFKD) means:

* assigned in Unicode 17.0.0 *and* in the baseline 14.0.0, with the same
  canonical combining class and the same decomposition in both (so the table
  agrees with every utf8proc that pyarrow >= 15 bundles; code points assigned
  since 14.0, and unassigned ones, always take the utf8proc path);
* canonical combining class 0, and F(c) == c in both versions;
* the first code point of c's full decomposition (canonical for NFC/NFD,
  compatibility for NFKC/NFKD) has combining class 0;
* for NFC and NFKC: neither c nor that first code point is the second code point
  of any canonical pair decomposition, nor a Hangul medial vowel or final
  consonant jamo (the algorithmic compositions): nothing can compose onto it.

A code point that F maps to one stable code point (F(c) = c2, the same in both
versions, c2 not longer in UTF-8: NBSP and the fullwidth forms under NFKC, the
CJK compatibility ideographs, ...) is listed in ``F_MAP``: c and c2 have the
same full decomposition, so the kernel replaces c by c2 and goes on.

A string of stable code points is its own F-normalization: decomposition leaves
a starter at every code point's start, so nothing reorders across them, and
composition can only rebuild each code point, since nothing composes onto a
starter that begins a code point.  The tests check this against pyarrow for
every code point alone and between neighbours, and on random strings.

The lowercase mapping is pyarrow's ``utf8_lower`` (utf8proc's simple,
context-free mapping), probed for every code point; a code point keeps the
``LOWER`` bit only when Python 3.11's ``str.lower`` (Unicode 14.0.0) agrees
(U+0130, whose ``str.lower`` is the special casing "i" + U+0307, is taken with
its simple mapping U+0069, the one UnicodeData.txt gives in every version) and
the lowercase is not longer in UTF-8 (so the kernel never writes past a
document's own room).
"""

from __future__ import annotations

import sys
import unicodedata as ud14
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import unicodedata2 as ud17

VERSION = "17.0.0"
BASELINE = "14.0.0"
FORMS = ("NFC", "NFKC", "NFD", "NFKD")
OUT = Path(__file__).resolve().parent.parent / "kernels" / "unicode_props.py"


def _decomp_cps(db, cp):
    d = db.decomposition(chr(cp))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def _second_elements():
    second = set(range(0x1161, 0x1176)) | set(range(0x11A8, 0x11C3))  # Hangul V and T jamo
    for db in (ud14, ud17):
        for cp in range(0x110000):
            d = _decomp_cps(db, cp)
            if d is not None and len(d) == 2:
                second.add(d[1])
    return second


def _ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return [tuple(r) for r in out]


def main() -> int:
    if ud14.unidata_version != BASELINE or ud17.unidata_version != VERSION:
        print(f"need Python's unicodedata {BASELINE} (Python 3.11) and unicodedata2 {VERSION} "
              f"(pip install unicodedata2==17.0.1); have {ud14.unidata_version} and {ud17.unidata_version}")
        return 2
    if pc.utf8_lower(pa.array(["\ua7ce"])).to_pylist()[0] != "\ua7cf":  # a case pair new in Unicode 17.0
        print("the installed pyarrow's utf8proc is not at Unicode 17.0.0; install pyarrow 26")
        return 2
    cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    lower17 = pc.utf8_lower(pa.array([chr(cp) for cp in cps], pa.large_string())).to_pylist()
    second = _second_elements()
    stable = {f: set() for f in FORMS}
    consistent = []
    lower_ok = set()
    lower_pairs = []
    for cp, low in zip(cps, lower17):
        c = chr(cp)
        assigned = ud14.category(c) != "Cn" and ud17.category(c) != "Cn"
        if not assigned:
            continue
        if len(low) != 1:
            continue
        if ord(low) != cp:
            lower_pairs.append((cp, ord(low)))
        l14 = c.lower()
        same_lower = l14 == low or (cp == 0x130 and low == "i")
        if same_lower and len(low.encode()) <= len(c.encode()):
            lower_ok.add(cp)
        if ud14.combining(c) != ud17.combining(c) or ud14.decomposition(c) != ud17.decomposition(c):
            continue
        consistent.append(cp)
        if ud17.combining(c) != 0:
            continue
        for f in FORMS:
            if ud17.normalize(f, c) != c or ud14.normalize(f, c) != c:
                continue
            first = ud17.normalize("NFKD" if "K" in f else "NFD", c)[0]
            if ud17.combining(first) != 0:
                continue
            if f in ("NFC", "NFKC") and (cp in second or ord(first) in second):
                continue
            stable[f].add(cp)
    # singleton mappings: F(c) is one stable code point c2 (and F(c) agrees in both versions).  Then
    # c and c2 have the same full decomposition, so replacing c by c2 leaves F of any string alone
    maps = {f: [] for f in FORMS}
    for cp in consistent:
        c = chr(cp)
        for f in FORMS:
            if cp in stable[f]:
                continue
            t = ud17.normalize(f, c)
            if (len(t) == 1 and t == ud14.normalize(f, c) and ord(t) in stable[f]
                    and len(t.encode()) <= len(c.encode())):
                maps[f].append((cp, ord(t)))
    lines = [
        '"""Per-code-point properties of the normalization kernel (GENERATED: do not edit).',
        "",
        "Written by ``tools/gen_unicode_props.py`` (read it for the definitions) from",
        f"Unicode {VERSION} (unicodedata2 and pyarrow's utf8proc) and the baseline Unicode",
        f"{BASELINE} (Python 3.11's unicodedata).  Ranges are inclusive.",
        '"""',
        "",
        f'UNICODE_VERSION = "{VERSION}"',
        f'BASELINE_VERSION = "{BASELINE}"',
        "",
        "# (code point, its lowercase) for every code point utf8_lower changes (Unicode 17.0.0)",
        "LOWER_PAIRS = (",
    ]
    for i in range(0, len(lower_pairs), 6):
        lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X})," for a, b in lower_pairs[i : i + 6]))
    lines.append(")")

    def emit(name, comment, cps_):
        lines.append("")
        lines.append(f"# {comment}")
        lines.append(f"{name} = (")
        rs = _ranges(cps_)
        for i in range(0, len(rs), 6):
            lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X})," for a, b in rs[i : i + 6]))
        lines.append(")")

    emit("LOWER_STABLE", "code points whose lowercase the kernel takes from LOWER_PAIRS (see the generator)", lower_ok)
    for f in FORMS:
        emit(f"{f}_STABLE", f"code points stable under {f} (see the generator)", stable[f])
    for f in FORMS:
        lines.append("")
        lines.append(f"# (code point, the one stable code point {f} maps it to) (see the generator)")
        lines.append(f"{f}_MAP = (")
        for i in range(0, len(maps[f]), 6):
            lines.append("    " + " ".join(f"(0x{a:X}, 0x{b:X})," for a, b in maps[f][i : i + 6]))
        lines.append(")")
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {OUT}: {len(lower_pairs)} lowercase pairs, lower-stable {len(lower_ok)}, "
          + ", ".join(f"{f} {len(stable[f])} (+{len(maps[f])} mapped)" for f in FORMS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
