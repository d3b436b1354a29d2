"""The argument parser of ``gpu-dedup``: every subcommand, option and help text."""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from gpu_dedup.cli.commands import (
    AUTO_ID,
    TUNE_DIR,
    cmd_bench_index,
    cmd_bench_own_parser,
    cmd_bench_peers,
    cmd_bench_skew,
    cmd_bench_workers,
    cmd_config,
    cmd_dataset,
    cmd_demo,
    cmd_evaluate,
    cmd_index_build,
    cmd_index_info,
    cmd_query,
    cmd_report,
    cmd_run,
    cmd_tune,
)
from gpu_dedup.bench.argtypes import at_least, non_negative_int, positive_int
from gpu_dedup.config import ClusterConfig, preset_names
from gpu_dedup.errors import (
    EXIT_CODES,
)


PLANTED = at_least(6)  # documents of a planted corpus: its first cluster takes up to 6


def _add_no_id_column(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-id-column", action="store_true",
                   help=f"do not use an input column named {AUTO_ID!r} as document ids: documents are named by 'row'")


def _add_config_args(p: argparse.ArgumentParser, columns: bool = True) -> None:
    """The config options; ``columns``: also those naming input columns (not for the demo, whose sample it writes)."""
    p.add_argument("--config", "-c", help=f"YAML file or preset name ({', '.join(preset_names())})")
    p.add_argument("--threshold", type=float, help="Jaccard threshold, or cosine under --similarity cosine "
                   "(lsh.threshold)")
    p.add_argument("--similarity", choices=["jaccard", "cosine"],
                   help="jaccard (MinHash of shingles) or cosine (random projections of vectors) (similarity)")
    if columns:
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
    p.add_argument("--workers-per-gpu", type=int, metavar="K",
                   help="with --backend gpu: K of the --workers share each GPU (cluster.workers_per_gpu)")
    p.add_argument("--scheduler", help="join a running Dask scheduler at this address (cluster.scheduler)")
    if columns:
        p.add_argument("--text-column", help="text column (input.text_column)")
        p.add_argument("--id-column", help="id column (input.id_column), kept verbatim in the outputs beside 'row' "
                       "(every document's number); run and index build use a column named 'id' when the input has "
                       "one")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config key, dotted: --set select.keep=longest (repeatable)")


def _add_quiet_verbose(p: argparse.ArgumentParser) -> None:
    """-q and -v, one or the other (argparse says so when both are given)."""
    talk = p.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    talk.add_argument("-v", "--verbose", action="count", default=0,
                      help="more detail: gpu_dedup's debug lines, other libraries' info")


QUERY_OUTPUT = """input: plain text is one query per line (a newline ends a query: an 8-line text is 8 queries);
with --jsonl, one JSON object per non-blank line, its --text-column holding the whole text.
output: one JSON object per query on stdout, in input order (JSONL input: its non-blank
lines), with its matches best first; a query without a match has an empty list:
  {"query": 0, "matches": [{"row": 812, "id": "doc-812", "similarity": 1.0, "exact": true,
                            "kept": true, "cluster_id": 812, "survivor_id": "doc-812"}]}
  {"query": 1, "matches": []}
row: the indexed document's number; its id appears under the index's id column name (when the
index was built with one); cluster_id: the row of the survivor of its cluster.  A summary line
("N of M queries matched ...") goes to stderr unless -q.
exit status: 0 when every query was looked up, matched or not; non-zero with a one-line message
on stderr when the queries could not be run (no index, unreadable input, invalid JSON)."""


