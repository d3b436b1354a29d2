"""The subcommands of ``gpu-dedup``: one ``cmd_*`` function each, called with the parsed arguments."""

from __future__ import annotations

import io
import json
import logging
import sys
from pathlib import Path

import yaml

from gpu_dedup.config import Config, DuplicateKeyError, load_yaml
from gpu_dedup.errors import (
    EXIT_TARGETS,
    ConfigError,
    GpuDedupError,
    InputError,
    Interrupted,
    OutputError,
)

log = logging.getLogger("gpu_dedup")


AUTO_ID = "id"  # an input column of this name names the documents when no id column is configured


def _config_from_args(args) -> Config:
    cfg = Config.from_yaml(args.config) if args.config else Config()
    overrides = {}
    for flag, key in [
        ("threshold", "lsh.threshold"),
        ("similarity", "similarity"),
        ("vector_column", "input.vector_column"),
        ("num_perm", "minhash.num_perm"),
        ("ngram", "minhash.ngram"),
        ("shingle", "minhash.shingle"),
        ("bands", "lsh.bands"),
        ("rows", "lsh.rows"),
        ("verify", "verify.method"),
        ("backend", "backend"),
        ("workers", "cluster.workers"),
        ("workers_per_gpu", "cluster.workers_per_gpu"),
        ("scheduler", "cluster.scheduler"),
        ("text_column", "input.text_column"),
        ("id_column", "input.id_column"),
    ]:
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    if getattr(args, "no_shards", False):
        overrides["output.shards"] = False
    for item in args.set:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} must look like KEY=VALUE, e.g. --set lsh.threshold=0.7")
        key, value = item.split("=", 1)
        try:
            overrides[key.strip()] = load_yaml(value)
        except DuplicateKeyError as exc:
            raise ConfigError(f"--set {item!r}: the value {exc}; keep one of them") from None
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(f"--set {item!r}: the value {value!r} is not valid YAML ({problem}); quote strings "
                              "that hold YAML punctuation, e.g. --set 'input.text_column=\"a: b\"'") from None
    return cfg.with_overrides(overrides) if overrides else cfg


def _with_id_column(args, cfg: Config) -> Config:
    """``run`` and ``index build`` without an id column configured: with ``--against``, the index's id
    column; else an input column named ``id`` when every shard has one of one type (said once, at INFO), and
    an input error when some shards have one but it cannot name every document as it is (missing from a
    shard, of two types, nested).  ``--no-id-column`` keeps row numbers only."""
    if cfg.input.id_column is not None and args.no_id_column:
        raise ConfigError(f"--no-id-column names documents by row number, but the id column {cfg.input.id_column!r} "
                          "is given too (--id-column, input.id_column); give one of them")
    if cfg.input.id_column is not None or args.no_id_column:
        return cfg
    against = getattr(args, "against", None)
    if against is not None:
        try:
            from gpu_dedup.storage.filesystems import as_path  # the CLI's imports stay light (and numba-free)

            name = json.loads((as_path(against) / "manifest.json").read_text(encoding="utf-8")).get("id_column", "id")
        except (OSError, ValueError, AttributeError, GpuDedupError):
            return cfg  # not an index (or not reachable): the run says so
        if not isinstance(name, str):
            return cfg  # a damaged manifest: opening the index says so
        if name:
            log.info("using the input column %r as document ids, as the index %s does (--id-column)", name, against)
            return cfg.with_overrides({"input.id_column": name})
        return cfg
    from gpu_dedup.storage import auto_id_column, discover

    try:
        shards = discover(args.inputs, cfg.input.format, warn=False)
    except GpuDedupError:
        return cfg  # the run reports it
    if auto_id_column(shards, AUTO_ID) is None:  # no shard has one: documents are named by row
        return cfg
    log.info("document ids: the input column %r (--id-column picks another, --no-id-column none)", AUTO_ID)
    return cfg.with_overrides({"input.id_column": AUTO_ID})


