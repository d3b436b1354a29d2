"""Command line: ``gpu-dedup run | demo | config | evaluate | tune | dataset``."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import signal
import sys
from pathlib import Path

import yaml

from gpu_dedup.config import Config, preset_names
from gpu_dedup.errors import (
    EXIT_CODES,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TARGETS,
    ConfigError,
    GpuDedupError,
    InputError,
    ResourceError,
)

log = logging.getLogger("gpu_dedup")


def _add_no_id_column(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-id-column", action="store_true",
                   help=f"do not use an input column named {AUTO_ID!r} as document ids: documents are named by 'row'")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help=f"YAML file or preset name ({', '.join(preset_names())})")
    p.add_argument("--threshold", type=float, help="Jaccard threshold, or cosine under --similarity cosine "
                   "(lsh.threshold)")
    p.add_argument("--similarity", choices=["jaccard", "cosine"],
                   help="jaccard (MinHash of shingles) or cosine (random projections of vectors) (similarity)")
    p.add_argument("--vector-column", help="with --similarity cosine: list<float> column of embeddings "
                   "(input.vector_column); without it, tf-idf vectors of the text (cosine.text)")
    p.add_argument("--num-perm", type=int, help="MinHash permutations (minhash.num_perm)")
    p.add_argument("--ngram", type=int, help="shingle size (minhash.ngram)")
    p.add_argument("--shingle", choices=["word", "char"], help="shingle kind (minhash.shingle)")
    p.add_argument("--bands", type=int, help="LSH bands (lsh.bands; alone: rows = num_perm / bands)")
    p.add_argument("--rows", type=int, help="rows per band (lsh.rows; alone: bands = num_perm / rows)")
    p.add_argument("--verify", choices=["exact", "signature", "none"], help="verification (verify.method)")
    p.add_argument("--backend", choices=["auto", "cpu", "gpu"], help="backend")
    p.add_argument("--workers", type=int, help="run on a local Dask cluster of N workers (cluster.workers)")
    p.add_argument("--scheduler", help="join a running Dask scheduler at this address (cluster.scheduler)")
    p.add_argument("--text-column", help="text column (input.text_column)")
    p.add_argument("--id-column", help="id column (input.id_column), kept verbatim in the outputs beside 'row' "
                   "(every document's number); run and index build use a column named 'id' when the input has one")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config key, dotted: --set select.keep=longest (repeatable)")


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
            overrides[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            problem = str(exc).splitlines()[0]
            raise ConfigError(f"--set {item!r}: the value {value!r} is not valid YAML ({problem}); quote strings "
                              "that hold YAML punctuation, e.g. --set 'input.text_column=\"a: b\"'") from None
    return cfg.with_overrides(overrides) if overrides else cfg


class _ShuffleChatter(logging.Filter):
    """Drops the two lines Dask's P2P shuffle logs at WARNING for every shuffle it starts and ends
    (normal operation: ``Shuffle <id> initialized by task ...`` and ``... deactivated due to stimulus``;
    18 of them in a two-worker run).  Every other shuffle message, its errors included, passes."""

    ROUTINE = ("Shuffle %s initialized by task", "Shuffle %s deactivated due to stimulus")

    def filter(self, record) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.ROUTINE))


def _setup_logging(verbosity: int, quiet: bool) -> None:
    import os

    level = logging.WARNING if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    from gpu_dedup.run.progress import attach_to_handlers

    attach_to_handlers()  # log lines wipe a live progress line first (terminal)
    for noisy in ("numba", "distributed", "bokeh", "tornado"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if verbosity == 0:
        # Dask sets its loggers' levels when it is imported (by --workers / --scheduler runs, later): ask it for
        # WARNING there, in this process and in the worker processes, which inherit the environment; -v shows all
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        shuffle = logging.getLogger("distributed.shuffle._scheduler_plugin")
        if not any(isinstance(f, _ShuffleChatter) for f in shuffle.filters):
            shuffle.addFilter(_ShuffleChatter())


AUTO_ID = "id"  # an input column of this name names the documents when no id column is configured


def _with_id_column(args, cfg: Config) -> Config:
    """``run`` and ``index build`` without an id column configured: with ``--against``, the index's id
    column; else an input column named ``id`` when every shard has one of one type (said once, at INFO).
    ``--no-id-column`` keeps row numbers only."""
    if cfg.input.id_column is not None or args.no_id_column:
        return cfg
    against = getattr(args, "against", None)
    if against is not None:
        try:
            name = json.loads((Path(against) / "manifest.json").read_text(encoding="utf-8")).get("id_column", "id")
        except (OSError, ValueError, AttributeError):
            return cfg  # not an index: the run says so
        if name:
            log.info("using the input column %r as document ids, as the index %s does (--id-column)", name, against)
            return cfg.with_overrides({"input.id_column": name})
        return cfg
    from gpu_dedup.stages.read_shards import discover

    try:
        shards = discover(args.inputs, cfg.input.format)
    except GpuDedupError:
        return cfg  # the run reports it
    types = {_column_type(s, AUTO_ID) for s in shards}
    if len(types) != 1 or None in types:
        if len(types) > 1 and None not in types:
            log.info("the input column %r has different types across shards (%s); documents are named by row "
                     "number (--id-column %s after making it one type)", AUTO_ID, ", ".join(sorted(types)), AUTO_ID)
        return cfg
    log.info("using the input column %r as document ids (duplicates.parquet keeps it verbatim beside 'row'); "
             "--id-column COLUMN picks another, --no-id-column none", AUTO_ID)
    return cfg.with_overrides({"input.id_column": AUTO_ID})


def _column_type(shard, name: str) -> str | None:
    """The type of column ``name`` in a shard (Parquet: its schema; JSONL: the first record, where
    'any' stands for JSON's types), or None when the shard has no such column of an id-like type."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if shard.format == "parquet":
            schema = pq.read_schema(shard.path)
            if name not in schema.names:
                return None
            t = schema.field(name).type
            ok = (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
                  or pa.types.is_binary(t) or pa.types.is_large_binary(t))
            return str(t) if ok else None
        if shard.format == "jsonl":
            with pa.input_stream(shard.path, compression="detect") as f:
                head = f.read(1 << 16)
            for line in head.split(b"\n")[:-1] or [head]:  # the first complete record
                if line.strip():
                    record = json.loads(line)
                    value = record.get(name) if isinstance(record, dict) else None
                    return "any" if isinstance(value, (str, int)) and not isinstance(value, bool) else None
    except (OSError, ValueError, pa.ArrowException):
        return None  # the run reports an unreadable shard
    return None


def cmd_run(args) -> int:
    from gpu_dedup.index.commands import run
    from gpu_dedup.report.build import summary

    cfg = _with_id_column(args, _config_from_args(args))
    result = run(args.inputs, args.output, cfg, restart=args.restart, index_out=args.index_out,
                 against=args.against, update_index=args.update_index)
    if not args.quiet:
        print(summary(result.report))
        written = (["deduplicated shards"] if cfg.output.shards else []) + \
            (["duplicates.parquet"] if cfg.output.duplicates_table else []) + ["report.json", "report.html"]
        print(f"outputs in {result.output_dir}/ ({', '.join(written)})")
    return 0


def cmd_demo(args) -> int:
    from gpu_dedup.demo import run_demo

    cfg = _config_from_args(args)
    return run_demo(Path(args.output), cfg, docs=args.docs, quiet=args.quiet)


def cmd_bench_skew(args) -> int:
    from gpu_dedup.bench import skew

    skew.run(args.sizes, args.results, args.workdir)
    return 0


def cmd_index_build(args) -> int:
    import tempfile

    from gpu_dedup.index.commands import run

    cfg = _with_id_column(args, _config_from_args(args))
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args.inputs, tmp, cfg, index_out=args.output, write_shards=False)
    c = result.report["counts"]
    if not args.quiet:
        print(f"indexed {c['documents_read']:,} documents ({c['kept']:,} kept, {c['removed']:,} duplicates) "
              f"in {args.output}")
    return 0


