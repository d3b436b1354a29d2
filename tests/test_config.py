import dataclasses

import pytest

from gpu_dedup.config import Config, LSHConfig, MinHashConfig, preset_names
from gpu_dedup.errors import ConfigError


def test_defaults_and_derived_layout():
    cfg = Config()
    assert cfg.layout == (16, 8)  # threshold 0.8, 128 permutations, recall-weighted
    assert cfg.verify_threshold == 0.8
    assert cfg.signature_perms == 128
    assert dataclasses.is_dataclass(cfg) and cfg.__dataclass_params__.frozen


def test_yaml_keys_equal_field_names_round_trip(tmp_path):
    cfg = Config().with_overrides({"lsh.threshold": 0.7, "minhash.shingle": "char", "minhash.ngram": 9})
    path = tmp_path / "c.yaml"
    path.write_text(cfg.to_yaml())
    assert Config.from_yaml(path) == cfg


def test_unknown_key_lists_valid_ones():
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"lsh": {"treshold": 0.5}})
    msg = str(err.value)
    assert "'lsh.treshold'" in msg and "threshold, bands, rows, star_rounds, fp_weight, fn_weight" in msg
    with pytest.raises(ConfigError, match="valid keys: backend, exact_dedup, input"):
        Config.from_dict({"bakend": "cpu"})