def stdout_error(exc: OSError, what: str, example: str, read: str = "the index") -> GpuDedupError:
    """One error for a failed write of ``what`` to standard output (a full disk behind ``>``, a closed terminal):
    the command wrote nothing else (``read``: what it only read), so nothing needs cleaning up."""
    from gpu_dedup.errors import write_error

    mapped = write_error("standard output", exc)
    kind = type(mapped) if isinstance(mapped, GpuDedupError) else OutputError
    return kind(f"cannot write {what} to standard output ({exc.strerror or exc}); nothing else was written "
                f"({read} was only read): send the output where there is room, e.g. {example}")


STDOUT = "-"  # an output file named so is standard output (report -o -, dataset -o -)


def _write_stdout(chunks, what: str, example: str, read: str) -> None:
    """The bytes ``chunks`` on standard output (a page, a Parquet file); a closed pipe is left to main."""
    try:
        sys.stdout.flush()  # anything printed before stays before
        for chunk in chunks:
            sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    except BrokenPipeError:  # `| head`: the shell's status, no message (see main)
        raise
    except OSError as exc:
        raise stdout_error(exc, what, example, read) from None


def cmd_run(args) -> int:
    from gpu_dedup.report.build import SUMMARY_WIDTH, summary
    from gpu_dedup.run.entry import run_dedup

    cfg = _with_id_column(args, _config_from_args(args))
    result = run_dedup(args.inputs, args.output, cfg, restart=args.restart, index_out=args.index_out,
                       against=args.against, update_index=args.update_index)
    if not args.quiet:
        print(summary(result.report))
        written = (["deduplicated shards"] if cfg.output.shards else []) + \
            (["duplicates.parquet"] if cfg.output.duplicates_table else []) + ["report.json", "report.html"]
        where, what = f"outputs in {result.output_dir}/", f"({', '.join(written)})"
        print(f"{where} {what}" if len(where) + len(what) < SUMMARY_WIDTH else f"{where}\n  {what}")
    return 0


def cmd_demo(args) -> int:
    from gpu_dedup.demo import run_demo

    cfg = _config_from_args(args)
    return run_demo(Path(args.output), cfg, docs=args.docs, quiet=args.quiet)


def cmd_bench_skew(args) -> int:
    from gpu_dedup.bench import skew

    skew.bench_skew(args.sizes, args.results, args.workdir)
    return 0


def cmd_index_build(args) -> int:
    import tempfile

    from gpu_dedup.run.entry import run_dedup

    try:  # from the start: an interrupt while the inputs are looked at for ids is the build's too
        cfg = _with_id_column(args, _config_from_args(args))
        with tempfile.TemporaryDirectory() as tmp:  # the run's outputs (its report) are not kept
            result = run_dedup(args.inputs, tmp, cfg, index_out=args.output, write_shards=False)
    except KeyboardInterrupt as exc:
        raise Interrupted(f"interrupted; no index was left in {args.output!r} (a build writes it whole or not at "
                          "all): rerun the same command") from exc
    c = result.report["counts"]
    if not args.quiet:
        print(f"indexed {c['documents_read']:,} documents ({c['kept']:,} kept, {c['removed']:,} duplicates) "
              f"in {args.output}")
    return 0


def cmd_index_info(args) -> int:
    import json

    from gpu_dedup.index.remote import open_index

    print(json.dumps(open_index(args.index).info(), indent=2))
    return 0