def cmd_index_info(args) -> int:
    import json

    from gpu_dedup.index.store import Index

    print(json.dumps(Index.open(args.index).info(), indent=2))
    return 0


def cmd_query(args) -> int:
    import json

    import numpy as np
    import pyarrow as pa

    from gpu_dedup.errors import InputError
    from gpu_dedup.index.store import Index

    index = Index.open(args.index)
    try:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"cannot read the queries in {args.file!r} ({exc.strerror}); give a text file, one "
                         "query per line (or JSONL with --jsonl), or - for stdin") from None
    with stream:
        lines = [line.rstrip("\n") for line in stream]
    by_vector = index.similarity == "cosine" and index.manifest["config"].get("source") == "vectors"
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
    for q, recs in enumerate(found):
        recs.sort(key=lambda r: (-r["similarity"], r["row"]))
        print(json.dumps({"query": q, "matches": recs}, default=str))
    if not args.quiet:
        hit = sum(1 for recs in found if recs)
        t = args.threshold if args.threshold is not None else index.config().lsh.threshold
        print(f"{hit:,} of {len(texts):,} queries matched an indexed document (similarity >= {t}); "
              f"{len(texts) - hit:,} had no match", file=sys.stderr)
    return 0


def _jsonl_texts(lines: list[str], column: str, source: str) -> list:
    """The ``column`` of each non-blank JSON line; a line that is no JSON object with it is an InputError."""
    from gpu_dedup.errors import InputError

    texts = []
    for number, line in enumerate(lines, 1):  # queries: a few thousand lines at most
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise InputError(f"line {number} of {source!r} is not valid JSON ({exc}); give one JSON object per "
                             "line, or drop --jsonl for plain text (one query per line)") from None
        if not isinstance(record, dict) or column not in record:
            raise InputError(f"line {number} of {source!r} has no {column!r} field; name the text field with "
                             "--text-column")
        texts.append(record[column])
    return texts


