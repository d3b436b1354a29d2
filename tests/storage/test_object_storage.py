"""Inputs and outputs in an object store, against a real S3 API served on 127.0.0.1 (moto's server, see
``s3server.py``): the same outputs as a local run, the output rules without rename or flock (lock object,
staged prefix, ``_SUCCESS`` last), resume, and one clear error for a missing bucket, a denied key and an
interrupted upload."""

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError, OutputError
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.storage import discover, filesystems
from gpu_dedup.storage.filesystems import RemotePath, put_bytes
from tests.footers import FooterReads, fresh_footers

CFG = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
OUTPUTS = ("duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "extra.jsonl")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two Parquet shards and a JSON Lines shard of a planted corpus, and a local run of them (the reference)."""
    d = tmp_path_factory.mktemp("corpus")
    s = planted_corpus(n_docs=600, n_clusters=60, cluster_size=(2, 4), words=(40, 120), edit_rate=(0, 0.05), seed=3)
    table = s.table.select(["id", "text"])
    write_shards(table.slice(0, 500), d / "in", shards=2)
    with open(d / "in" / "extra.jsonl", "w") as f:
        for row in table.slice(500).to_pylist():
            f.write(json.dumps(row) + "\n")
    run_dedup(d / "in", d / "local", CFG)
    return d


def _upload(server, bucket, local: Path, prefix: str) -> None:
    c = server.client()
    for p in sorted(local.rglob("*")):
        if p.is_file():
            c.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(local)}")


def _keys(server, bucket, prefix=""):
    c = server.client()
    out = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        out += [o["Key"] for o in page.get("Contents", [])]
    return sorted(out)


def _get(server, bucket, key) -> bytes:
    return server.client().get_object(Bucket=bucket, Key=key)["Body"].read()


def _same_as_local(server, bucket, prefix, local: Path) -> None:
    for name in OUTPUTS:
        assert _get(server, bucket, f"{prefix}/{name}") == (local / name).read_bytes(), name
    report = json.loads(_get(server, bucket, f"{prefix}/report.json"))
    assert report["counts"] == json.loads((local / "report.json").read_text())["counts"]
    keys = _keys(server, bucket, prefix + "/")
    names = {k[len(prefix) + 1:] for k in keys}
    # the outputs, the manifest and _SUCCESS; no lock, no staged prefix, no checkpoint left
    assert names == {*OUTPUTS, "report.json", "report.html", "_SUCCESS", ".gpu_dedup_manifest.json"}, names
    manifest = json.loads(_get(server, bucket, f"{prefix}/.gpu_dedup_manifest.json"))
    assert manifest["state"] == "complete" and _get(server, bucket, f"{prefix}/_SUCCESS") == \
        f"{manifest['fingerprint']}\n".encode()
    assert set(manifest["files"]) == {*OUTPUTS, "report.json", "report.html"}
    uploads = server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert uploads == []


def _cli(*args, fault=None, env=None):
    e = dict(os.environ, **(env or {}))
    e.pop("GPU_DEDUP_FAULT", None)
    if fault:
        e["GPU_DEDUP_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "gpu_dedup", *args], env=e, capture_output=True, text=True,
                          timeout=600)


def test_run_reads_and_writes_s3_as_a_local_run_does(s3_server, bucket, corpus):
    """A prefix of shards in, a prefix of outputs out: byte-identical to the local run; a rerun is welcome."""
    _upload(s3_server, bucket, corpus / "in", "crawl")
    proc = _cli("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out/", "--backend", "cpu", "--id-column", "id")
    assert proc.returncode == 0, proc.stderr
    assert f"outputs in s3://{bucket}/out/" in proc.stdout
    _same_as_local(s3_server, bucket, "out", corpus / "local")
    report = json.loads(_get(s3_server, bucket, "out/report.json"))
    assert [i["path"] for i in report["inputs"]] == [f"s3://{bucket}/crawl/{n}" for n in
                                                     ("extra.jsonl", "part-00000.parquet", "part-00001.parquet")]
    # the same command again: the output prefix is its own (manifest), the outputs are the same
    again = run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/out", CFG)
    assert again.report["counts"] == report["counts"]
    _same_as_local(s3_server, bucket, "out", corpus / "local")
    # a glob of objects, and a local output of remote inputs
    local = run_dedup(f"s3://{bucket}/crawl/part-*.parquet", corpus / "from-s3", CFG)
    assert [s.name for s in local.shards] == ["part-00000.parquet", "part-00001.parquet"]
    assert (corpus / "from-s3" / "_SUCCESS").exists()


def test_outputs_it_did_not_write_are_refused(s3_server, bucket, corpus):
    _upload(s3_server, bucket, corpus / "in", "crawl")
    put_bytes(f"s3://{bucket}/out/duplicates.parquet", b"someone else's")
    with pytest.raises(OutputError, match="was not written by gpu_dedup"):
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/out", CFG)
    assert _get(s3_server, bucket, "out/duplicates.parquet") == b"someone else's"
    assert _keys(s3_server, bucket, "out/") == ["out/duplicates.parquet"]  # lock released, nothing staged
    with pytest.raises(OutputError, match="inside the input prefix"):
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/crawl/out", CFG)
    with pytest.raises(OutputError, match="is an object, not a prefix"):
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/crawl/extra.jsonl", CFG)