def cmd_query(args) -> int:
    import json

    import numpy as np
    import pyarrow as pa

    from gpu_dedup.index.remote import open_index

    if args.text_column is not None and not args.jsonl:  # plain text has no fields: the option would do nothing
        raise ConfigError(f"--text-column {args.text_column!r} names a field of JSON Lines queries; add --jsonl (or "
                          "drop --text-column: plain text is one query per line)")
    index = open_index(args.index)  # a directory, or a URL (a local copy)
    by_vector = index.similarity == "cosine" and index.manifest["config"].get("source") == "vectors"
    if args.vector_column is not None and not by_vector:
        raise ConfigError(f"--vector-column {args.vector_column!r} applies to a cosine index of vectors; the index "
                          f"{args.index!r} is queried by text ({index.similarity}): drop --vector-column")
    if args.text_column is not None and by_vector:
        raise ConfigError(f"--text-column {args.text_column!r}: the index {args.index!r} holds vectors and is queried "
                          "by them; name their key with --vector-column")
    args.text_column = "text" if args.text_column is None else args.text_column
    lines = _query_lines(args.file, args.index)
    if by_vector:  # a cosine index of vectors: JSONL queries with a vector column
        column = args.vector_column or index.manifest.get("vector_column") or "vector"
        if not args.jsonl:
            raise InputError(f"the index {args.index!r} holds vectors (similarity cosine): give JSONL queries "
                             f"with --jsonl, each line an object with the vector in {column!r} (--vector-column)")
        texts = _jsonl_texts(lines, column, args.file)
        try:
            vecs = np.asarray(texts, dtype=np.float32)
        except (TypeError, ValueError):
            raise InputError(f"the {column!r} values of {args.file!r} are not lists of numbers of one length") from None
        if vecs.ndim != 2:
            raise InputError(f"the {column!r} values of {args.file!r} must be lists of numbers of one length")
        matches = index.query(threshold=args.threshold, members=args.members, vectors=vecs)
    else:
        texts = _jsonl_texts(lines, args.text_column, args.file) if args.jsonl else lines
        for number, text in enumerate(texts, 1):
            if text is not None and not isinstance(text, str):
                raise InputError(f"query {number} of {args.file!r} has a {type(text).__name__} in "
                                 f"{args.text_column!r} ({json.dumps(text)[:40]}), not a string; give the text as a "
                                 "JSON string")
        matches = index.query(pa.array(texts, pa.large_string()), threshold=args.threshold, members=args.members)
    found = [[] for _ in texts]
    for rec in matches.to_pylist():  # one JSON object per query, in input order, matches best first
        found[rec.pop("query")].append(rec)
    try:
        for q, recs in enumerate(found):
            recs.sort(key=lambda r: (-r["similarity"], r["row"]))
            print(json.dumps({"query": q, "matches": recs}, default=str))
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the shell's status, no message (see main)
        raise
    except OSError as exc:
        raise stdout_error(exc, "the query results", f"gpu-dedup query {args.index} ... > results.jsonl") from None
    if not args.quiet:
        hit = sum(1 for recs in found if recs)
        t = args.threshold if args.threshold is not None else index.config().lsh.threshold
        print(f"{hit:,} of {len(texts):,} queries matched an indexed document (similarity >= {t}); "
              f"{len(texts) - hit:,} had no match", file=sys.stderr)
    return 0


# what a query file must not be: binary files, told by their first bytes
BINARY_MAGIC = {b"PAR1": "a Parquet file", b"\x1f\x8b": "gzip-compressed", b"\x28\xb5\x2f\xfd": "zstd-compressed",
                b"BZh": "bzip2-compressed", b"ARROW1": "an Arrow file", b"PK\x03\x04": "a zip file"}


def _query_lines(name: str, index: str) -> list[str]:
    """The lines of a query file (``-``: stdin) as text: bytes that are not UTF-8 are replaced (U+FFFD, a
    warning counts them); a binary file (Parquet, compressed, NUL bytes) is refused with the fix."""
    try:
        if name == "-":
            stream = getattr(sys.stdin, "buffer", None)
            raw = stream.read() if stream is not None else sys.stdin.read().encode("utf-8", "surrogateescape")
        else:
            with open(name, "rb") as f:
                raw = f.read()
    except OSError as exc:
        raise InputError(f"cannot read the queries in {name!r} ({exc.strerror}); give a text file, one "
                         "query per line (or JSONL with --jsonl), or - for stdin") from None
    kind = next((what for magic, what in BINARY_MAGIC.items() if raw.startswith(magic)), None)
    if kind is None and b"\0" in raw[:1 << 16]:
        kind = "a binary file (it holds NUL bytes)"
    if kind is not None:
        where = "stdin" if name == "-" else repr(name)
        fix = (f"decompress it first (e.g. zcat FILE | gpu-dedup query {index})" if "compressed" in kind else
               f"to deduplicate a shard against the index run gpu-dedup run SHARD --against {index} -o OUT")
        raise InputError(f"the queries in {where} are {kind}, not text; query reads text lines (or JSON Lines "
                         f"with --jsonl): {fix}")
    text = raw.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")
    if bad:
        log.warning("the queries in %s hold %d byte sequence(s) that are not UTF-8; they were replaced with U+FFFD",
                    "stdin" if name == "-" else name, bad)
    return [line.rstrip("\n") for line in io.StringIO(text, newline=None)]  # universal newlines, as text files


