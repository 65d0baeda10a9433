"""``hpcfl export``: the command line of :mod:`hpcfl.analysis.export` (per-round tables as CSV or
Parquet, TensorBoard event files)."""

from __future__ import annotations

import sys

from ..analysis.export import FORMATS, TABLES, export
from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT
from .report import grouping_keys


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="per-round records of runs as CSV, Parquet or TensorBoard event files",
                       description="Export every run's per-round records: one long table (a row per run and "
                                   "round; --table clients or client_eval: per client too) as CSV or Parquet, or "
                                   "TensorBoard event files beside each run (tensorboard --logdir runs/).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run directory, results.h5 file, or a directory holding runs (e.g. a sweep's output)")
    p.add_argument("--format", default=None, choices=FORMATS,
                   help="csv, parquet or tensorboard (default: the suffix of --out, .csv or .parquet; csv to the "
                        "screen without --out)")
    p.add_argument("--table", default="metrics", choices=TABLES,
                   help="csv/parquet: metrics (a row per round, default), clients (per cohort member and round) "
                        "or client_eval (per client and evaluated round)")
    p.add_argument("--out", metavar="PATH",
                   help="csv/parquet: the file (csv without it: printed; never a link, a run's results.h5 or another "
                        "HDF5 file); tensorboard: a folder to hold each run's events under its path (default: "
                        "<run>/tensorboard)")
    p.add_argument("--by", action="append", metavar="KEY[,KEY]",
                   help="csv/parquet: the group column by these config keys, as hpcfl report groups them")


def main(args, comm) -> int:
    """``hpcfl export``: rank 0 writes; exit 2 with a message for bad input."""
    if comm.rank != 0:
        return 0
    try:
        text = export(args.paths, args.format, args.out, args.table, grouping_keys(args.by))
    except HpcflError as exc:
        print(f"hpcfl export: {exc}", file=sys.stderr)
        return EXIT_INPUT
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0