def test_a_live_lock_object_stops_a_second_run(s3_server, bucket, corpus):
    _upload(s3_server, bucket, corpus / "in", "crawl")
    holder = {"token": "x" * 32, "pid": 1, "host": "another-machine", "started": "2026-11-26 10:00:00"}
    put_bytes(f"s3://{bucket}/out/.gpu_dedup.lock", json.dumps(holder).encode())
    proc = _cli("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out", "--backend", "cpu")
    assert proc.returncode == 4, proc.stderr
    assert "in use by another gpu-dedup run (pid 1 on another-machine" in proc.stderr
    assert f"delete the lock object 's3://{bucket}/out/.gpu_dedup.lock'" in proc.stderr
    assert _keys(s3_server, bucket, "out/") == ["out/.gpu_dedup.lock"]  # the holder's lock is left alone


def test_missing_bucket_and_denied_keys_are_one_clear_error(s3_server, bucket, corpus):
    _upload(s3_server, bucket, corpus / "in", "crawl")
    _upload(s3_server, bucket, corpus / "in", "denied")  # readable by no one but an administrator
    cases = [
        (("run", "s3://no-such-bucket-here/crawl/", "-o", str(corpus / "o1")), 3, "its bucket does not exist"),
        (("run", f"s3://{bucket}/crawl/", "-o", "s3://no-such-bucket-here/out"), 4, "its bucket does not exist"),
        (("run", f"s3://{bucket}/denied/", "-o", str(corpus / "o2")), 3, "access denied"),
        (("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/readonly/out"), 4, "access denied"),
        (("run", f"s3://{bucket}/nothing-here/", "-o", str(corpus / "o3")), 3, "does not exist"),
    ]
    for args, code, said in cases:
        proc = _cli(*args, "--backend", "cpu", "-q")
        assert proc.returncode == code, (args, proc.stderr)
        assert said in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (corpus / "o1").exists() and not (corpus / "o2").exists()
    assert _keys(s3_server, bucket, "readonly/") == []


def test_an_interrupted_upload_publishes_nothing_and_the_rerun_completes(s3_server, bucket, corpus, tmp_path):
    """A run killed in the middle of a multipart upload of a staged shard: no object at any output name, no
    _SUCCESS, nothing in the temporary directory (the shard's staging file has no name there: a 12 MB file was
    left per killed run); the same command again takes over the dead run's lock, aborts the unfinished upload,
    resumes from the checkpoints and publishes the outputs of a clean run."""
    big = tmp_path / "in"
    big.mkdir()
    import numpy as np

    words = np.array([f"w{i:05d}x" for i in range(20000)])
    picks = np.random.default_rng(7).integers(0, 20000, (24000, 60))
    with open(big / "big.jsonl", "w") as f:  # 12 MB of unrelated lines: three 5 MiB parts when written back
        for i in range(24000):
            f.write(json.dumps({"id": i, "text": " ".join(words[picks[i]])}) + "\n")
    _upload(s3_server, bucket, big, "crawl")
    args = ("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out", "--backend", "cpu", "--id-column", "id")
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {"GPU_DEDUP_PART_BYTES": str(5 << 20), "TMPDIR": str(temp)}
    killed = _cli(*args, fault="upload:part", env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [p.name for p in temp.iterdir() if p.name.startswith(".gpu-dedup-upload.")] == []
    keys = _keys(s3_server, bucket, "out/")
    assert "out/_SUCCESS" not in keys and "out/big.jsonl" not in keys and "out/.gpu_dedup_checkpoint/staged/big.jsonl" \
        not in keys
    assert "out/.gpu_dedup.lock" in keys  # the killed run's
    uploads = s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == ["out/.gpu_dedup_checkpoint/staged/big.jsonl"]
    again = _cli(*args, env=env)
    assert again.returncode == 0, again.stderr
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    report = json.loads(_get(s3_server, bucket, "out/report.json"))
    assert report["resumed_from_checkpoint"]  # the stages before the write were not computed again
    clean = run_dedup(big, tmp_path / "clean", CFG)
    assert _get(s3_server, bucket, "out/big.jsonl") == (tmp_path / "clean" / "big.jsonl").read_bytes()
    assert _get(s3_server, bucket, "out/duplicates.parquet") == (tmp_path / "clean" / "duplicates.parquet").read_bytes()
    assert report["counts"] == clean.report["counts"]
    assert "out/.gpu_dedup.lock" not in _keys(s3_server, bucket, "out/")


def test_a_run_killed_in_its_commit_is_finished_by_the_next(s3_server, bucket, corpus):
    _upload(s3_server, bucket, corpus / "in", "crawl")
    args = ("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out", "--backend", "cpu", "--id-column", "id")
    killed = _cli(*args, fault="commit:renamed")
    assert killed.returncode == -signal.SIGKILL
    keys = _keys(s3_server, bucket, "out/")
    assert "out/_SUCCESS" not in keys and any(k.startswith("out/.gpu_dedup_checkpoint/staged/") for k in keys)
    assert json.loads(_get(s3_server, bucket, "out/.gpu_dedup_manifest.json"))["state"] == "committing"
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    _same_as_local(s3_server, bucket, "out", corpus / "local")


def test_a_failing_upload_is_aborted_and_leaves_no_object(s3_server, bucket, monkeypatch):
    """The second part of a multipart upload fails (a dropped connection): one OutputError, no object, no
    parts left behind."""
    fs, _ = filesystems.filesystem(f"s3://{bucket}/x")
    calls = []
    real = fs.call_s3  # what a multipart upload's parts go through

    def flaky(method, *args, **kwargs):
        if method == "upload_part":
            calls.append(kwargs.get("PartNumber"))
            if kwargs.get("PartNumber") == 2:
                raise ConnectionResetError(104, "Connection reset by peer")
        return real(method, *args, **kwargs)

    monkeypatch.setattr(fs, "call_s3", flaky)
    with pytest.raises(OutputError, match="upload of .* failed .*nothing was published"):
        put_bytes(f"s3://{bucket}/x/big.bin", os.urandom(11 << 20), part_size=5 << 20)
    monkeypatch.undo()
    assert 2 in calls
    assert _keys(s3_server, bucket) == []
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_run_reads_each_footer_in_the_store_once(s3_server, bucket, corpus, monkeypatch, tmp_path):
    """Sizes, the read, the report's samples and the write share one footer read of each Parquet object."""
    import s3fs

    _upload(s3_server, bucket, corpus / "in", "crawl")
    fresh_footers(monkeypatch)
    reads = FooterReads(monkeypatch, f"s3://{bucket}/crawl")
    gets = collections.Counter()
    call = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        if method == "get_object":
            gets[kwargs.get("Key")] += 1
        return await call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    run_dedup(f"s3://{bucket}/crawl/", tmp_path / "out", CFG)
    for name in OUTPUTS[:3]:
        assert (tmp_path / "out" / name).read_bytes() == (corpus / "local" / name).read_bytes(), name
    parquet_keys = [f"{bucket}/crawl/part-0000{k}.parquet" for k in range(2)]
    assert dict(reads.by_path) == dict.fromkeys(parquet_keys, 1)
    # the footer, then the column chunks (2 GETs with this s3fs); 6 when every reader read the footer again
    assert all(gets[key.split("/", 1)[1]] <= 3 for key in parquet_keys), gets


def test_dask_workers_read_and_write_the_store(s3_server, bucket, corpus):
    pytest.importorskip("distributed")
    _upload(s3_server, bucket, corpus / "in", "crawl")
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "cluster": {"workers": 2}})
    run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/dask", cfg)
    _same_as_local(s3_server, bucket, "dask", corpus / "local")