def _jsonl_texts(lines: list[str], column: str, source: str) -> list:
    """The ``column`` of each non-blank JSON line; a line that is no JSON object with it is an InputError."""

    texts = []
    for number, line in enumerate(lines, 1):  # queries: a few thousand lines at most
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"line {number} of {source!r} is not valid JSON ({exc}); give one JSON object per "
                             "line, or drop --jsonl for plain text (one query per line)") from None
        except RecursionError:  # Python's json takes about 1,000 levels
            raise InputError(f"line {number} of {source!r} nests arrays/objects deeper than the JSON reader takes; "
                             "flatten or drop the deep field, or remove the line") from None
        if not isinstance(record, dict) or column not in record:
            raise InputError(f"line {number} of {source!r} has no {column!r} field; name the text field with "
                             "--text-column")
        texts.append(record[column])
    return texts


def cmd_bench_workers(args) -> int:
    from gpu_dedup.bench import workers

    workers.bench_workers(args.documents, args.workers, args.memory_limit, args.block_rows, args.results, args.workdir,
                          args.boilerplate, args.single_up_to, args.running, args.repeat)
    return 0


def cmd_bench_peers(args) -> int:
    from gpu_dedup.bench import peers

    cfg = _config_from_args(args)
    if args.backend is None:
        cfg = cfg.with_overrides({"backend": "cpu"})
    peers.bench_peers(sizes=args.sizes, peer_max_docs=args.peer_max_docs, real=None if args.real == "none" else args.real,
                    tools=args.tools, quality_sample=args.quality_sample, quality_max_docs=args.quality_max_docs,
                    sig_docs=args.signature_docs, datasketch_sig_docs=args.datasketch_signature_docs,
                    results=args.results, workdir=args.workdir, config=cfg, layouts=tuple(args.layouts))
    return 0


def cmd_bench_index(args) -> int:
    from gpu_dedup.bench import index

    index.bench_index(args.documents, args.queries, args.single, args.results, args.workdir)
    return 0


def cmd_bench_own_parser(args) -> int:
    """The benchmarks with their own argument parser (``main(argv)``): the rest of the command line is theirs."""
    from gpu_dedup.bench import cosine, gpu, signatures, stages

    mains = {"stages": stages.main, "signatures": signatures.main, "cosine": cosine.main, "gpu": gpu.main}
    return mains[args.bench](args.bench_args)


def cmd_config(args) -> int:
    cfg = _config_from_args(args)
    print(cfg.to_yaml(), end="")
    if cfg.similarity == "cosine":  # the cosine signature's layout, not MinHash's (which a cosine run never uses)
        c = cfg.cosine
        if c.bands is None and c.rows is None and c.min_rows is None:
            layout = ("cosine bands and rows from the run's number of rows (gpu-dedup tune --similarity cosine "
                      "--documents N shows them);")
        else:
            bands, rows = cfg.cosine_layout
            layout = f"bands={bands} rows={rows} of {c.bits} cosine bits"
    else:
        bands, rows = cfg.layout
        layout = f"bands={bands} rows={rows} permutations_computed={cfg.signature_perms}"
    print(f"# derived: {layout} verify_threshold={cfg.verify_threshold} fingerprint={cfg.fingerprint}")
    if cfg.layout_warning:
        print(f"# warning: {cfg.layout_warning}")
    return 0


