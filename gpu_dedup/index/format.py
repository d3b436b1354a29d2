"""The on-disk format of an index: manifest, segments, fingerprints (see :mod:`gpu_dedup.index.store`)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError

FORMAT = "gpu_dedup-index"
FORMAT_VERSION = 2  # 2: hash family v2 (kernels/params.py HASH_FAMILY); the manifest names the family
MANIFEST = "manifest.json"
SEGMENT_FILES = ("docs.arrow", "bands.arrow", "centers.arrow")


def segment_name(k: int) -> str:
    """The directory of segment ``k`` (0: the one a build writes)."""
    return f"seg-{k:05d}"



def index_config(cfg: Config, layout: tuple[int, int] | None = None) -> dict:
    """What an index's hashes and matching depend on.  Cosine: ``layout`` is the (bands, rows) of the
    run that builds the index (default: ``cosine.bands`` / ``cosine.rows`` when both are given, else None)."""
    d = cfg.to_dict()
    if cfg.similarity != "cosine":
        bands, rows = cfg.layout
        return {"normalize": d["normalize"], "minhash": d["minhash"], "bands": bands, "rows": rows}
    if layout is None and cfg.cosine.bands is not None and cfg.cosine.rows is not None:
        layout = (cfg.cosine.bands, cfg.cosine.rows)
    c = d["cosine"]
    text = cfg.input.vector_column is None
    out = {"similarity": "cosine", "source": "text" if text else "vectors",
           "cosine": {"bits": c["bits"], "seed": c["seed"], **({"text": c["text"]} if text else {})},
           "bands": layout[0] if layout else None, "rows": layout[1] if layout else None}
    if text:
        out["normalize"] = d["normalize"]
    return out


def index_fingerprint(cfg: Config, layout: tuple[int, int] | None = None) -> str:
    return fingerprint_of(index_config(cfg, layout))


def fingerprint_of(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


def index_similarity(manifest: dict) -> str:
    """The similarity family of an index (indexes written before cosine existed are Jaccard)."""
    return manifest.get("similarity", "jaccard")


class IndexMismatchError(ConfigError):
    """The configuration does not match the one the index was built with."""


@dataclass
class Segment:
    name: str
    docs: pa.Table
    band_hash: np.ndarray
    band_doc: np.ndarray
    band_start: np.ndarray  # offsets of each band's run, length bands + 1
    centre_hash: np.ndarray
    centre_round: np.ndarray
    centre_doc: np.ndarray
    centre_start: np.ndarray
    first_doc: int

    @property
    def n(self) -> int:
        return self.docs.num_rows


def write_ipc(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 16)


def read_ipc(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()



def same_kind(a: pa.DataType, b: pa.DataType) -> bool:
    """Both string, both binary or both integer types (ids that differ only in width)."""
    kinds = (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
             lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), pa.types.is_integer)
    return any(k(a) and k(b) for k in kinds)



def is_index_manifest(path: Path) -> bool:
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def check_indexable(cfg: Config) -> None:
    """An index needs signatures that do not depend on the corpus: not tf-idf weights of the text."""
    if cfg.similarity == "cosine" and cfg.input.vector_column is None and cfg.cosine.text.weighting == "tfidf":
        raise ConfigError("an index of cosine vectors built from the text needs cosine.text.weighting: tf (tf-idf "
                          "weights depend on the documents of each run, so later signatures would not match); "
                          "--set cosine.text.weighting=tf, or index a vector column (--vector-column)")