def test_remote_paths_join_and_compare_as_paths_do():
    p = RemotePath("s3://bkt/out/")  # one trailing slash: the prefix (keys are exact, see test_filesystems.py)
    assert str(p) == "s3://bkt/out" and str(p / "a/b.parquet") == "s3://bkt/out/a/b.parquet"
    assert (p / "x").parent == p and (p / "x.npz").stem == "x" and p.name == "out"
    assert filesystems.is_url("gs://b/k") and not filesystems.is_url("/tmp/x") and not filesystems.is_url("file:///x")
    assert not filesystems.is_url(Path("s3:/x"))
    assert filesystems.as_path("file:///tmp/x") == Path("/tmp/x")


def test_what_cannot_be_in_a_store_is_refused(s3_server, bucket, corpus):
    with pytest.raises(OutputError, match="read-only"):
        run_dedup(corpus / "in", "https://example.invalid/out", CFG)
    proc = _cli("evaluate", str(corpus / "in"), "-o", f"s3://{bucket}/eval", "--sample", "0", "--no-plot")
    assert proc.returncode == 4 and "must be a local directory" in proc.stderr, proc.stderr
    with pytest.raises(ConfigError, match="GPU_DEDUP_PART_BYTES"):
        os.environ["GPU_DEDUP_PART_BYTES"] = "1000"
        try:
            put_bytes(f"s3://{bucket}/y", b"x")
        finally:
            del os.environ["GPU_DEDUP_PART_BYTES"]


def test_discovery_of_prefixes_skips_private_names(s3_server, bucket):
    for key in ("c/a.parquet", "c/sub/b.jsonl", "c/_SUCCESS", "c/.hidden/x.parquet", "c/_tmp/y.parquet",
                "c/notes.txt"):
        put_bytes(f"s3://{bucket}/{key}", b"{}\n" if key.endswith("jsonl") else b"PAR1")
    shards = discover(f"s3://{bucket}/c/")
    assert [(s.name, s.format) for s in shards] == [("a.parquet", "parquet"), ("sub/b.jsonl", "jsonl")]
    assert shards[0].path == f"s3://{bucket}/c/a.parquet" and shards[0].size == 4 and shards[0].identity
    with pytest.raises(InputError, match="matches no objects"):
        discover(f"s3://{bucket}/c/*.csv")


def test_local_paths_never_touch_fsspec(tmp_path, monkeypatch):
    """The local code path stays as it was: no URL layer call for local inputs and outputs."""
    monkeypatch.setattr(filesystems, "filesystem", lambda url: (_ for _ in ()).throw(AssertionError(url)))
    write_shards(planted_corpus(n_docs=100, n_clusters=10, seed=1).table.select(["id", "text"]), tmp_path / "in", 2)
    run_dedup(tmp_path / "in", tmp_path / "out", CFG)
    assert (tmp_path / "out" / "_SUCCESS").exists()


