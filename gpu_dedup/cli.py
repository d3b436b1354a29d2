"""Command line: ``gpu-dedup run | demo | config | evaluate | tune | dataset``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import yaml

from .config import Config, preset_names
from .errors import GpuDedupError

log = logging.getLogger("gpu_dedup")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", help=f"YAML file or preset name ({', '.join(preset_names())})")
    p.add_argument("--threshold", type=float, help="Jaccard threshold (lsh.threshold)")
    p.add_argument("--num-perm", type=int, help="MinHash permutations (minhash.num_perm)")
    p.add_argument("--ngram", type=int, help="shingle size (minhash.ngram)")
    p.add_argument("--shingle", choices=["word", "char"], help="shingle kind (minhash.shingle)")
    p.add_argument("--bands", type=int, help="LSH bands (lsh.bands; give --rows too)")
    p.add_argument("--rows", type=int, help="rows per band (lsh.rows; give --bands too)")
    p.add_argument("--verify", choices=["exact", "signature", "none"], help="verification (verify.method)")
    p.add_argument("--backend", choices=["auto", "cpu", "gpu"], help="backend")
    p.add_argument("--text-column", help="text column (input.text_column)")
    p.add_argument("--id-column", help="id column (input.id_column); default: generated row numbers")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config key, dotted: --set select.keep=longest (repeatable)")


def _config_from_args(args) -> Config:
    cfg = Config.from_yaml(args.config) if args.config else Config()
    overrides = {}
    for flag, key in [
        ("threshold", "lsh.threshold"),
        ("num_perm", "minhash.num_perm"),
        ("ngram", "minhash.ngram"),
        ("shingle", "minhash.shingle"),
        ("bands", "lsh.bands"),
        ("rows", "lsh.rows"),
        ("verify", "verify.method"),
        ("backend", "backend"),
        ("text_column", "input.text_column"),
        ("id_column", "input.id_column"),
    ]:
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    for item in args.set:
        if "=" not in item:
            raise GpuDedupError(f"--set {item!r} must look like KEY=VALUE, e.g. --set lsh.threshold=0.7")
        key, value = item.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(value)
    return cfg.with_overrides(overrides) if overrides else cfg


def _setup_logging(verbosity: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbosity > 0 else logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("numba").setLevel(logging.WARNING)


def cmd_run(args) -> int:
    from .pipeline import run
    from .report import summary

    cfg = _config_from_args(args)
    result = run(args.inputs, args.output, cfg)
    if not args.quiet:
        print(summary(result.report))
        print(f"outputs in {result.output_dir}/ (deduplicated shards, duplicates.parquet, report.json)")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo

    cfg = _config_from_args(args)
    return run_demo(Path(args.output), cfg, docs=args.docs, quiet=args.quiet)


def cmd_config(args) -> int:
    cfg = _config_from_args(args)
    bands, rows = cfg.layout
    print(cfg.to_yaml(), end="")
    print(f"# derived: bands={bands} rows={rows} permutations_computed={cfg.signature_perms} "
          f"verify_threshold={cfg.verify_threshold} fingerprint={cfg.fingerprint}")
    return 0


def cmd_evaluate(args) -> int:
    from .evaluate import evaluate, summary

    cfg = _config_from_args(args)
    report = evaluate(args.inputs, cfg, output_dir=args.output, sample=args.sample, seed=args.seed, floor=args.floor,
                      label_column=args.label_column, compare_split_chains=args.compare_split_chains,
                      plot=not args.no_plot, keep_runs=args.keep_runs, lsh_seeds=args.lsh_seeds)
    print(summary(report))
    written = sorted(p.name for p in Path(args.output).glob("evaluation.*"))
    print(f"wrote {', '.join(written)} in {args.output}/")
    if args.require_targets:
        failed = [f"{name}: {k}" for name, r in report["runs"].items() for k, v in r["targets"].items()
                  if not v["met"] and v.get("applies", True)]
        if failed:
            print("targets not met: " + "; ".join(failed), file=sys.stderr)
            return 1
    return 0


def cmd_tune(args) -> int:
    from .tune import format_empirical, format_table, tune

    cfg = _config_from_args(args)
    overrides = {k: v for k, v in (("lsh.fp_weight", args.fp_weight), ("lsh.fn_weight", args.fn_weight)) if v is not None}
    if overrides:
        cfg = cfg.with_overrides(overrides)
    result = tune(cfg, top=args.top, output_dir=args.output, sample_inputs=args.sample, sample=args.sample_size,
                  seed=args.seed, confirm=args.confirm, floor=args.floor, plot=not args.no_plot)
    print(f"LSH layouts for threshold {cfg.lsh.threshold}, num_perm {cfg.minhash.num_perm}, "
          f"weights FP {cfg.lsh.fp_weight} / FN {cfg.lsh.fn_weight}:")
    print(format_table(result["layouts"], cfg.lsh.threshold))
    if "empirical" in result:
        print(format_empirical(result["empirical"]))
    pick = result["pick"]
    print(f"pick: lsh.bands={pick['bands']} lsh.rows={pick['rows']}"
          + (f"; wrote tune.json{', tune.png' if 'png' in result else ''} in {args.output}/" if args.output else ""))
    return 0


def cmd_dataset(args) -> int:
    from .datasets import build

    info = build(args.name, args.output)
    print(f"{info['dataset']}: {info['documents']:,} documents, {info['text_mb']} MB of text -> {info['path']}")
    if args.info:
        from .io import atomic_write_bytes

        Path(args.info).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.info, (json.dumps(info, indent=2) + "\n").encode())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-dedup", description="Near-duplicate removal with MinHash + LSH.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__import__('gpu_dedup').__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="deduplicate Parquet / JSONL shards")
    p.add_argument("inputs", nargs="+", help="shard files, directories or glob patterns")
    p.add_argument("-o", "--output", required=True, help="output directory")
    _add_config_args(p)
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
                   help="exit 1 when a target is missed (precision 1.0 of verified edges, recall >= 0.99 at t+0.05)")
    _add_config_args(p)
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("tune", help="compare LSH layouts (bands x rows) for a threshold and pick one")
    _add_config_args(p)
    p.add_argument("--fp-weight", type=float, help="weight of the false-positive area (lsh.fp_weight)")
    p.add_argument("--fn-weight", type=float, help="weight of the false-negative area (lsh.fn_weight)")
    p.add_argument("--top", type=int, default=6, help="cheapest layouts to list besides the pick's neighbours")
    p.add_argument("-o", "--output", default="gpu-dedup-tune", help="directory for tune.json and tune.png")
    p.add_argument("--sample", metavar="CORPUS", nargs="+", help="confirm the top layouts on a sample of this corpus")
    p.add_argument("--sample-size", type=int, default=5000, help="documents sampled for --sample (default 5000)")
    p.add_argument("--confirm", type=int, default=3, help="layouts run on the sample (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--floor", type=float, help="lowest exact similarity enumerated (default min(0.3, threshold))")
    p.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.set_defaults(func=cmd_tune)

    from .datasets import DATASETS

    p = sub.add_parser("dataset", help="build a real evaluation corpus from installed Debian packages")
    p.add_argument("name", choices=sorted(DATASETS), help="; ".join(f"{k}: {v}" for k, v in DATASETS.items()))
    p.add_argument("-o", "--output", required=True, help="Parquet file to write")
    p.add_argument("--info", help="also write a JSON description (size, source fingerprint, installed packages)")
    p.set_defaults(func=cmd_dataset, quiet=False, verbose=0)

    p = sub.add_parser("config", help="print the resolved configuration (with derived values)")
    _add_config_args(p)
    p.set_defaults(func=cmd_config, quiet=True, verbose=0)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args.verbose, args.quiet)
    try:
        return args.func(args)
    except GpuDedupError as exc:
        print(f"gpu-dedup: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