_NUMBER = re.compile(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+([eE][-+]?\d+)?")  # a negative number is a value


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def _unknown_flags(parser: argparse.ArgumentParser, tokens) -> list[str]:
    """The tokens (up to ``--``) that look like options and that no option of ``parser`` takes, as argparse
    reads them: an unambiguous prefix of a long option is that option, ``-vv`` is ``-v -v``."""
    known = parser._option_string_actions
    longs = [o for o in known if o.startswith("--")]
    unknown = []
    for token in tokens:
        if token == "--":
            break
        if not token.startswith("-") or token == "-" or _NUMBER.fullmatch(token):
            continue
        name = token.split("=", 1)[0]
        if name in known or (name.startswith("--") and parser.allow_abbrev and any(o.startswith(name) for o in longs)):
            continue
        if not name.startswith("--") and name[:2] in known:  # -vv, -ofile: a short option and more
            continue
        unknown.append(name)
    return unknown


def _flag_hint(parser: argparse.ArgumentParser, flag: str) -> str | None:
    """``--ouput`` -> ``--ouput: did you mean --output (-o)?``: the option a misspelt flag most likely meant."""
    longs = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(flag if flag.startswith("--") else "-" + flag, longs, n=1, cutoff=0.75)
    if not close:
        return None
    aliases = [o for o in parser._option_string_actions[close[0]].option_strings if o != close[0]]
    return f"{flag}: did you mean {close[0]}{' (' + ', '.join(aliases) + ')' if aliases else ''}?"


def _unrecognized_message(parser: argparse.ArgumentParser, flags: list) -> str:
    hints = [h for h in (_flag_hint(parser, f) for f in flags) if h]
    return f"unrecognized option{'s' if len(flags) > 1 else ''} {' '.join(flags)}" + \
        ("; " + "; ".join(hints) if hints else f"; {parser.prog} --help lists the options")


class _Parser(argparse.ArgumentParser):
    """Options anywhere on a command's line, before, between or after its positionals
    (``query INDEX --jsonl FILE``): argparse's intermixed parsing, for the commands without
    sub-commands.  A misspelt sub-command or option is named with the one it most likely meant: an
    invalid choice gets ``did you mean``, and a command's error (a required option missing, say)
    names first the options on its line that it does not have (``--ouput``: not "-o is required")."""

    def parse_known_args(self, args=None, namespace=None):
        if not getattr(self, "_mixing", False):
            self._tokens = list(sys.argv[1:] if args is None else args)
        if getattr(self, "_mixing", False) or _has_subcommands(self):
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            choices = [str(c) for c in action.choices]
            close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}{hint} (choose from "
                                                 f"{', '.join(map(repr, choices))})")
        return super()._check_value(action, value)

    def error(self, message):
        if not message.startswith("unrecognized"):
            tokens = list(getattr(self, "_tokens", ()))
            if _has_subcommands(self):  # its own options come before the sub-command
                tokens = tokens[:next((i for i, t in enumerate(tokens) if not t.startswith("-")), len(tokens))]
            flags = _unknown_flags(self, tokens)
            if flags:  # the likely cause of what argparse saw (a value taken as a positional, -o missing)
                message = _unrecognized_message(self, flags)
        super().error(message)


class _Deprecated(argparse.Action):
    """An old spelling of an option that still works, with one line on stderr naming the new one."""

    def __init__(self, option_strings, dest, new: str = "", **kwargs):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new} (same meaning)", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _chosen_parser(parser: argparse.ArgumentParser, args) -> argparse.ArgumentParser:
    """The (sub)command parser ``args`` were parsed by: ``gpu-dedup bench peers``'s, not the top level's."""
    current = parser
    while True:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return current
        name = getattr(args, subs[0].dest, None)
        if name not in subs[0].choices:
            return current
        current = subs[0].choices[name]


def unrecognized(parser: argparse.ArgumentParser, args, rest: list) -> None:
    """Exit 2 on arguments no option takes, on the usage of the subcommand they were given to, with the
    option each misspelled flag most likely meant (``--treshold`` -> ``--threshold``)."""
    sub = _chosen_parser(parser, args)
    hints = [h for h in (_flag_hint(sub, f) for f in _unknown_flags(sub, rest)) if h]
    sub.error("unrecognized arguments: " + " ".join(rest) + ("" if not hints else "; " + "; ".join(hints)))