def test_an_index_in_the_store_is_built_used_updated_and_queried(s3_server, bucket, corpus, tmp_path, monkeypatch):
    """--index-out URL, --against URL --update-index, query URL and index info URL give what the same commands
    give with a local index; the store's index is read through a local copy."""
    from gpu_dedup.run.entry import run_dedup as index_run

    monkeypatch.setenv("GPU_DEDUP_CACHE", str(tmp_path / "cache"))
    first, second = tmp_path / "first", tmp_path / "second"
    write_shards(pq.read_table(corpus / "in" / "part-00000.parquet"), first, shards=1)
    write_shards(pq.read_table(corpus / "in" / "part-00001.parquet"), second, shards=1)
    url = f"s3://{bucket}/ix"
    index_run(first, tmp_path / "o1", CFG, index_out=url)
    index_run(first, tmp_path / "l1", CFG, index_out=tmp_path / "local-ix")
    assert sorted(k.split("/", 1)[1] for k in _keys(s3_server, bucket, "ix/")) == \
        ["manifest.json", "seg-00000/bands.arrow", "seg-00000/centers.arrow", "seg-00000/docs.arrow"]
    with pytest.raises(InputError, match="an index already exists"):  # of other inputs
        index_run(second, tmp_path / "o1b", CFG, index_out=url)
    keys = _keys(s3_server, bucket, "ix/")
    index_run(first, tmp_path / "o1c", CFG, index_out=url)  # the same build again: found built, not built again
    assert _keys(s3_server, bucket, "ix/") == keys
    remote = index_run(second, tmp_path / "o2", CFG, against=url, update_index=True)
    local = index_run(second, tmp_path / "l2", CFG, against=tmp_path / "local-ix", update_index=True)
    assert (tmp_path / "o2" / "duplicates.parquet").read_bytes() == (tmp_path / "l2" / "duplicates.parquet").read_bytes()
    assert remote.report["counts"] == local.report["counts"] and remote.report["counts"]["removed_against_index"] > 0
    manifest = json.loads(_get(s3_server, bucket, "ix/manifest.json"))
    assert manifest["segments"] == ["seg-00000", "seg-00001"] and manifest["documents"] == 500
    queries = "\n".join(pq.read_table(second / "part-00000.parquet").column("text").to_pylist()[:5]) + "\n"
    env = {"GPU_DEDUP_CACHE": str(tmp_path / "cache2")}  # a fresh copy, downloaded by the query
    q_remote = subprocess.run([sys.executable, "-m", "gpu_dedup", "query", url, "-q"], input=queries, text=True,
                              capture_output=True, env=dict(os.environ, **env), timeout=600)
    q_local = subprocess.run([sys.executable, "-m", "gpu_dedup", "query", str(tmp_path / "local-ix"), "-q"],
                             input=queries, text=True, capture_output=True, timeout=600)
    assert q_remote.returncode == 0, q_remote.stderr
    assert q_remote.stdout == q_local.stdout and q_remote.stdout.count("\n") == 5
    info = _cli("index", "info", url, env=env)
    assert info.returncode == 0 and json.loads(info.stdout)["path"] == url and json.loads(info.stdout)["documents"] == 500
    # another run appended meanwhile: this one refuses to publish a manifest without it
    from gpu_dedup.index.remote import open_index

    third = tmp_path / "third"  # new documents (appending the same inputs again is taken for a rerun)
    import pyarrow.json as pajson

    write_shards(pajson.read_json(corpus / "in" / "extra.jsonl").select(["id", "text"]), third, shards=1)
    monkeypatch.setenv("GPU_DEDUP_CACHE", str(tmp_path / "other-machine"))  # its own local copy, as on another
    stale = open_index(url, CFG)  # machine (one copy shared by both would be re-read under the index's lock)
    monkeypatch.setenv("GPU_DEDUP_CACHE", str(tmp_path / "cache"))
    index_run(third, tmp_path / "o3", CFG, against=url, update_index=True)
    # a writer that takes no lock in the store (an earlier gpu_dedup) is refused before its outputs are published
    from gpu_dedup.index.remote import RemoteIndex
    from gpu_dedup.index.store import Index

    monkeypatch.setattr(RemoteIndex, "writing", Index.writing)
    with pytest.raises(OutputError, match="changed since this run opened it.*nothing was published"):
        index_run(third, tmp_path / "o4", CFG, against=stale, update_index=True)
    assert not (tmp_path / "o4" / "_SUCCESS").exists() and not (tmp_path / "o4" / "duplicates.parquet").exists()
    monkeypatch.undo()
    assert json.loads(_get(s3_server, bucket, "ix/manifest.json"))["segments"] == ["seg-00000", "seg-00001",
                                                                                    "seg-00002"]
    fresh = open_index(url, CFG)  # the refused append's local segment is not taken for the store's
    assert fresh.documents == 600
    assert (fresh.path / "seg-00002" / "docs.arrow").read_bytes() == _get(s3_server, bucket, "ix/seg-00002/docs.arrow")


def test_compressed_json_lines_in_the_store(s3_server, bucket, tmp_path):
    """A .jsonl.gz object is read and its kept lines written back, compressed, as a local run does."""
    import gzip

    rows = planted_corpus(n_docs=300, n_clusters=30, seed=4).table.select(["id", "text"]).to_pylist()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    _upload(s3_server, bucket, tmp_path / "in", "gz")
    remote = run_dedup(f"s3://{bucket}/gz/a.jsonl.gz", f"s3://{bucket}/gz-out", CFG)
    local = run_dedup(tmp_path / "in" / "a.jsonl.gz", tmp_path / "out", CFG)
    assert remote.report["counts"] == local.report["counts"] and remote.report["counts"]["removed"] > 0
    assert gzip.decompress(_get(s3_server, bucket, "gz-out/a.jsonl.gz")) == \
        gzip.decompress((tmp_path / "out" / "a.jsonl.gz").read_bytes())