def cmd_evaluate(args) -> int:
    from gpu_dedup.evaluation.evaluate import evaluate, summary

    cfg = _config_from_args(args)
    report = evaluate(args.inputs, cfg, output_dir=args.output, sample=args.sample, seed=args.seed, floor=args.floor,
                      label_column=args.label_column, compare_split_chains=args.compare_split_chains,
                      plot=not args.no_plot, keep_runs=args.keep_runs, lsh_seeds=args.lsh_seeds)
    print(summary(report))
    written = sorted(p.name for p in Path(args.output).glob("evaluation.*"))
    print(f"wrote {', '.join(written)} in {Path(args.output)}/")
    if args.require_targets:
        failed = [f"{name}: {k}" for name, r in report["runs"].items() for k, v in r["targets"].items()
                  if not v["met"] and v.get("applies", True)]
        if failed:
            print("targets not met: " + "; ".join(failed), file=sys.stderr)
            return EXIT_TARGETS
    return 0


def cmd_tune(args) -> int:
    from gpu_dedup.evaluation.tune import format_empirical, format_table, tune

    cfg = _config_from_args(args)
    overrides = {k: v for k, v in (("lsh.fp_weight", args.fp_weight), ("lsh.fn_weight", args.fn_weight)) if v is not None}
    if overrides:
        cfg = cfg.with_overrides(overrides)
    if args.documents is not None and cfg.similarity != "cosine":  # options that would do nothing: said, not ignored
        raise ConfigError(f"--documents {args.documents} derives the cosine layout's min_rows; it applies with "
                          "--similarity cosine only (a MinHash layout does not depend on the rows): drop it")
    sampling = [(flag, value) for flag, value in (("--sample-size", args.sample_size), ("--confirm", args.confirm),
                                                  ("--seed", args.seed), ("--floor", args.floor)) if value is not None]
    if sampling and not args.sample:
        given = [f"{flag} {value}" for flag, value in sampling]
        flags = [flag for flag, _ in sampling]
        raise ConfigError(f"{_and(given)} {'applies' if len(given) == 1 else 'apply'} to the sample that confirms the "
                          f"layouts, and no --sample-corpus is given; give the corpus with --sample-corpus CORPUS, or "
                          f"drop {_and(flags)}")
    if args.output is None:  # the default directory, in the current one: say so before anything is written
        args.output = TUNE_DIR
        if not args.quiet:
            print(f"writing tune.json and tune.png to {Path(TUNE_DIR).resolve()}/ (the default; -o DIR to choose)")
    if cfg.similarity == "cosine":
        return _tune_cosine(cfg, args)
    chosen = {k: v for k, v in (("sample", args.sample_size), ("seed", args.seed), ("confirm", args.confirm))
              if v is not None}  # the others: tune's defaults
    result = tune(cfg, top=args.top, output_dir=args.output, sample_inputs=args.sample, floor=args.floor,
                  plot=not args.no_plot, **chosen)
    print(f"LSH layouts for threshold {cfg.lsh.threshold}, num_perm {cfg.minhash.num_perm}, "
          f"weights FP {cfg.lsh.fp_weight} / FN {cfg.lsh.fn_weight}:")
    print(format_table(result["layouts"], cfg.lsh.threshold))
    if "empirical" in result:
        print(format_empirical(result["empirical"]))
    pick = result["pick"]
    print(f"pick: lsh.bands={pick['bands']} lsh.rows={pick['rows']}"
          + (f"; wrote tune.json{', tune.png' if 'png' in result else ''} in {Path(args.output)}/"
             if args.output else ""))
    return 0


TUNE_DIR = "gpu-dedup-tune"


def _and(words: list) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _tune_cosine(cfg, args) -> int:
    from gpu_dedup.evaluation.tune import format_cosine_table, tune_cosine

    if args.sample:
        raise GpuDedupError("tune --similarity cosine has no --sample yet; run gpu-dedup evaluate --similarity cosine "
                            "on the corpus to measure a layout")
    result = tune_cosine(cfg, top=args.top, rows_in_run=args.documents, output_dir=args.output,
                         plot=not args.no_plot)
    print(f"cosine LSH layouts for threshold {cfg.lsh.threshold}, {cfg.cosine.bits} bits, min_rows "
          f"{result['min_rows']}, weights FP {cfg.lsh.fp_weight} / FN {cfg.lsh.fn_weight}:")
    print(format_cosine_table(result["layouts"], cfg.lsh.threshold))
    pick = result["pick"]
    print(f"pick: cosine.bands={pick['bands']} cosine.rows={pick['rows']}; wrote tune.json"
          f"{', tune.png' if 'png' in result else ''} in {Path(args.output)}/")
    return 0