def test_every_unknown_key_is_named_at_once_with_what_it_likely_meant(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("bakend: cpu\nlsh:\n  treshold: 0.7\n  band: 4\nminhash:\n  num_perms: 64\nminhsh:\n  ngram: 3\n")
    with pytest.raises(ConfigError) as err:
        Config.from_yaml(path)
    msg = str(err.value)
    for wrong, meant in (("bakend", "backend"), ("lsh.treshold", "lsh.threshold"), ("lsh.band", "lsh.bands"),
                         ("minhash.num_perms", "minhash.num_perm"), ("minhsh.ngram", "minhash.ngram")):
        assert f"{wrong!r} (did you mean {meant!r}?)" in msg
    assert "in 'lsh': threshold, bands" in msg and "in 'minhash': num_perm" in msg
    with pytest.raises(ConfigError, match=r"'threshold' \(did you mean 'lsh.threshold'\?\)"):
        Config.from_dict({"threshold": 0.7})  # a setting of a section, given at the top level
    with pytest.raises(ConfigError) as err:  # --set keys go through the same check
        Config().with_overrides({"lsj.threshold": 0.5, "minhash.num_perms": 3, "verify.method": "exact"})
    assert "'lsj.threshold' (did you mean 'lsh.threshold'?)" in str(err.value)
    assert "'minhash.num_perms' (did you mean 'minhash.num_perm'?)" in str(err.value)


def test_wrong_types_and_values_are_named():
    with pytest.raises(ConfigError, match=r"minhash.num_perm = 'many' has the wrong type; expected int"):
        Config.from_dict({"minhash": {"num_perm": "many"}})
    with pytest.raises(ConfigError, match=r"lsh.threshold = 1.5 must be in \(0, 1\]"):
        LSHConfig(threshold=1.5)
    with pytest.raises(ConfigError, match="lsh.threshold = 0.0"):
        LSHConfig(threshold=0.0)
    with pytest.raises(ConfigError, match=r"minhash.ngram = 0 must be in \[1, 1024\]"):
        MinHashConfig(ngram=0)
    with pytest.raises(ConfigError, match=r"minhash.num_perm = 100000 must be in \[1, 1024\]"):
        MinHashConfig(num_perm=100000)
    with pytest.raises(ConfigError, match="choose one of word, char"):
        MinHashConfig(shingle="token")
    with pytest.raises(ConfigError, match="exceeds minhash.num_perm = 64"):
        Config.from_dict({"minhash": {"num_perm": 64}, "lsh": {"bands": 10, "rows": 8}})
    with pytest.raises(ConfigError, match="num_perm = 128 is not a multiple of lsh.rows = 10, so lsh.bands cannot be derived; use num_perm = 130"):
        Config.from_dict({"lsh": {"rows": 10}})
    with pytest.raises(ConfigError, match=r"lsh.bands = 0 must be in \[1, 1024\]"):
        LSHConfig(bands=0)
    assert Config.from_dict({"lsh": {"threshold": "1e-1"}}).lsh.threshold == 0.1  # YAML 1.1 reads 1e-1 as a string
    with pytest.raises(ConfigError, match="needs select.score_column"):
        Config.from_dict({"select": {"keep": "score"}})


def test_presets_mirror_published_recipes():
    assert {"default", "fineweb", "nemo_curator"} <= set(preset_names())
    fw = Config.from_yaml("fineweb")
    assert (fw.minhash.shingle, fw.minhash.ngram, fw.layout, fw.minhash.num_perm) == ("word", 5, (14, 8), 112)
    nc = Config.from_yaml("nemo_curator")
    assert (nc.minhash.shingle, nc.minhash.ngram, nc.layout, nc.minhash.hash_bits) == ("char", 24, (20, 13), 32)
    assert Config.from_yaml("default") == Config()


def test_missing_config_file_names_presets():
    with pytest.raises(ConfigError, match="does not exist; give a YAML path or a preset name"):
        Config.from_yaml("no/such/file.yaml")


def test_fingerprint_ignores_backend_but_not_parameters():
    a = Config()
    assert a.fingerprint == a.with_overrides({"backend": "cpu"}).fingerprint
    assert a.fingerprint != a.with_overrides({"minhash.seed": 1}).fingerprint


def test_one_of_bands_rows_completes_the_other():
    assert Config.from_dict({"lsh": {"rows": 8}}).layout == (16, 8)
    assert Config.from_dict({"minhash": {"num_perm": 260}, "lsh": {"bands": 20}}).layout == (20, 13)


def test_exact_verification_avoids_unused_permutations():
    cfg = Config.from_dict({"minhash": {"num_perm": 128}, "lsh": {"bands": 10, "rows": 10}})
    assert cfg.signature_perms == 100
    sig = cfg.with_overrides({"verify.method": "signature"})
    assert sig.signature_perms == 128


def test_removed_hash_bits_key_explains_itself(tmp_path):
    """minhash.hash_bits is gone (signature values are always 32-bit, hash family v2): an old config that
    still sets it gets the problem, the value and the fix, from YAML, a dict or an override."""
    p = tmp_path / "old.yaml"
    p.write_text("minhash:\n  num_perm: 64\n  hash_bits: 64\n")
    for make in (lambda: Config.from_yaml(p), lambda: Config.from_dict({"minhash": {"hash_bits": 32}}),
                 lambda: Config().with_overrides({"minhash.hash_bits": 64})):
        with pytest.raises(ConfigError, match=r"minhash\.hash_bits = (64|32) is no longer a setting.*32-bit.*delete"):
            make()
    assert Config().minhash.hash_bits == 32 and "hash_bits" not in Config().to_dict()["minhash"]


def test_top_level_choice_errors_name_the_key_without_a_leading_dot():
    for key, value in (("backend", "tpu"), ("similarity", "euclid")):
        with pytest.raises(ConfigError) as exc:
            Config.from_dict({key: value})
        assert str(exc.value).startswith(f"{key} = {value!r} is not valid; choose one of")


def test_numpy_scalars_are_accepted_as_numbers_and_stored_as_python_numbers():
    np = pytest.importorskip("numpy")
    cfg = Config.from_dict({"lsh": {"threshold": np.float32(0.75)}, "minhash": {"num_perm": np.int64(64)}})
    assert cfg.minhash.num_perm == 64 and type(cfg.minhash.num_perm) is int
    assert type(cfg.lsh.threshold) is float and abs(cfg.lsh.threshold - 0.75) < 1e-7
    assert cfg.fingerprint == Config.from_dict({"lsh": {"threshold": float(np.float32(0.75))},
                                                "minhash": {"num_perm": 64}}).fingerprint
    with pytest.raises(ConfigError, match="wrong type; expected int"):
        Config.from_dict({"minhash": {"num_perm": np.bool_(True)}})
    with pytest.raises(ConfigError, match="wrong type; expected int"):
        Config.from_dict({"minhash": {"num_perm": np.float64(64.0)}})


def test_yaml_merge_keys_still_load_and_a_size_field_of_another_type_says_what_to_write(tmp_path):
    from gpu_dedup.config import Config
    from gpu_dedup.errors import ConfigError

    (tmp_path / "c.yaml").write_text("lsh: &l\n  threshold: 0.7\nverify:\n  <<: {threshold: 0.75}\n  method: exact\n")
    cfg = Config.from_yaml(tmp_path / "c.yaml")
    assert cfg.lsh.threshold == 0.7 and cfg.verify.threshold == 0.75
    import pytest

    with pytest.raises(ConfigError, match=r"cluster.memory_limit = 0.5 has the wrong type; expected str \(a size per "
                                          r"worker such as 4GiB, or auto\)"):
        Config().with_overrides({"cluster.memory_limit": 0.5})


def test_spill_texts_is_true_false_or_auto():
    import pytest

    from gpu_dedup.config import Config
    from gpu_dedup.errors import ConfigError

    assert Config().cluster.spill_texts == "auto"
    for value in (True, False, "auto"):
        assert Config().with_overrides({"cluster.spill_texts": value}).cluster.spill_texts == value
    assert Config.from_dict({"cluster": {"spill_texts": False}}).cluster.spill_texts is False
    with pytest.raises(ConfigError, match=r"cluster.spill_texts = 'sometimes' must be true, false or auto"):
        Config().with_overrides({"cluster.spill_texts": "sometimes"})
    with pytest.raises(ConfigError, match=r"cluster.spill_texts = 2 has the wrong type; expected bool or str "
                                          r"\(true, false or auto\)"):
        Config().with_overrides({"cluster.spill_texts": 2})


def test_cluster_thresholds_are_integers_at_least_zero_and_say_what_zero_means():
    import pytest

    from gpu_dedup.config import Config
    from gpu_dedup.errors import ConfigError

    c = Config().cluster
    assert (c.small_route_rows, c.components_gathered_edges) == (1_000_000, 2_000_000)
    assert Config().with_overrides({"cluster.small_route_rows": 0}).cluster.small_route_rows == 0
    with pytest.raises(ConfigError, match=r"cluster.small_route_rows = -1 must be an integer >= 0 \(0: a route's "
                                          r"pieces always taken out of their cuts by a task first\)"):
        Config().with_overrides({"cluster.small_route_rows": -1})
    with pytest.raises(ConfigError, match=r"cluster.components_gathered_edges = -5 must be an integer >= 0 \(0: "
                                          r"always the distributed large-star / small-star rounds\)"):
        Config().with_overrides({"cluster.components_gathered_edges": -5})


def test_workers_per_gpu_shares_gpus_among_local_gpu_workers_and_refuses_nonsense():
    """cluster.workers_per_gpu: Dask-CUDA workers sharing each GPU of a local cluster; every combination that
    cannot mean that is one error naming the settings and the fix."""
    cfg = Config.from_dict({"backend": "gpu", "cluster": {"workers": 4, "workers_per_gpu": 2}})
    assert (cfg.cluster.workers, cfg.cluster.workers_per_gpu) == (4, 2)
    assert Config().cluster.workers_per_gpu == 1
    bad = [
        ({"backend": "gpu", "cluster": {"workers_per_gpu": 0}}, r"cluster.workers_per_gpu = 0 must be an integer >= 1"),
        ({"backend": "gpu", "cluster": {"workers_per_gpu": True}}, r"cluster.workers_per_gpu = True"),
        ({"backend": "gpu", "cluster": {"workers": 3, "workers_per_gpu": 2}},
         r"cluster.workers = 3 is not a multiple of cluster.workers_per_gpu = 2: .*use --workers 2"),
        ({"backend": "gpu", "cluster": {"workers": 2, "workers_per_gpu": 4}},
         r"cluster.workers = 2 is not a multiple of cluster.workers_per_gpu = 4: .*use --workers 4"),
        ({"backend": "cpu", "cluster": {"workers": 2, "workers_per_gpu": 2}},
         r"cluster.workers_per_gpu = 2 shares each GPU among Dask-CUDA workers, but backend is 'cpu': use --backend gpu"),
        ({"backend": "auto", "cluster": {"workers": 2, "workers_per_gpu": 2}}, r"but backend is 'auto'"),
        ({"backend": "gpu", "cluster": {"scheduler": "tcp://head:8786", "workers_per_gpu": 2}},
         r"cluster.workers_per_gpu = 2 shares the GPUs among the workers of a local cluster, but cluster.scheduler"),
    ]
    for data, message in bad:
        with pytest.raises(ConfigError, match=message):
            Config.from_dict(data)


def test_device_shuffle_device_memory_limit_and_rmm_async_are_checked():
    c = Config.from_dict({"cluster": {"shuffle": "device", "device_memory_limit": "20GiB", "rmm_async": True}}).cluster
    assert (c.shuffle, c.device_memory_limit, c.rmm_async) == ("device", "20GiB", True)
    assert Config().cluster.device_memory_limit == "auto" and Config().cluster.rmm_async is False
    with pytest.raises(ConfigError, match=r"cluster.shuffle = 'gpu' must be null \(automatic\), p2p, tasks or device"):
        Config().with_overrides({"cluster.shuffle": "gpu"})
    for value in ("lots", "0B", "-1GiB"):
        with pytest.raises(ConfigError, match=rf"cluster.device_memory_limit = {value!r} is not a size above 0; write "
                                              r"e.g. 20GiB \(per GPU worker\), or auto"):
            Config().with_overrides({"cluster.device_memory_limit": value})
    with pytest.raises(ConfigError, match=r"cluster.device_memory_limit = 5 has the wrong type; expected str \(a size "
                                          r"per GPU worker such as 20GiB, or auto\)"):
        Config().with_overrides({"cluster.device_memory_limit": 5})
    with pytest.raises(ConfigError, match=r"cluster.rmm_async"):
        Config().with_overrides({"cluster.rmm_async": "yes"})


def test_a_fixed_layout_used_far_below_its_threshold_is_named_with_the_fix():
    """A preset fixes (bands, rows) for its own threshold: with --threshold 0.5, nemo_curator's 20 x 13 finds a pair
    at 0.5 with probability 0.0024.  The run says so, and how to derive a layout for 0.5; a derived layout, or a
    fixed one at its own threshold, says nothing."""
    nc = Config.from_yaml("nemo_curator")
    assert nc.layout_warning is None
    low = nc.with_overrides({"lsh.threshold": 0.5})
    assert low.layout_warning is not None
    assert "20 x 13" in low.layout_warning and "probability 0.0024" in low.layout_warning
    assert "--set lsh.bands=null --set lsh.rows=null" in low.layout_warning
    fixed = low.with_overrides({"lsh.bands": None, "lsh.rows": None})
    assert fixed.layout_warning is None and fixed.layout == (53, 4)  # derived for 0.5 from its 260 permutations
    assert Config().with_overrides({"lsh.threshold": 0.5}).layout_warning is None
    assert Config.from_yaml("fineweb").with_overrides({"lsh.threshold": 0.5}).layout_warning is not None


def test_the_default_preset_spells_out_every_key():
    """README: configs/default.yaml spells out the keys. It lacked the cosine section, similarity,
    input.vector_column and four cluster keys; every setting of the tree is there, at its default."""
    import yaml

    from gpu_dedup.config import _leaf_keys, _presets_dir

    def leaves(d, prefix=""):
        out = []
        for k, v in d.items():
            out += leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else [f"{prefix}{k}"]
        return out

    data = yaml.safe_load((_presets_dir() / "default.yaml").read_text())
    assert sorted(leaves(data)) == sorted(_leaf_keys(Config))
    assert Config.from_yaml("default") == Config()


@pytest.mark.parametrize("key", ["cluster.memory_limit", "gpu.memory_limit", "cluster.device_memory_limit"])
@pytest.mark.parametrize("size", ["infGiB", "1e400", "1e300TiB", "-infGiB"])
def test_an_infinite_size_is_a_config_error_not_an_overflow(key, size):
    """``--set gpu.memory_limit=1e400`` (or ``infGiB``) ended in ``OverflowError: cannot convert float infinity to
    integer``, exit 1 with a traceback: the size parser turned the number into an int unchecked."""
    with pytest.raises(ConfigError, match=rf"{key} = '{size}' is not a size"):
        Config().with_overrides({key: size})


@pytest.mark.parametrize("key", ["lsh.fp_weight", "lsh.fn_weight"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), ".nan", ".inf"])
def test_a_nan_or_infinite_layout_weight_is_refused_instead_of_a_one_by_one_layout(key, value, capsys):
    """``--set lsh.fp_weight=.nan`` (or ``.inf``) was accepted: every area under the S-curve was NaN and the derived
    layout 1 band x 1 row, which makes nearly every pair of documents a candidate (and, with verify.method none,
    a duplicate)."""
    from gpu_dedup.cli import main

    if isinstance(value, str):
        assert main(["config", "--set", f"{key}={value}"]) == 2
        err = capsys.readouterr().err
        assert f"{key} = " in err and "must be a finite number >= 0" in err and "Traceback" not in err
        return
    with pytest.raises(ConfigError, match=rf"{key} = (nan|inf) must be a finite number >= 0"):
        Config().with_overrides({key: value})
    assert Config().with_overrides({key: 10.0}).layout != (1, 1)  # large finite weights still derive a layout


