"""Loaders of real corpora, on small directories laid out like the installed Debian files."""

import gzip

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from gpu_dedup.errors import InputError
from gpu_dedup.evaluation.datasets import (
    build,
    canonical_license,
    debian_copyright,
    debian_licenses,
    debian_man,
    strip_troff,
)

DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: foo

Files: *
Copyright: 2020 Someone
License: GPL-2+

Files: lib/*
Copyright: 2021 Other
License: Expat

License: GPL-2+
 This program is free software; you can redistribute it and/or modify
 it under the terms of the GNU General Public License as published by
 .
 On Debian systems, the full text is in /usr/share/common-licenses/GPL-2.

License: Expat
 short
"""


@pytest.fixture
def doc_root(tmp_path):
    root = tmp_path / "doc"
    for pkg, text in [("foo", DEP5), ("foo-dev", DEP5), ("bar", "This is bar, written by Bar.\nGPL v2.\n")]:
        (root / pkg).mkdir(parents=True)
        (root / pkg / "copyright").write_text(text)
    (root / "nocopyright").mkdir()
    return root


def test_copyright_files(doc_root):
    t = debian_copyright(str(doc_root))
    assert t.column("id").to_pylist() == ["bar", "foo", "foo-dev"]
    assert t.column("license").to_pylist() == [None, "GPL-2+", "GPL-2+"]
    assert t.column("text")[1].as_py() == DEP5


def test_license_texts_with_labels(doc_root):
    t = debian_licenses(str(doc_root), min_chars=40)
    assert t.column("id").to_pylist() == ["foo#0", "foo-dev#0"]  # 'Expat' body is too short; 'bar' is free-form
    assert t.column("label").to_pylist() == ["gpl-2+", "gpl-2+"]
    text = t.column("text")[0].as_py()
    assert text.startswith("This program is free software") and "\n\nOn Debian systems" in text


@pytest.mark.parametrize("name, canon", [("GPL-2+", "gpl-2+"), ("GPLv2+", "gpl-2+"), ("GPL-2.0-or-later", "gpl-2+"),
                                         ("LGPL-2.1", "lgpl-2.1"), ("Apache-2.0", "apache-2"), ("MIT", "expat"),
                                         ("BSD-3-Clause", "bsd-3-clause"), ("public-domain", "public-domain"),
                                         ("GPL-2.0-only", "gpl-2")])
def test_canonical_license(name, canon):
    assert canonical_license(name) == canon


def test_man_pages(tmp_path):
    root = tmp_path / "man"
    (root / "man1").mkdir(parents=True)
    (root / "de" / "man1").mkdir(parents=True)
    page = '.\\" comment\n.TH FOO 1\n.SH NAME\nfoo \\- do \\fBthings\\fR well\n.PP\n.B \\-\\-all\nshow all\n'
    (root / "man1" / "foo.1.gz").write_bytes(gzip.compress(page.encode()))
    (root / "de" / "man1" / "foo.1.gz").write_bytes(gzip.compress(page.replace("well", "gut").encode()))
    (root / "man1" / "bar.1.gz").write_bytes(gzip.compress(b".so man1/foo.1\n"))  # redirect: left out
    (root / "man1" / "baz.1.gz").symlink_to(root / "man1" / "foo.1.gz")  # link: left out
    t = debian_man(str(root))
    assert t.column("id").to_pylist() == ["de/man1/foo.1.gz", "man1/foo.1.gz"]
    assert t.column("lang").to_pylist() == ["de", "C"] and t.column("section").to_pylist() == ["1", "1"]
    text = t.column("text")[1].as_py()
    assert "NAME" in text and "foo - do things well" in text and "--all" in text
    assert "comment" not in text and ".TH" not in text and "\\f" not in text and ".PP" not in text


def test_strip_troff_column():
    out = strip_troff(pa.array(['.BR ls (1),\n\\(em \\*(lq x \\(rq "y"\n.BRANCH text\n.B\nz', None]))
    assert out.to_pylist() == ["ls (1),\n-  x  y\n\n\nz", None]


def test_missing_sources_name_the_package(tmp_path):
    with pytest.raises(InputError, match="apt-get install manpages"):
        debian_man(str(tmp_path / "nothing"))
    with pytest.raises(InputError, match="no copyright files under"):
        debian_copyright(str(tmp_path / "nothing"))
    with pytest.raises(InputError, match="unknown dataset 'x'"):
        build("x", tmp_path / "x.parquet")


def test_build_and_cli(doc_root, tmp_path, capsys, monkeypatch):
    info = build("debian-copyright", tmp_path / "c.parquet", root=str(doc_root))
    assert info["documents"] == 3 and pq.read_table(tmp_path / "c.parquet").num_rows == 3
    monkeypatch.setattr("gpu_dedup.evaluation.datasets.DOC_ROOT", str(doc_root))
    import gpu_dedup.evaluation.datasets as ds

    monkeypatch.setitem(ds.LOADERS, "debian-licenses", lambda: debian_licenses(str(doc_root), min_chars=40))
    assert main(["dataset", "debian-licenses", "-o", str(tmp_path / "l.parquet")]) == 0
    assert "debian-licenses: 2 documents" in capsys.readouterr().out


def test_dataset_overwrites_only_its_own_files_and_checks_before_reading(doc_root, tmp_path, capsys, monkeypatch):
    """``dataset -o mine.jsonl`` replaced the user's file with the Parquet; ``--info notes.txt`` replaced that one;
    ``--info`` equal to ``-o`` replaced the dataset with its description; ``-o DIR`` was exit 3 "cannot use
    '.DIR.tmp'"; ``--info DIR`` failed after the dataset was written. Each is refused before anything is read or
    written; the command's own files are rewritten by the next build."""
    import gpu_dedup.evaluation.datasets as ds

    read = []
    monkeypatch.setitem(ds.LOADERS, "debian-copyright", lambda: read.append(1) or debian_copyright(str(doc_root)))
    out, info = tmp_path / "c.parquet", tmp_path / "c.json"
    assert main(["dataset", "debian-copyright", "-o", str(out), "--info", str(info)]) == 0
    assert main(["dataset", "debian-copyright", "-o", str(out), "--info", str(info)]) == 0  # its own: rewritten
    assert pq.read_table(out).num_rows == 3 and len(read) == 2
    (tmp_path / "mine.jsonl").write_text('{"text": "mine"}\n')
    (tmp_path / "notes.txt").write_text("precious\n")
    (tmp_path / "adir").mkdir()
    capsys.readouterr()
    for argv, code, said in [
        (["-o", str(tmp_path / "mine.jsonl")], 4, "is not a dataset file gpu-dedup wrote"),
        (["-o", str(out), "--info", str(tmp_path / "notes.txt")], 4, "is not a dataset description"),
        (["-o", str(tmp_path / "new.parquet"), "--info", str(tmp_path / "new.parquet")], 2, "both name"),
        (["-o", str(out), "--info", str(out)], 2, "both name"),
        (["-o", str(tmp_path / "adir")], 4, "is a directory"),
        (["-o", str(tmp_path / "n2.parquet"), "--info", str(tmp_path / "adir")], 4, "is a directory"),
    ]:
        rc = main(["dataset", "debian-copyright", *argv])
        err = capsys.readouterr().err
        assert rc == code and said in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert len(read) == 2 and not (tmp_path / "new.parquet").exists() and not (tmp_path / "n2.parquet").exists()
    assert (tmp_path / "mine.jsonl").read_text() == '{"text": "mine"}\n'
    assert (tmp_path / "notes.txt").read_text() == "precious\n" and list((tmp_path / "adir").iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary files left


def test_dataset_to_dash_is_stdout_and_refused_on_a_terminal(doc_root, tmp_path, capsysbinary, monkeypatch):
    """``dataset -o -`` (and ``--info -``) wrote a file named ``-``; ``-`` is standard output, the summary line then
    on stderr.  Parquet is binary: to a terminal it is refused before anything is read."""
    import json
    import sys

    import gpu_dedup.evaluation.datasets as ds

    read = []
    monkeypatch.setitem(ds.LOADERS, "debian-copyright", lambda: read.append(1) or debian_copyright(str(doc_root)))
    monkeypatch.chdir(tmp_path)
    assert main(["dataset", "debian-copyright", "-o", "-", "--info", "c.json"]) == 0
    got = capsysbinary.readouterr()
    assert pq.read_table(pa.BufferReader(got.out)).column("id").to_pylist() == ["bar", "foo", "foo-dev"]
    assert got.err == b"debian-copyright: 3 documents, 0.0 MB of text -> standard output\n"
    assert json.loads((tmp_path / "c.json").read_text())["path"] == "-"
    assert main(["dataset", "debian-copyright", "-o", "c.parquet", "--info", "-"]) == 0
    got = capsysbinary.readouterr()
    assert json.loads(got.out)["documents"] == 3 and b"-> c.parquet" in got.err
    assert main(["dataset", "debian-copyright", "-o", "-", "--info", "-"]) == 2
    assert b"both name standard output" in capsysbinary.readouterr().err
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["dataset", "debian-copyright", "-o", "-"]) == 2
    got = capsysbinary.readouterr()
    assert got.out == b"" and b"binary Parquet file" in got.err and b"-o - > debian-copyright.parquet" in got.err
    assert len(read) == 2 and not (tmp_path / "-").exists()


def test_dataset_to_an_unwritable_place_is_refused_before_reading(doc_root, tmp_path, capsys, monkeypatch):
    """``dataset debian-man -o x.parquet`` on a read-only file system read every man page first (seconds), then
    failed naming its temporary file ``.x.parquet.<random>.tmp``; it is refused first, naming -o / --info."""
    import os

    import gpu_dedup.evaluation.datasets as ds

    read = []
    monkeypatch.setitem(ds.LOADERS, "debian-copyright", lambda: read.append(1) or debian_copyright(str(doc_root)))
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p).startswith(str(ro)) and mode & os.W_OK
                        else real_access(p, mode, **k))
    for argv, flag in ((["-o", str(ro / "x.parquet")], "-o"),
                       (["-o", str(ro / "new" / "sub" / "x.parquet")], "-o"),
                       (["-o", str(tmp_path / "ok.parquet"), "--info", str(ro / "x.json")], "--info")):
        assert main(["dataset", "debian-copyright", *argv]) == 4
        err = capsys.readouterr().err
        assert f"cannot write {flag} " in err and ".tmp" not in err and "is not writable" in err, err
    assert read == [] and not (tmp_path / "ok.parquet").exists()