def test_an_output_shard_left_empty_is_published_and_the_rerun_is_welcome(s3_server, bucket, tmp_path):
    """A JSON Lines shard whose every line is removed has an empty output object: its size 0 was taken for a
    missing size, the commit was abandoned after the first objects (no duplicates.parquet, reports or _SUCCESS)
    and the run still exited 0; a rerun then refused the empty object as changed since (exit 4)."""
    text = "the quick brown fox jumps over the lazy dog and then runs away into the forest where nobody sees it"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"id": "a", "text": text}) + "\n")
    (tmp_path / "in" / "b.jsonl").write_text(json.dumps({"id": "b", "text": text}) + "\n")  # removed: b.jsonl empty
    _upload(s3_server, bucket, tmp_path / "in", "crawl")
    for _ in range(2):  # the run, then the same command again
        proc = _cli("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out/", "--backend", "cpu", "-q")
        assert proc.returncode == 0, proc.stderr
        names = {k[len("out/"):] for k in _keys(s3_server, bucket, "out/")}
        assert names == {"a.jsonl", "b.jsonl", "duplicates.parquet", "report.json", "report.html", "_SUCCESS",
                         ".gpu_dedup_manifest.json"}, names
        assert _get(s3_server, bucket, "out/b.jsonl") == b""


def test_a_commit_that_cannot_publish_its_own_outputs_fails(s3_server, bucket, corpus, monkeypatch, caplog):
    """A staged object that does not arrive at its name (the store lost the copy): the commit is abandoned, and the
    run said "outputs in …" and exited 0 without duplicates.parquet, reports or _SUCCESS; it is now an error."""
    from gpu_dedup.run import remote_outdir

    _upload(s3_server, bucket, corpus / "in", "crawl")
    real = remote_outdir.copy
    monkeypatch.setattr(remote_outdir, "copy", lambda src, dst: None if str(dst).endswith("duplicates.parquet")
                        else real(src, dst))
    with pytest.raises(OutputError, match=r"publishing the outputs in .* failed: an output this run staged and "
                                          r"verified was gone or differed .* no _SUCCESS was written: rerun"):
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/out", CFG)
    assert "out/_SUCCESS" not in _keys(s3_server, bucket, "out/")
    assert "interrupted commit" not in caplog.text  # the run's own commit failed: no earlier run's is to blame
    monkeypatch.setattr(remote_outdir, "copy", real)
    run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/out", CFG)  # the rerun publishes everything
    _same_as_local(s3_server, bucket, "out", corpus / "local")


def test_shards_named_with_pattern_characters_are_published(s3_server, bucket, tmp_path):
    """A shard named '[x].jsonl' was read, staged and verified, then the commit's copy took its name for a pattern
    (matching 'x.jsonl', which is not there): "upload … failed …: check the network and the store", exit 4."""
    (tmp_path / "in").mkdir()
    names = ["[x].jsonl", "b?x.jsonl", "c*.jsonl", "plain.jsonl"]
    for i, name in enumerate(names):
        (tmp_path / "in" / name).write_text(json.dumps({"id": f"d{i}", "text": f"document {i} " * 8}) + "\n")
    _upload(s3_server, bucket, tmp_path / "in", "crawl")
    proc = _cli("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out/", "--backend", "cpu", "-q")
    assert proc.returncode == 0, proc.stderr
    keys = _keys(s3_server, bucket, "out/")
    assert {f"out/{n}" for n in names} | {"out/_SUCCESS", "out/duplicates.parquet"} <= set(keys), keys
    for name in names:
        assert _get(s3_server, bucket, f"out/{name}") == (tmp_path / "in" / name).read_bytes()


def test_an_earlier_runs_output_prefix_inside_the_inputs_is_never_read(s3_server, bucket, corpus):
    """``-o s3://b/crawl/sub/`` of a glob of ``crawl/``, then ``run s3://b/crawl/``: the second run read the
    first run's outputs as more shards (and failed on its duplicates.parquet).  A prefix holding a run's
    manifest is skipped by prefixes and globs, listed in report.json; named itself, its shards are read."""
    _upload(s3_server, bucket, corpus / "in", "crawl")
    proc = _cli("run", f"s3://{bucket}/crawl/*.parquet", "-o", f"s3://{bucket}/crawl/sub/", "--backend", "cpu",
                "--id-column", "id", "-q")
    assert proc.returncode == 0, proc.stderr
    for given in (f"s3://{bucket}/crawl/", f"s3://{bucket}/crawl/**/*.parquet"):
        shards = discover(given)
        assert "sub/part-00000.parquet" not in [s.name for s in shards], given
        assert [s["path"] for s in shards.skipped if "outputs of a gpu_dedup run" in s["reason"]] == \
            [f"s3://{bucket}/crawl/sub"], given
    proc = _cli("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out2/", "--backend", "cpu", "--id-column", "id")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "outputs of a gpu-dedup run" in line]
    assert len(said) == 1 and f"s3://{bucket}/crawl/sub" in said[0]
    assert _get(s3_server, bucket, "out2/duplicates.parquet") == (corpus / "local" / "duplicates.parquet").read_bytes()
    shards = discover(f"s3://{bucket}/crawl/sub/")
    assert sorted(s.name for s in shards) == ["part-00000.parquet", "part-00001.parquet"]
    with pytest.raises(InputError, match="whole path component"):  # was fsspec's ValueError: an internal error
        discover(f"s3://{bucket}/crawl/**.parquet")