def test_a_config_built_directly_checks_its_types_like_a_yaml_one():
    """``gpu_dedup.Config(...)`` in a notebook skipped the YAML type checks: ``Config(lsh={"threshold": 0.7})`` was an
    AttributeError ('dict' object has no attribute 'bands'), ``MinHashConfig(num_perm="128")`` a TypeError from the
    range check, and ``Config(exact_dedup="no")`` was accepted, a truthy string that ran exact dedup."""
    import numpy as np

    from gpu_dedup.config import NormalizeConfig

    cfg = Config(lsh={"threshold": 0.7}, minhash={"num_perm": np.int64(64)})
    assert cfg == Config.from_dict({"lsh": {"threshold": 0.7}, "minhash": {"num_perm": 64}})
    assert type(cfg.minhash.num_perm) is int and isinstance(cfg.lsh, LSHConfig)
    with pytest.raises(ConfigError, match=r"exact_dedup = 'no' has the wrong type; expected bool"):
        Config(exact_dedup="no")
    with pytest.raises(ConfigError, match=r"minhash.num_perm = '128' has the wrong type; expected int"):
        MinHashConfig(num_perm="128")
    with pytest.raises(ConfigError, match=r"minhash.num_perm = 1.5 has the wrong type; expected int"):
        Config(minhash=MinHashConfig(num_perm=1.5))
    with pytest.raises(ConfigError, match=r"backend = 1 has the wrong type; expected str"):
        Config(backend=1)
    with pytest.raises(ConfigError, match=r"'lsh.treshold' \(did you mean 'lsh.threshold'\?\)"):
        Config(lsh={"treshold": 0.7})
    with pytest.raises(ConfigError, match=r"lsh = 0.7 must be a LSHConfig or a dict of its keys"):
        Config(lsh=0.7)
    assert NormalizeConfig(lowercase=np.bool_(False)).lowercase is False