EXIT_STATUS = "exit status:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in EXIT_CODES.items()) + \
    "\nevery error a user can cause ends in one line on stderr naming the problem and the fix (-v adds detail)."


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpu-dedup", description="Near-duplicate removal with MinHash + LSH.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXIT_STATUS)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('gpu_dedup').__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("run", help="deduplicate Parquet / JSONL / Arrow shards")
    p.add_argument("inputs", nargs="+", help="shard files (.parquet, .jsonl[.gz|.bz2|.zst], .arrow), directories "
                   "(one saved with datasets' save_to_disk too) or glob patterns, local or object-store URLs "
                   "(s3://bucket/crawl/, gs://..., hf://datasets/OWNER/NAME/...; docs/object-storage.md)")
    p.add_argument("-o", "--output", required=True, help="output directory, or an object-store prefix (s3://bucket/out/)")
    p.add_argument("--restart", action="store_true",
                   help="ignore checkpoints of an interrupted run in the output directory and start over")
    p.add_argument("--index-out", help="also write a persisted index of the inputs to this directory (or URL)")
    p.add_argument("--against", metavar="INDEX", help="deduplicate against a persisted index, a directory or URL "
                   "(indexed documents win)")
    p.add_argument("--update-index", action="store_true", help="with --against: append the inputs to the index")
    p.add_argument("--no-shards", action="store_true",
                   help="write no deduplicated shards, only duplicates.parquet (which rows to remove) and the report "
                        "(output.shards: false)")
    _add_config_args(p)
    _add_no_id_column(p)
    _add_quiet_verbose(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="run on the bundled planted-cluster sample and score recall")
    p.add_argument("-o", "--output", default="gpu-dedup-demo",
                   help="directory for the sample and results (default: gpu-dedup-demo)")
    p.add_argument("--docs", type=int, default=3000, help="sample size (default 3000)")
    _add_config_args(p, columns=False)  # the sample's columns are its own: id and text
    _add_quiet_verbose(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="benchmarks (see gpu_dedup/bench)")
    bench = p.add_subparsers(dest="bench", required=True)
    b = bench.add_parser("skew", help="10%% one boilerplate text + 10%% empty documents, growth with size")
    b.add_argument("--sizes", type=positive_int, nargs="+", default=[10_000, 100_000, 1_000_000])
    b.add_argument("--results", default="bench-results", help="directory for JSON + Markdown results")
    b.add_argument("--workdir", help="where to put generated corpora (default: system temp)")
    b.set_defaults(func=cmd_bench_skew, quiet=False, verbose=0)

    b = bench.add_parser("index", help="index size, open time, single-query latency, batch throughput")
    b.add_argument("--documents", type=positive_int, default=1_000_000)
    b.add_argument("--queries", type=positive_int, default=10_000)
    b.add_argument("--single", type=positive_int, default=200, help="queries timed one at a time")
    b.add_argument("--results", default="bench-results")
    b.add_argument("--workdir")
    b.set_defaults(func=cmd_bench_index, quiet=False, verbose=0)

    b = bench.add_parser("workers", help="Dask workers vs one process as the corpus grows: client and worker "
                                          "memory, shuffle volume, wall time (identical outputs)")
    b.add_argument("--documents", type=PLANTED, nargs="+", default=[100_000], help="corpus sizes, e.g. 100000 1000000")
    b.add_argument("--workers", type=positive_int, default=2)
    b.add_argument("--memory-limit", help="per-worker limit, e.g. 2GiB")
    b.add_argument("--block-rows", type=positive_int, default=ClusterConfig.block_rows,
                   help="cluster.block_rows (default: the run's, %(default)s)")
    b.add_argument("--boilerplate", type=float, default=0.0,
                   help="also a variant with this share of boilerplate copies and near copies, e.g. 0.2")
    b.add_argument("--single-up-to", type=non_negative_int, default=1_000_000,
                   help="run one process (the reference) for corpora up to this size")
    b.add_argument("--no-running", dest="running", action="store_false",
                   help="skip the runs that join a cluster started before each of them (--scheduler), which leave "
                        "out a local cluster's start and close")
    b.add_argument("--repeat", type=positive_int, default=1,
                   help="runs of each configuration, one of each in turn; the table gives their median wall time")
    b.add_argument("--results", default="bench-results")
    b.add_argument("--workdir")
    b.set_defaults(func=cmd_bench_workers, quiet=False, verbose=0)

    b = bench.add_parser("peers", help="gpu_dedup vs rensa, datasketch and datatrove: end to end, signatures, quality, "
                         "scaling")
    b.add_argument("--sizes", type=PLANTED, nargs="+", default=[10_000, 100_000, 1_000_000],
                   help="planted-corpus sizes (documents)")
    b.add_argument("--peer-max-docs", type=non_negative_int, default=100_000, help="largest corpus the peers run on")
    b.add_argument("--layouts", nargs="+", default=["files"], choices=["files", "one-row-group", "many-row-groups"],
                   help="shard layouts of the planted corpora: files of 10^5 documents (one row group each), or "
                        "one file with one row group, or one file with row groups of 10^4 documents")
    b.add_argument("--real", default="debian-man", help="real corpus from installed Debian packages, or 'none'")
    b.add_argument("--tools", nargs="+", default=["gpu_dedup", "rensa", "datasketch"],
                   choices=["gpu_dedup", "rensa", "datasketch", "datatrove"],
                   help="tools to run (default: gpu_dedup rensa datasketch; datatrove runs on the planted corpora)")
    b.add_argument("--quality-sample", type=positive_int, default=5000, help="documents sampled for recall/precision")
    b.add_argument("--quality-max-docs", type=non_negative_int, default=200_000,
                   help="score quality on corpora up to this size")
    b.add_argument("--signature-docs", type=positive_int, default=100_000,
                   help="signature stage on the planted corpus closest to this size")
    b.add_argument("--datasketch-signature-docs", type=positive_int, default=20_000,
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
    p.add_argument("file", nargs="?", default="-",
                   help="text file, one document per line: a text spanning several lines is several queries "
                        "(give such texts as JSON Lines with --jsonl); default: stdin")
    p.add_argument("--jsonl", action="store_true", help="input lines are JSON objects; read --text-column")
    p.add_argument("--text-column", help="with --jsonl: the key holding each query's text (default: text)")
    p.add_argument("--vector-column", help="a cosine index of vectors: the JSONL key holding each query's vector "
                   "(default: the index's input.vector_column)")
    p.add_argument("--threshold", type=float, help="minimum similarity (default: the index's threshold; below "
                   "it, a warning gives the chance that the index's LSH finds a pair at this similarity)")
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
    _add_quiet_verbose(p)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("tune", help="compare LSH layouts (bands x rows) for a threshold and pick one")
    _add_config_args(p)
    p.add_argument("--fp-weight", type=float, help="weight of the false-positive area (lsh.fp_weight)")
    p.add_argument("--fn-weight", type=float, help="weight of the false-negative area (lsh.fn_weight)")
    p.add_argument("--top", type=non_negative_int, default=6,
                   help="cheapest layouts to list besides the pick's neighbours (default 6)")
    p.add_argument("--documents", type=positive_int,
                   help="with --similarity cosine: rows of the run (derives cosine.min_rows "
                   "as the run does)")
    p.add_argument("-o", "--output", help=f"directory for tune.json and tune.png (default: {TUNE_DIR} in the "
                   "current directory)")
    p.add_argument("--sample-corpus", metavar="CORPUS", nargs="+", dest="sample",
                   help="confirm the top layouts on a sample of this corpus (files, directories or globs)")
    p.add_argument("--sample", metavar="CORPUS", nargs="+", dest="sample", action=_Deprecated, new="--sample-corpus",
                   help=argparse.SUPPRESS)  # the old spelling; --sample is a count in evaluate
    # no defaults here (tune's own apply): given without --sample-corpus they are refused, not ignored
    p.add_argument("--sample-size", type=int,
                   help="documents sampled from --sample-corpus (default 5000)")
    p.add_argument("--confirm", type=positive_int, help="layouts run on the sample (default 3)")
    p.add_argument("--seed", type=int, help="sampling seed of --sample-corpus (default 0)")
    p.add_argument("--floor", type=float, help="lowest exact similarity enumerated (default min(0.3, threshold))")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    _add_quiet_verbose(p)
    p.set_defaults(func=cmd_tune)

    from gpu_dedup.evaluation.datasets import DATASETS

    p = sub.add_parser("dataset", help="build a real evaluation corpus from installed Debian packages")
    p.add_argument("name", choices=sorted(DATASETS), help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("-o", "--output", required=True, help="Parquet file to write, or - for stdout (not a terminal)")
    p.add_argument("--info", help="also write a JSON description (size, source fingerprint, installed packages) to "
                   "this file, or - for stdout")
    p.set_defaults(func=cmd_dataset, quiet=False, verbose=0)

    p = sub.add_parser("report", help="(re)write report.html from a run's report.json")
    p.add_argument("report", help="report.json, or the output directory of a run")
    p.add_argument("-o", "--output", help="HTML file to write, or - for stdout (default: report.html beside "
                   "report.json)")
    p.set_defaults(func=cmd_report, quiet=True, verbose=0)

    p = sub.add_parser("config", help="print the resolved configuration (with derived values)")
    _add_config_args(p)
    p.set_defaults(func=cmd_config, quiet=True, verbose=0)
    return parser