def test_a_second_writer_of_an_index_in_the_store_stops_before_it_publishes_anything(s3_server, bucket, corpus,
                                                                                     tmp_path):
    """Two --update-index runs of one index in the store: the loser said "nothing was appended: rerun" (exit 4)
    after its outputs and _SUCCESS were published, deduplicated against the index without the winner's
    documents.  The index's lock object in the store now stops the second writer at once (exit 4), from this
    machine or another, before it publishes anything; the rerun adds its documents once."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_shards(pq.read_table(corpus / "in" / "part-00000.parquet"), first, shards=1)
    write_shards(pq.read_table(corpus / "in" / "part-00001.parquet"), second, shards=1)
    url = f"s3://{bucket}/ix"
    env = {"GPU_DEDUP_CACHE": str(tmp_path / "cache")}
    assert _cli("run", str(first), "-o", str(tmp_path / "o1"), "--index-out", url, "--backend", "cpu", "-q",
                env=env).returncode == 0
    holder = {"token": "y" * 32, "pid": 1, "host": "another-machine", "started": "2026-11-28 10:00:00"}
    put_bytes(f"{url}/.gpu_dedup_index.lock", json.dumps(holder).encode())  # the winner, running elsewhere
    args = ("run", str(second), "-o", f"s3://{bucket}/o2/", "--against", url, "--update-index", "--backend", "cpu",
            "-q")
    proc = _cli(*args, env=env)
    assert proc.returncode == 4, proc.stderr
    assert "is being written by another gpu-dedup run (pid 1 on another-machine" in proc.stderr
    assert f"delete the lock object '{url}/.gpu_dedup_index.lock'" in proc.stderr
    assert _keys(s3_server, bucket, "o2/") == []  # nothing published, no lock left behind
    assert json.loads(_get(s3_server, bucket, "ix/manifest.json"))["segments"] == ["seg-00000"]
    s3_server.client().delete_object(Bucket=bucket, Key="ix/.gpu_dedup_index.lock")  # the winner finished
    proc = _cli(*args, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(_get(s3_server, bucket, "ix/manifest.json"))["documents"] == 500
    assert _get(s3_server, bucket, "o2/_SUCCESS") and "ix/.gpu_dedup_index.lock" not in _keys(s3_server, bucket, "ix/")


def test_a_damaged_local_copy_of_a_healthy_index_is_copied_again(s3_server, bucket, corpus, tmp_path, monkeypatch,
                                                                 caplog):
    """The local copy of an index in the store, damaged on this machine, was called a damaged index (naming the
    cache path) and never fetched again: it is copied again, with a warning; a store's own damaged file is named
    as the store's index, with the fix."""
    import logging

    from gpu_dedup.index.remote import cache_root, open_index
    from gpu_dedup.run.entry import run_dedup as index_run

    monkeypatch.setenv("GPU_DEDUP_CACHE", str(tmp_path / "cache"))
    first = tmp_path / "first"
    write_shards(pq.read_table(corpus / "in" / "part-00000.parquet"), first, shards=1)
    url = f"s3://{bucket}/ix"
    index_run(first, tmp_path / "o1", CFG, index_out=url)
    index = open_index(url, CFG)
    want = index.query(["a text to look for"]).to_pylist()
    docs = index.path / "seg-00000" / "docs.arrow"
    assert index.path.is_relative_to(cache_root())
    del index
    data = bytearray(docs.read_bytes())
    data[4096:8192] = b"\0" * 4096  # same size: only the checksum tells
    docs.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    again = open_index(url, CFG)
    assert again.query(["a text to look for"]).to_pylist() == want
    assert any("does not verify" in r.getMessage() and "copying it from the store again" in r.getMessage()
               for r in caplog.records)
    put_bytes(f"{url}/seg-00000/docs.arrow", bytes(data))  # now the store's own file is damaged
    with pytest.raises(InputError, match=rf"the index at '{url}' is damaged .*also in a fresh copy"):
        open_index(url, CFG)


def test_an_object_put_at_an_output_name_during_an_interrupted_commit_is_not_overwritten(s3_server, bucket, corpus):
    """A run killed after copying its first output; the user puts an object at another output name; the next run
    finished the commit over it (exit 0, the user's object gone).  A rerun over an earlier run's complete output,
    killed the same way, is still finished by the next run."""
    _upload(s3_server, bucket, corpus / "in", "crawl")
    args = ("run", f"s3://{bucket}/crawl/", "-o", f"s3://{bucket}/out", "--backend", "cpu", "--id-column", "id")
    assert _cli(*args, fault="commit:renamed").returncode == -signal.SIGKILL
    assert "out/report.json" not in _keys(s3_server, bucket, "out/")
    put_bytes(RemotePath(f"s3://{bucket}/out/report.json"), b"the user's object")
    refused = _cli(*args)
    assert refused.returncode == 4 and "report.json" in refused.stderr, refused.stderr
    assert _get(s3_server, bucket, "out/report.json") == b"the user's object"
    s3_server.client().delete_object(Bucket=bucket, Key="out/report.json")
    assert _cli(*args).returncode == 0
    _same_as_local(s3_server, bucket, "out", corpus / "local")
    assert _cli(*args, fault="commit:renamed").returncode == -signal.SIGKILL  # over its own complete output
    again = _cli(*args)
    assert again.returncode == 0, again.stderr
    _same_as_local(s3_server, bucket, "out", corpus / "local")


def _kept_and_duplicates(where) -> tuple:
    """The kept rows of each output shard and the duplicates table of a run's outputs (a local directory or a
    prefix URL)."""
    from gpu_dedup.storage.filesystems import source

    def read(name):
        if isinstance(where, Path):
            return (where / name).read_bytes() if name.endswith(".jsonl") else pq.read_table(where / name)
        url = f"{where}/{name}"
        return filesystems.read_buffer(url).to_pybytes() if name.endswith(".jsonl") else pq.read_table(source(url))

    return tuple(read(n) for n in OUTPUTS)