def test_a_vector_column_under_jaccard_is_a_config_error(tmp_path, capsys):
    """``run --vector-column emb`` (or ``dedup(df, vector_column="emb")``) without ``--similarity cosine`` ended in
    ``AttributeError: 'Jaccard' object has no attribute 'load_vectors'``, exit 1 with a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_dedup.cli import main

    with pytest.raises(ConfigError, match=r"input.vector_column = 'emb' holds embeddings for similarity cosine, but "
                                          r"similarity is 'jaccard'.*--similarity cosine"):
        Config.from_dict({"input": {"vector_column": "emb"}})
    assert Config.from_dict({"similarity": "cosine", "lsh": {"threshold": 0.9},
                             "input": {"vector_column": "emb"}}).input.vector_column == "emb"
    pq.write_table(pa.table({"text": ["a b c", "a b c"], "emb": [[1.0, 2.0], [1.0, 2.0]]}), tmp_path / "v.parquet")
    assert main(["run", str(tmp_path / "v.parquet"), "-o", str(tmp_path / "out"), "--backend", "cpu",
                 "--vector-column", "emb"]) == 2
    err = capsys.readouterr().err
    assert "input.vector_column = 'emb'" in err and "Traceback" not in err and not (tmp_path / "out").exists()


ODD_VALUES = [None, True, False, 0, -1, 1, 3, 64, 2**64, 10**30, 0.0, -0.0, 0.5, 1.0, 1.5, 1e-300, 1e308,
              float("nan"), float("inf"), -float("inf"), "", "abc", "auto", "1e-3", "infGiB", "nanGiB", "1e400", "12GiB",
              "-5GiB", [], [1], {}, {"a": 1}]


def test_any_value_for_any_key_is_a_config_or_a_config_error():
    """Hypothesis: every key of the config set to odd values (wrong types, NaN, infinity, negatives, huge numbers, a
    size of infinity), one to three at once: the config is built and its derived values (layout, fingerprint,
    warnings) compute, or one ConfigError; nothing else (an OverflowError, a TypeError and a 1 x 1 layout were)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from gpu_dedup.config import _leaf_keys

    keys = _leaf_keys(Config)

    @settings(max_examples=1000, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.dictionaries(st.sampled_from(keys), st.sampled_from(ODD_VALUES), min_size=1, max_size=3))
    def check(overrides):
        try:
            cfg = Config().with_overrides(overrides)
        except ConfigError as exc:
            assert "\n" not in str(exc)
            return
        if cfg.similarity == "jaccard":
            b, r = cfg.layout
            assert b * r <= cfg.minhash.num_perm
            if cfg.lsh.bands is None and cfg.lsh.rows is None and cfg.minhash.num_perm >= 16:
                assert (b, r) != (1, 1), overrides  # a derived layout is never one band of one row at 0.8
        else:
            b, r = cfg.cosine_layout
            assert b * r <= cfg.cosine.bits
        assert cfg.fingerprint and cfg.layout_warning is None or isinstance(cfg.layout_warning, str)
        assert Config.from_dict(cfg.to_dict()) == cfg

    check()