def cmd_bench_workers(args) -> int:
    from gpu_dedup.bench import workers

    workers.run(args.documents, args.workers, args.memory_limit, args.block_rows, args.results, args.workdir)
    return 0


def cmd_bench_peers(args) -> int:
    from gpu_dedup.bench import peers

    cfg = _config_from_args(args)
    if args.backend is None:
        cfg = cfg.with_overrides({"backend": "cpu"})
    peers.run(sizes=args.sizes, peer_max_docs=args.peer_max_docs, real=None if args.real == "none" else args.real,
              tools=args.tools, quality_sample=args.quality_sample, quality_max_docs=args.quality_max_docs,
              sig_docs=args.signature_docs, datasketch_sig_docs=args.datasketch_signature_docs,
              results=args.results, workdir=args.workdir, config=cfg)
    return 0


def cmd_bench_index(args) -> int:
    from gpu_dedup.bench import index

    index.run(args.documents, args.queries, args.single, args.results, args.workdir)
    return 0


def cmd_bench_own_parser(args) -> int:
    """The benchmarks with their own argument parser (``main(argv)``): the rest of the command line is theirs."""
    from gpu_dedup.bench import cosine, gpu, signatures, stages

    mains = {"stages": stages.main, "signatures": signatures.main, "cosine": cosine.main, "gpu": gpu.main}
    return mains[args.bench](args.bench_args)


def cmd_config(args) -> int:
    cfg = _config_from_args(args)
    bands, rows = cfg.layout
    print(cfg.to_yaml(), end="")
    print(f"# derived: bands={bands} rows={rows} permutations_computed={cfg.signature_perms} "
          f"verify_threshold={cfg.verify_threshold} fingerprint={cfg.fingerprint}")
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
    if args.output is None:  # the default directory, in the current one: say so before anything is written
        args.output = TUNE_DIR
        if not args.quiet:
            print(f"writing tune.json and tune.png to {Path(TUNE_DIR).resolve()}/ (the default; -o DIR to choose)")
    if cfg.similarity == "cosine":
        return _tune_cosine(cfg, args)
    result = tune(cfg, top=args.top, output_dir=args.output, sample_inputs=args.sample, sample=args.sample_size,
                  seed=args.seed, confirm=args.confirm, floor=args.floor, plot=not args.no_plot)
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
    from gpu_dedup.evaluation.datasets import build

    info = build(args.name, args.output)
    print(f"{info['dataset']}: {info['documents']:,} documents, {info['text_mb']} MB of text -> {info['path']}")
    if args.info:
        from gpu_dedup.stages.write_shards import atomic_write_bytes

        Path(args.info).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.info, (json.dumps(info, indent=2) + "\n").encode())
    return 0


def cmd_report(args) -> int:
    from gpu_dedup.errors import InputError
    from gpu_dedup.report.page import write_html

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
    if not isinstance(report, dict) or "counts" not in report or "lsh" not in report:
        raise InputError(f"{str(src)!r} is not a gpu_dedup report.json (no counts / lsh sections)")
    out = write_html(Path(args.output) if args.output else src.with_suffix(".html"), report)
    print(f"wrote {out}")
    return 0


