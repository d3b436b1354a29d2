"""Config of similarity: cosine (the cosine section, input.vector_column)."""

import pytest

from gpu_dedup.config import Config, CosineConfig, InputConfig, TextVectorConfig
from gpu_dedup.curves import cosine_layout, cosine_min_rows
from gpu_dedup.errors import ConfigError


def test_defaults_keep_jaccard_and_round_trip(tmp_path):
    cfg = Config()
    assert cfg.similarity == "jaccard" and cfg.input.vector_column is None
    assert cfg.cosine == CosineConfig() and cfg.cosine.text == TextVectorConfig()
    c = Config.from_dict({"similarity": "cosine", "input": {"vector_column": "emb"}, "lsh": {"threshold": 0.9},
                          "cosine": {"bits": 512, "text": {"shingle": "char", "ngram": 5, "weighting": "tf"}}})
    path = tmp_path / "c.yaml"
    path.write_text(c.to_yaml())
    assert Config.from_yaml(path) == c
    assert c.with_overrides({"cosine.text.ngram": 7}).cosine.text.ngram == 7
    assert c.fingerprint != c.with_overrides({"cosine.seed": 1}).fingerprint


def test_layout_derived_completed_or_given():
    c = Config.from_dict({"similarity": "cosine", "lsh": {"threshold": 0.9}, "cosine": {"bits": 256}})
    assert c.cosine_layout == cosine_layout(0.9, 256) == (19, 13)
    k = cosine_min_rows(100_000)
    m, r = c.cosine_layout_for(100_000)
    assert r >= k and m * r <= 256 and (m, r) == cosine_layout(0.9, 256, min_rows=k)
    assert Config.from_dict({"cosine": {"bits": 256, "min_rows": 16}}).cosine_layout[1] >= 16
    assert Config.from_dict({"cosine": {"bits": 256, "rows": 20}}).cosine_layout == (12, 20)
    assert Config.from_dict({"cosine": {"bits": 256, "bands": 10}}).cosine_layout == (10, 25)
    assert Config.from_dict({"cosine": {"bits": 256, "bands": 10, "rows": 16}}).cosine_layout_for(10**6) == (10, 16)


@pytest.mark.parametrize("data,match", [
    ({"similarity": "euclid"}, "similarity = 'euclid' is not valid; choose one of jaccard, cosine"),
    ({"cosine": {"bits": 100}}, r"cosine.bits = 100 must be a multiple of 64 in \[64, 4096\]"),
    ({"cosine": {"bits": 8192}}, "cosine.bits = 8192 must be a multiple of 64"),
    ({"cosine": {"rows": 65}}, r"cosine.rows = 65 must be in \[1, 64\]"),
    ({"cosine": {"rows": 0}}, r"cosine.rows = 0 must be in \[1, 64\]"),
    ({"cosine": {"bands": 0}}, "cosine.bands = 0 must be >= 1"),
    ({"cosine": {"bits": 256, "bands": 2}}, "leaves cosine.bits // bands = 128 bits per band, over 64"),
    ({"cosine": {"bits": 128, "bands": 9, "rows": 15}}, "cosine.bands \\* cosine.rows = 9 \\* 15 = 135 exceeds"),
    ({"cosine": {"min_rows": 70}}, r"cosine.min_rows = 70 must be in \[1, 64\]"),
    ({"cosine": {"seed": -1}}, r"cosine.seed = -1 must be in \[0, 2\*\*64\)"),
    ({"cosine": {"bad_vectors": "drop"}}, "cosine.bad_vectors = 'drop' is not valid; choose one of error, keep"),
    ({"cosine": {"text": {"ngram": 0}}}, r"cosine.text.ngram = 0 must be in \[1, 64\]"),
    ({"cosine": {"text": {"weighting": "bm25"}}}, "choose one of tf, tfidf"),
    ({"cosine": {"text": {"shingle": "token"}}}, "cosine.text.shingle = 'token' is not valid"),
    ({"cosine": {"text": {"idf_bits": 40}}}, r"cosine.text.idf_bits = 40 must be in \[8, 28\]"),
    ({"cosine": {"texts": {}}}, "unknown config key.*'cosine.texts'"),
    ({"input": {"vector_column": ""}}, "input.vector_column is empty"),
    ({"similarity": "cosine", "lsh": {"threshold": 1.0}}, r"lsh.threshold = 1.0 must be in \(0, 1\) as a cosine"),
])
def test_bounds_name_the_problem_value_and_fix(data, match):
    with pytest.raises(ConfigError, match=match):
        Config.from_dict(data)


def test_jaccard_threshold_one_still_allowed():
    assert Config.from_dict({"lsh": {"threshold": 1.0}}).lsh.threshold == 1.0
    assert InputConfig(vector_column="emb").vector_column == "emb"