def test_keys_holding_double_slashes_are_read_as_the_store_has_them(s3_server, bucket, corpus):
    """Keys crawl//part-0.parquet (and /lead/..., a key starting with '/') were folded to crawl/part-0.parquet,
    a missing key: the run stopped (exit 3, "does not exist").  Given as a prefix, a glob or one by one, and
    written to an output prefix holding '//', the outputs are those of the same corpus under plain keys."""
    _upload(s3_server, bucket, corpus / "in", "crawl/")  # keys crawl//extra.jsonl, crawl//part-00000.parquet, ...
    _upload(s3_server, bucket, corpus / "in", "/lead")  # keys /lead/extra.jsonl, ...
    assert _keys(s3_server, bucket, "crawl/")[0] == "crawl//extra.jsonl"
    reference = _kept_and_duplicates(corpus / "local")
    names = ("extra.jsonl", "part-00000.parquet", "part-00001.parquet")
    for given in ([f"s3://{bucket}/crawl/"], [f"s3://{bucket}/crawl//"], [f"s3://{bucket}/crawl//*"],
                  [f"s3://{bucket}/crawl//{n}" for n in names], [f"s3://{bucket}//lead/"]):
        got = run_dedup(given, corpus / "slashes", CFG)
        assert sorted(s.path for s in got.shards) == sorted(
            f"s3://{bucket}/{'/lead/' if 'lead' in given[0] else 'crawl//'}{n}" for n in names), given
        out = _kept_and_duplicates(corpus / "slashes")
        for name, a, b in zip(OUTPUTS, out, reference):
            assert a == b if isinstance(a, bytes) else a.equals(b), (given, name)
    # an output prefix holding '//' is used exactly: its objects are x//o/..., nothing is written to x/o/
    run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/x//o/", CFG)
    assert _keys(s3_server, bucket, "x/o") == []
    assert {k for k in _keys(s3_server, bucket, "x//o/")} >= {f"x//o/{n}" for n in (*OUTPUTS, "_SUCCESS")}
    for name, a, b in zip(OUTPUTS, _kept_and_duplicates(f"s3://{bucket}/x//o"), reference):
        assert a == b if isinstance(a, bytes) else a.equals(b), name
    assert not [k for k in _keys(s3_server, bucket, "x//o/") if ".gpu_dedup_checkpoint" in k]  # staged: removed
    with pytest.raises(ConfigError, match="ends in '//'"):  # the prefix whose last component is empty: refused
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/out//", CFG)
    assert _keys(s3_server, bucket, "out/") == []


def test_discovery_lists_keys_holding_double_slashes_exactly(s3_server, bucket):
    for key in ("c//a.parquet", "c/b.parquet", "c//sub//d.jsonl", "c/x//f.parquet", "/c/e.parquet",
                "c//_tmp/y.parquet"):
        put_bytes(f"s3://{bucket}/{key}", b"{}\n" if key.endswith("jsonl") else b"PAR1")
    u = f"s3://{bucket}/"

    def found(given):
        return [(s.name, s.path[len(u):]) for s in discover(given)]

    assert found(u + "c/") == found(u + "c") == [  # in key order
        ("a.parquet", "c//a.parquet"), ("sub/d.jsonl", "c//sub//d.jsonl"), ("b.parquet", "c/b.parquet"),
        ("x/f.parquet", "c/x//f.parquet")]
    assert found(u + "c//") == [("a.parquet", "c//a.parquet"), ("sub/d.jsonl", "c//sub//d.jsonl")]
    assert found(u + "/c/") == [("e.parquet", "/c/e.parquet")]  # a key starting with '/' is not c/e.parquet
    assert found(u + "c//*.parquet") == [("a.parquet", "c//a.parquet")]
    assert found(u + "c/*.parquet") == [("b.parquet", "c/b.parquet")]
    assert found(u + "c/**/*.parquet") == [("a.parquet", "c//a.parquet"), ("b.parquet", "c/b.parquet"),
                                           ("x/f.parquet", "c/x//f.parquet")]
    assert found(u + "c//a.parquet") == [("a.parquet", "c//a.parquet")]
    with pytest.raises(InputError, match="does not exist"):
        discover(u + "c/a.parquet")
    # two keys that differ by '//' only would be written under one name: refused, never one read for the other
    put_bytes(f"s3://{bucket}/c/a.parquet", b"PAR1")
    with pytest.raises(InputError, match="under the same name 'a.parquet'"):
        discover(u + "c/")
    assert found(u + "c/a.parquet") == [("a.parquet", "c/a.parquet")]
    assert found([u + "c/a.parquet", u + "c//sub//d.jsonl"]) == [("a.parquet", "c/a.parquet"),
                                                                 ("d.jsonl", "c//sub//d.jsonl")]


