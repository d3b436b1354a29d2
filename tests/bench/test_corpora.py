"""The benchmarks' corpora: planted shards and their near copies, reused by their marker."""

import json
import logging

from gpu_dedup.bench import corpora
from gpu_dedup.storage import discover


def test_a_corpus_folder_is_read_without_a_warning_and_reused(tmp_path, caplog):
    path, payload, rows = corpora.planted_dir(tmp_path, 60, shards=2, log=lambda *a: None)
    copies, copy_payload, copy_rows = corpora.replicated_dir(path, 3, log=lambda *a: None)
    assert rows == 60 and copy_rows == 180 and copy_payload > 3 * payload
    for folder, shards in ((path, 2), (copies, 6)):
        with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
            found = discover(str(folder))
        assert len(found) == shards and caplog.text == ""  # the marker is no shard behind a private name
    again = corpora.planted_dir(tmp_path, 60, shards=2, log=lambda *a: (_ for _ in ()).throw(AssertionError(a)))
    assert again == (path, payload, rows)  # found by its marker, not written again


def test_a_marker_under_its_former_name_is_renamed_and_the_corpus_reused(tmp_path):
    path, payload, rows = corpora.planted_dir(tmp_path, 40, shards=2, log=lambda *a: None)
    (path / corpora.MARKER).rename(path / corpora.LEGACY_MARKER)
    assert corpora.planted_dir(tmp_path, 40, shards=2, log=lambda *a: None) == (path, payload, rows)
    assert json.loads((path / corpora.MARKER).read_text())["rows"] == 40
    assert not (path / corpora.LEGACY_MARKER).exists()