QUERY_OUTPUT = """output: one JSON object per query on stdout, in input order (JSONL input: its non-blank
lines), with its matches best first; a query without a match has an empty list:
  {"query": 0, "matches": [{"row": 812, "id": "doc-812", "similarity": 1.0, "exact": true,
                            "kept": true, "cluster_id": 812, "survivor_id": "doc-812"}]}
  {"query": 1, "matches": []}
row: the indexed document's number; its id appears under the index's id column name (when the
index was built with one); cluster_id: the row of the survivor of its cluster.  A summary line
("N of M queries matched ...") goes to stderr unless -q.
exit status: 0 when every query was looked up, matched or not; non-zero with a one-line message
on stderr when the queries could not be run (no index, unreadable input, invalid JSON)."""


class _Parser(argparse.ArgumentParser):
    """Options anywhere on a command's line, before, between or after its positionals
    (``query INDEX --jsonl FILE``): argparse's intermixed parsing, for the commands without
    sub-commands."""

    def parse_known_args(self, args=None, namespace=None):
        if getattr(self, "_mixing", False) or any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


EXIT_STATUS = "exit status:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()) + \
    "\nevery error a user can cause ends in one line on stderr naming the problem and the fix (-v adds detail)."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-dedup", description="Near-duplicate removal with MinHash + LSH.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_STATUS)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('gpu_dedup').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="deduplicate Parquet / JSONL shards")
    p.add_argument("inputs", nargs="+", help="shard files, directories or glob patterns")
    p.add_argument("-o", "--output", required=True, help="output directory")
    p.add_argument("--restart", action="store_true",
                   help="ignore checkpoints of an interrupted run in the output directory and start over")
    p.add_argument("--index-out", help="also write a persisted index of the inputs to this directory")
    p.add_argument("--against", metavar="INDEX", help="deduplicate against a persisted index (indexed documents win)")
    p.add_argument("--update-index", action="store_true", help="with --against: append the inputs to the index")
    p.add_argument("--no-shards", action="store_true",
                   help="write no deduplicated shards, only duplicates.parquet (which rows to remove) and the report "
                        "(output.shards: false)")
    _add_config_args(p)
    _add_no_id_column(p)
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="run on the bundled planted-cluster sample and score recall")
    p.add_argument("-o", "--output", default="gpu-dedup-demo", help="directory for the sample and results")
    p.add_argument("--docs", type=int, default=3000, help="sample size (default 3000)")
    _add_config_args(p)
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks (see gpu_dedup/bench)")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("skew", help="10%% one boilerplate text + 10%% empty documents, growth with size")
    b.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    b.add_argument("--results", default="bench-results", help="directory for JSON + Markdown results")
    b.add_argument("--workdir", help="where to put generated corpora (default: system temp)")
    b.set_defaults(func=cmd_bench_skew, quiet=False, verbose=0)

    b = bench.add_parser("index", help="index size, open time, single-query latency, batch throughput")
    b.add_argument("--documents", type=int, default=1_000_000)
    b.add_argument("--queries", type=int, default=10_000)
    b.add_argument("--single", type=int, default=200, help="queries timed one at a time")
    b.add_argument("--results", default="bench-results")
    b.add_argument("--workdir")
    b.set_defaults(func=cmd_bench_index, quiet=False, verbose=0)

    b = bench.add_parser("workers", help="one process vs N Dask workers (identical outputs), or under memory limits")
    b.add_argument("--documents", type=int, default=200_000)
    b.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    b.add_argument("--memory-limit", help="per-worker limit, e.g. 2GiB (runs only the worker configurations)")
    b.add_argument("--block-rows", type=int, default=100_000)
    b.add_argument("--results", default="bench-results")
    b.add_argument("--workdir")
    b.set_defaults(func=cmd_bench_workers, quiet=False, verbose=0)

    b = bench.add_parser("peers", help="gpu_dedup vs rensa and datasketch: end to end, signatures, quality, scaling")
    b.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                   help="planted-corpus sizes (documents)")
    b.add_argument("--peer-max-docs", type=int, default=100_000, help="largest corpus the peers run on")
    b.add_argument("--real", default="debian-man", help="real corpus from installed Debian packages, or 'none'")
    b.add_argument("--tools", nargs="+", default=["gpu_dedup", "rensa", "datasketch"],
                   choices=["gpu_dedup", "rensa", "datasketch"])
    b.add_argument("--quality-sample", type=int, default=5000, help="documents sampled for recall/precision")
    b.add_argument("--quality-max-docs", type=int, default=200_000, help="score quality on corpora up to this size")
    b.add_argument("--signature-docs", type=int, default=100_000,
                   help="signature stage on the planted corpus closest to this size")
    b.add_argument("--datasketch-signature-docs", type=int, default=20_000,
                   help="datasketch's signature stage on this many of them (it is slow)")
    b.add_argument("--results", default="bench-results")
    b.add_argument("--workdir")
    _add_config_args(b)
    b.set_defaults(func=cmd_bench_peers, quiet=False, verbose=0)

    for name, text in (("stages", "read, normalize and write, each beside its own limit on the same data"),
                       ("signatures", "signature stage per CPU second against rensa and datasketch; hash families"),
                       ("cosine", "random-hyperplane LSH against FAISS and exact cosine on embeddings and text"),
                       ("gpu", "signature throughput per backend: CPU, GPU, cuDF where usable")):
        b = bench.add_parser(name, help=text + f" (gpu-dedup bench {name} --help)", add_help=False)
        b.set_defaults(func=cmd_bench_own_parser, bench_args=[], quiet=True, verbose=0)

    p = sub.add_parser("index", help="build or inspect a persisted index")
    ix = p.add_subparsers(dest="index_command", required=True)
    b = ix.add_parser("build", help="deduplicate a corpus and persist it as an index (no shards written)")
    b.add_argument("inputs", nargs="+")
    b.add_argument("-o", "--output", required=True, help="index directory (must not hold an index yet)")
    _add_config_args(b)
    _add_no_id_column(b)
    b.add_argument("-q", "--quiet", action="store_true")
    b.set_defaults(func=cmd_index_build, verbose=0)
    b = ix.add_parser("info", help="print an index's size, segments and config")
    b.add_argument("index")
    b.set_defaults(func=cmd_index_info, quiet=True, verbose=0)

    p = sub.add_parser(
        "query", help="find indexed documents similar to texts (one per line, or JSONL)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=QUERY_OUTPUT)
    p.add_argument("index")
    p.add_argument("file", nargs="?", default="-", help="text file, one document per line (default: stdin)")
    p.add_argument("--jsonl", action="store_true", help="input lines are JSON objects; read --text-column")
    p.add_argument("--text-column", default="text")
    p.add_argument("--vector-column", help="a cosine index of vectors: the JSONL key holding each query's vector "
                   "(default: the index's input.vector_column)")
    p.add_argument("--threshold", type=float, help="minimum similarity (default: the index's threshold)")
    p.add_argument("--members", type=int, default=8, help="documents compared per matching index bucket")
    p.add_argument("-q", "--quiet", action="store_true", help="no summary line on stderr")
    p.set_defaults(func=cmd_query, verbose=0)

    p = sub.add_parser("evaluate", help="measure recall and precision against exact all-pairs Jaccard on a sample")
    p.add_argument("inputs", nargs="+", help="shard files, directories or glob patterns")
    p.add_argument("-o", "--output", required=True, help="directory for evaluation.json and evaluation.png")
    p.add_argument("--sample", type=int, default=10000, help="documents to sample (default 10000; 0: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--floor", type=float, help="lowest exact similarity enumerated (default min(0.3, threshold))")
    p.add_argument("--label-column", help="column of known cluster labels: adds the adjusted Rand index against them")
    p.add_argument("--compare-split-chains", action="store_true",
                   help="also score a run with select.split_chains flipped")
    p.add_argument("--lsh-seeds", type=int, default=1,
                   help="also measure the candidate rate per bin with this many MinHash seeds (mean and spread)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("--keep-runs", action="store_true", help="keep the pipeline outputs on the sample (OUTPUT/runs)")
    p.add_argument("--require-targets", action="store_true",
                   help="exit 6 when a target is missed (precision 1.0 of verified edges, recall >= 0.99 at t+0.05)")
    _add_config_args(p)
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("tune", help="compare LSH layouts (bands x rows) for a threshold and pick one")
    _add_config_args(p)
    p.add_argument("--fp-weight", type=float, help="weight of the false-positive area (lsh.fp_weight)")
    p.add_argument("--fn-weight", type=float, help="weight of the false-negative area (lsh.fn_weight)")
    p.add_argument("--top", type=int, default=6, help="cheapest layouts to list besides the pick's neighbours")
    p.add_argument("--documents", type=int, help="with --similarity cosine: rows of the run (derives cosine.min_rows "
                   "as the run does)")
    p.add_argument("-o", "--output", help=f"directory for tune.json and tune.png (default: {TUNE_DIR} in the "
                   "current directory)")
    p.add_argument("--sample", metavar="CORPUS", nargs="+", help="confirm the top layouts on a sample of this corpus")
    p.add_argument("--sample-size", type=int, default=5000, help="documents sampled for --sample (default 5000)")
    p.add_argument("--confirm", type=int, default=3, help="layouts run on the sample (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floor", type=float, help="lowest exact similarity enumerated (default min(0.3, threshold))")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_tune)

    from gpu_dedup.evaluation.datasets import DATASETS

    p = sub.add_parser("dataset", help="build a real evaluation corpus from installed Debian packages")
    p.add_argument("name", choices=sorted(DATASETS), help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("-o", "--output", required=True, help="Parquet file to write")
    p.add_argument("--info", help="also write a JSON description (size, source fingerprint, installed packages)")
    p.set_defaults(func=cmd_dataset, quiet=False, verbose=0)

    p = sub.add_parser("report", help="(re)write report.html from a run's report.json")
    p.add_argument("report", help="report.json, or the output directory of a run")
    p.add_argument("-o", "--output", help="HTML file to write (default: report.html beside report.json)")
    p.set_defaults(func=cmd_report, quiet=True, verbose=0)

    p = sub.add_parser("config", help="print the resolved configuration (with derived values)")
    _add_config_args(p)
    p.set_defaults(func=cmd_config, quiet=True, verbose=0)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"gpu-dedup: error: {message}", file=sys.stderr)
    return code


def _os_error(exc: OSError, output=None) -> GpuDedupError | None:
    """An OS error a user can act on (disk full, read-only, missing file) as one clear error; else None.
    ``output``: the command's output path, named when the error does not say which file (Arrow's writers)."""
    from gpu_dedup.stages.write_shards import write_error

    where = exc.filename if exc.filename is not None else (f"a file in {output}" if output else "a file")
    mapped = write_error(where, exc)
    if mapped is not exc:
        return mapped
    if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG):
        return InputError(f"cannot use {str(where)!r} ({exc.strerror}); check the path")
    if exc.errno == errno.ENOMEM:
        return ResourceError(f"out of memory ({exc.strerror}); free memory or split the input")
    return None