def test_prefixes_that_differ_by_double_slashes_overlap_only_as_their_keys_do(s3_server, bucket, corpus):
    """'The output must not be inside the input' and 'a run owns only what it creates' on exact keys: folding
    '//' made s3://b/crawl// (keys crawl//...) hold s3://b/crawl/out, and s3://b/x//o the prefix s3://b/x/o
    whose manifest (of another run) made x/o's objects its own."""
    _upload(s3_server, bucket, corpus / "in", "crawl/")  # crawl//...
    _upload(s3_server, bucket, corpus / "in", "plain")
    # overlapping though spelled differently: crawl/ lists crawl//out/...
    with pytest.raises(OutputError, match="inside the input prefix"):
        run_dedup(f"s3://{bucket}/crawl/", f"s3://{bucket}/crawl//out", CFG)
    # not overlapping though they fold to one: crawl// does not list crawl/out/
    run_dedup(f"s3://{bucket}/crawl//", f"s3://{bucket}/crawl/out", CFG)
    assert [s.path for s in discover(f"s3://{bucket}/crawl//")] == [
        f"s3://{bucket}/crawl//{n}" for n in ("extra.jsonl", "part-00000.parquet", "part-00001.parquet")]
    # a run in x/o does not own x//o: an object there it did not write stops the run, untouched
    run_dedup(f"s3://{bucket}/plain/", f"s3://{bucket}/x/o", CFG)
    put_bytes(f"s3://{bucket}/x//o/duplicates.parquet", b"someone else's")
    with pytest.raises(OutputError, match="was not written by gpu_dedup"):
        run_dedup(f"s3://{bucket}/plain/", f"s3://{bucket}/x//o", CFG)
    assert _get(s3_server, bucket, "x//o/duplicates.parquet") == b"someone else's"
    # and a run in //lead/o (keys /lead/o/...) neither refuses nor touches lead/o's objects
    put_bytes(f"s3://{bucket}/lead/o/duplicates.parquet", b"someone else's")
    put_bytes(f"s3://{bucket}/lead/o/.gpu_dedup_checkpoint/keep", b"someone else's")
    run_dedup(f"s3://{bucket}/plain/", f"s3://{bucket}//lead/o", CFG)
    assert _keys(s3_server, bucket, "lead/") == ["lead/o/.gpu_dedup_checkpoint/keep", "lead/o/duplicates.parquet"]
    assert "/lead/o/_SUCCESS" in _keys(s3_server, bucket, "/lead/")
    # removing a prefix removes exactly its keys (fsspec's rm would strip the leading '/': lead/o/...)
    filesystems.remove_tree(f"s3://{bucket}//lead/o/.gpu_dedup_checkpoint")
    put_bytes(f"s3://{bucket}//lead/o/.gpu_dedup_checkpoint/x", b"ours")
    filesystems.remove_tree(f"s3://{bucket}//lead/o/.gpu_dedup_checkpoint")
    assert _keys(s3_server, bucket, "/lead/o/.gpu_dedup_checkpoint/") == []
    assert _get(s3_server, bucket, "lead/o/.gpu_dedup_checkpoint/keep") == b"someone else's"


def test_a_one_level_glob_lists_its_level_not_the_whole_prefix(s3_server, bucket, monkeypatch):
    """Since keys are used exactly, a glob's matches came from a listing of everything under its static prefix:
    ``s3://b/crawl/*.parquet`` over a crawl whose deeper prefixes hold many objects (other partitions, runs'
    outputs) listed all of them (5,000 deeper objects: 6 list requests and ~1 s on moto, where fsspec's glob
    listed that level only: ~40 ms).  A pattern of one path component lists its level, one delimited request,
    keys exact; a run's own files in that level are still skipped, by its manifest or its work prefix."""
    import aiobotocore.client

    c = s3_server.client()
    deeper = [f"crawl/deep/{i:03d}/x.parquet" for i in range(60)]
    for key in ("crawl/a.parquet", "crawl/b.parquet", "crawl//c.parquet", "crawl/_tmp.parquet", *deeper,
                "run/part-0.parquet", "run/duplicates.parquet", "run/.gpu_dedup_checkpoint/x.ckpt"):
        c.put_object(Bucket=bucket, Key=key, Body=b"PAR1")
    listed = collections.Counter()
    call = aiobotocore.client.AioBaseClient._make_api_call

    async def counting(self, operation, params):
        out = await call(self, operation, params)
        if operation.startswith("ListObject"):
            listed["requests"] += 1
            listed["keys"] += len(out.get("Contents", []))
        return out

    monkeypatch.setattr(aiobotocore.client.AioBaseClient, "_make_api_call", counting)
    u = f"s3://{bucket}/"
    assert [(s.name, s.path) for s in discover(u + "crawl/*.parquet")] == [
        ("a.parquet", u + "crawl/a.parquet"), ("b.parquet", u + "crawl/b.parquet")]
    assert listed == {"requests": 1, "keys": 3}, listed  # crawl/'s own level: a, b, _tmp (skipped), nothing deeper
    assert [s.path for s in discover(u + "crawl//*.parquet")] == [u + "crawl//c.parquet"]  # the exact '//' level
    shards = discover(u + "run/*.parquet")  # a killed run's output prefix (its work prefix, no manifest yet)
    assert [s.name for s in shards] == ["part-0.parquet"]
    assert [s["path"] for s in shards.skipped] == [u + "run/duplicates.parquet"]
    assert len(discover(u + "crawl/deep/*/x.parquet")) == 60  # deeper patterns: the subtree, as before
    listed.clear()  # an output or checkpoint prefix's glob and is_dir: one level too
    assert RemotePath(u + "crawl").glob("[a-z].parquet") == [RemotePath(u + "crawl/a.parquet"),
                                                              RemotePath(u + "crawl/b.parquet")]
    assert RemotePath(u + "crawl").is_dir() and RemotePath(u + "crawl/deep").is_dir()
    assert not RemotePath(u + "nothing").is_dir()
    assert listed["requests"] == 4 and listed["keys"] <= 6, listed
