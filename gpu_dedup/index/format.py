"""The on-disk format of an index: manifest, segments, fingerprints (see :mod:`gpu_dedup.index.store`)."""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError
from gpu_dedup.storage import file_digest

FORMAT = "gpu_dedup-index"
FORMAT_VERSION = 2  # 2: hash family v2 (kernels/params.py HASH_FAMILY); the manifest names the family
MANIFEST = "manifest.json"
SEGMENT_FILES = ("docs.arrow", "bands.arrow", "centers.arrow")
LOCK = ".gpu_dedup_index.lock"  # held (flock) by the one process that writes the index
MANIFEST_DIGEST = "manifest_sha256"  # SHA-256 of the manifest's other keys (canonical JSON)
CHECKSUMS = "checksums"  # segment -> file -> {"size", "sha256"}, recorded when the segment was written
SOURCES = "sources"  # segment -> run fingerprint of the inputs and config that appended it
SPLIT_CHAINS = "split_chains"  # select.split_chains of the runs that decided the index's documents (absent: an
# index written before it was recorded; its first append records it)
VERIFY_THRESHOLD = "verify_threshold"  # the threshold the index's documents were verified (removed) at: the
# runs' verify.threshold, or lsh.threshold where that is null (absent: an index written before it was recorded,
# whose lsh.threshold, ``threshold``, stands for it; its first append records it)
# Other settings that decide which documents are removed, recorded like split_chains (absent: an index written
# before they were recorded, run against with a warning; its first append records them): manifest key ->
# (dotted setting, its values).  A run with another value would decide its documents by other candidates
# (star_rounds: the index replays the centres its own rounds chose) or another similarity estimate (verify.method)
# than the index's documents were decided by (tools/index_settings_experiment.py).
RECORDED = {"star_rounds": ("lsh.star_rounds", int), "verify_method": ("verify.method", str)}
SEGMENT_NAME = re.compile(r"seg-\d{5}")


def segment_name(k: int) -> str:
    """The directory of segment ``k`` (0: the one a build writes)."""
    return f"seg-{k:05d}"


def manifest_digest(manifest: dict) -> str:
    """SHA-256 of a manifest's keys other than its own digest (canonical JSON)."""
    body = {k: v for k, v in manifest.items() if k != MANIFEST_DIGEST}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def sealed(manifest: dict) -> dict:
    """``manifest`` with its digest (what is written)."""
    return {**manifest, MANIFEST_DIGEST: manifest_digest(manifest)}


def _int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_manifest(manifest: dict) -> None:
    """Raise ValueError naming what is wrong with a manifest that is not whole: a key missing or of the
    wrong type, a digest that does not match its contents (edited or damaged after it was written), a
    fingerprint that does not match its config, an unknown segment name."""
    for key in ("fingerprint", "documents", "segments", "config"):
        if key not in manifest:
            raise ValueError(f"missing {key!r}")
    if MANIFEST_DIGEST in manifest and manifest[MANIFEST_DIGEST] != manifest_digest(manifest):
        raise ValueError(f"{MANIFEST} was changed after gpu_dedup wrote it: its checksum does not match")
    config, segments = manifest["config"], manifest["segments"]
    if not isinstance(config, dict) or not _int(config.get("bands")) or not _int(config.get("rows")):
        raise ValueError("its config is not a mapping with integer bands and rows")
    if manifest["fingerprint"] != fingerprint_of(config):
        raise ValueError("its config does not match its fingerprint")
    if not _int(manifest["documents"]) or manifest["documents"] < 0:
        raise ValueError(f"documents = {manifest['documents']!r} is not a count")
    if not isinstance(segments, list) or len(set(map(str, segments))) != len(segments) or not all(
            isinstance(name, str) and SEGMENT_NAME.fullmatch(name) for name in segments):
        raise ValueError(f"segments = {str(segments)[:80]} is not a list of distinct seg-NNNNN names")
    for key in ("id_column", "vector_column"):
        if manifest.get(key) is not None and not isinstance(manifest[key], str):
            raise ValueError(f"{key} = {manifest[key]!r} is not a column name")
    for key, (_, kind) in RECORDED.items():
        if key in manifest and (isinstance(manifest[key], bool) or not isinstance(manifest[key], kind)):
            raise ValueError(f"{key} = {manifest[key]!r} is not a{'n integer' if kind is int else ' name'}")
    if SPLIT_CHAINS in manifest and not isinstance(manifest[SPLIT_CHAINS], bool):
        raise ValueError(f"{SPLIT_CHAINS} = {manifest[SPLIT_CHAINS]!r} is not true or false")
    for key in ("threshold", VERIFY_THRESHOLD):
        t = manifest.get(key, 0.5)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 1:
            raise ValueError(f"{key} = {t!r} is not a number in (0, 1]")
    sums = manifest.get(CHECKSUMS, {})
    if not isinstance(sums, dict) or not all(
            isinstance(files, dict) and set(files) == set(SEGMENT_FILES) and all(
                isinstance(r, dict) and _int(r.get("size")) and isinstance(r.get("sha256"), str)
                for r in files.values()) for files in sums.values()):
        raise ValueError(f"its {CHECKSUMS} are not a size and SHA-256 per segment file")
    if not isinstance(manifest.get(SOURCES, {}), dict):
        raise ValueError(f"its {SOURCES} are not a mapping")


def verify_file(path: Path, recorded: dict, digest: bool = True) -> None:
    """Raise ValueError when a segment file's size (and, with ``digest``, SHA-256) differ from those
    recorded at write."""
    size = os.path.getsize(path)
    if size != recorded["size"]:
        raise ValueError(f"{path.parent.name}/{path.name} holds {size} bytes, {recorded['size']} were written")
    if digest and file_digest(path)["sha256"] != recorded["sha256"]:
        raise ValueError(f"{path.parent.name}/{path.name} changed after it was written (its SHA-256 differs from "
                         "the one recorded in the manifest)")



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