# path arguments an empty string must not stand for (-c "" is allowed: the default config)
PATH_OPTIONS = {"output": "-o", "index_out": "--index-out", "against": "--against", "index": "INDEX"}


def _refuse_empty_paths(args) -> None:
    """An empty path (often an unset shell variable, -o "$OUT") would mean the current directory; refuse it."""
    for attr, flag in PATH_OPTIONS.items():
        value = getattr(args, attr, None)
        if value == "":
            dot = f"{flag} ." if flag.startswith("-") else "."
            raise ConfigError(f"{flag} is given the empty path {value!r} (an unset shell variable?); give a path "
                              f"({dot} for the current directory)")


def _signal_to_interrupt(signum, frame):  # SIGTERM ends a run as Ctrl-C does: checkpoints stay consistent
    raise KeyboardInterrupt


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if rest and getattr(args, "func", None) is not cmd_bench_own_parser:
        parser.error("unrecognized arguments: " + " ".join(rest))
    if rest:
        args.bench_args = rest
    _setup_logging(args.verbose, args.quiet)
    if argv is None:  # the gpu-dedup process itself (not a caller's main([...])): SIGTERM as Ctrl-C
        signal.signal(signal.SIGTERM, _signal_to_interrupt)
    try:
        _refuse_empty_paths(args)
        return args.func(args)
    except GpuDedupError as exc:
        return _fail(str(exc), exc.exit_code)
    except KeyboardInterrupt:
        return _fail("interrupted; completed stages are checkpointed and the previous complete output (if any) is "
                     "untouched: rerun the same command to resume", EXIT_INTERRUPTED)
    except MemoryError as exc:
        return _fail(f"out of memory ({exc or 'allocation failed'}); free memory, split the input into smaller "
                     "shards or use --workers with a lower cluster.block_rows", ResourceError.exit_code)
    except OSError as exc:
        mapped = _os_error(exc, getattr(args, "index_out", None) or getattr(args, "output", None))
        if mapped is None:
            raise
        if args.verbose:
            log.debug("details", exc_info=True)
        return _fail(str(mapped), mapped.exit_code)
    except Exception:
        log.critical("internal error (a bug in gpu_dedup; please report it with this traceback):", exc_info=True)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