def cmd_dataset(args) -> int:
    import tempfile

    from gpu_dedup.evaluation.datasets import build, check_outputs

    check_outputs(args.output, args.info)  # before the dataset is read: nothing overwritten that it did not write
    if args.output == STDOUT and sys.stdout.isatty():  # Parquet is binary: not for a terminal
        raise ConfigError(f"-o - writes the dataset, a binary Parquet file, to standard output, and that is a terminal "
                          f"here; redirect it (gpu-dedup dataset {args.name} -o - > {args.name}.parquet) or give a "
                          f"file (-o {args.name}.parquet)")
    if args.output == STDOUT:
        with tempfile.TemporaryDirectory(prefix="gpu-dedup-dataset-") as tmp:  # whole, then sent: nothing half-built
            info = build(args.name, Path(tmp) / f"{args.name}.parquet")
            with open(info["path"], "rb") as f:
                _write_stdout(iter(lambda: f.read(1 << 20), b""), "the dataset", f"gpu-dedup dataset {args.name} -o "
                              f"{args.name}.parquet", "the installed packages' files")
        info["path"] = STDOUT
    else:
        info = build(args.name, args.output)
    where = "standard output" if info["path"] == STDOUT else info["path"]
    print(f"{info['dataset']}: {info['documents']:,} documents, {info['text_mb']} MB of text -> {where}",
          file=sys.stderr if STDOUT in (args.output, args.info) else sys.stdout)  # stdout holds a file: not this
    if args.info == STDOUT:
        print(json.dumps(info, indent=2))
    elif args.info:
        from gpu_dedup.storage import atomic_write_bytes

        Path(args.info).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.info, (json.dumps(info, indent=2) + "\n").encode())
    return 0


def cmd_report(args) -> int:
    import os

    from gpu_dedup.report import schema
    from gpu_dedup.report.page import render
    from gpu_dedup.run.outdir import MANIFEST_NAME, replace_published
    from gpu_dedup.storage import atomic_write_bytes

    src = Path(args.report)
    if src.is_dir():
        src = src / "report.json"
    try:
        report = json.loads(src.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"cannot read {str(src)!r} ({exc.strerror}); give a report.json or the output directory "
                         "of a run") from None
    except ValueError as exc:
        raise InputError(f"{str(src)!r} is not valid JSON ({exc}); give the report.json a run wrote") from None
    except RecursionError:  # arrays or objects nested deeper than Python's json takes
        raise InputError(f"{str(src)!r} is nested too deeply to be a report.json; give the report.json a run "
                         "wrote") from None
    try:
        schema.check(report)
    except schema.ReportShapeError as exc:
        raise InputError(f"{str(src)!r} is not a report.json gpu_dedup can draw: {exc}; give the report.json a run "
                         "wrote (rerun the run to write it again)") from None
    page = render(report).encode("utf-8")
    if args.output == STDOUT:  # the page is text: it goes to stdout, a terminal or not, and nothing else does
        _write_stdout([page], "the page", f"gpu-dedup report {args.report} -o report.html", str(src))
        return 0
    out = Path(args.output) if args.output else src.with_suffix(".html")
    if (out.parent / MANIFEST_NAME).exists():  # a run's output directory: its page, owned as the run owns it
        replace_published(out.parent, out.name, page)
    else:
        if out.is_dir():
            raise OutputError(f"{str(out)!r} is a directory; give the page's file name with -o (e.g. report.html)")
        if os.path.lexists(out) and not _our_page(out):
            raise OutputError(f"{str(out)!r} exists and is not a gpu_dedup report page; it is not overwritten: "
                              "choose another -o or move the file away")
        atomic_write_bytes(out, page)
    print(f"wrote {out}")
    return 0


def _our_page(path: Path) -> bool:
    """Whether ``path`` is a report page gpu_dedup rendered (its title says so)."""
    try:
        with open(path, "rb") as f:
            return b"<title>gpu_dedup report:" in f.read(4096)
    except OSError:
        return False
