"""``hpcfl report``: the command line of :mod:`hpcfl.analysis.report` (tables over groups of runs)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..analysis.report import FORMATS, report_text
from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT


def grouping_keys(given: list[str] | None) -> list[str] | None:
    """``--by a,b --by c`` -> [a, b, c] (hpcfl report's and hpcfl plot's); None when not given."""
    return None if not given else [k.strip() for item in given for k in item.split(",") if k.strip()]


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="table of final, best and time-to-target quality per group of runs",
                       description="Summarise runs: grouped by the config keys that differ between them "
                                   "(seeds of one configuration form a group), mean ± sample std over each group "
                                   "(the std to 2 significant digits, the mean to the same place), in the sweep "
                                   "grid's order. Paper tables: --format latex, --baseline (paired differences "
                                   "by seed), --best-by (the best value of a grid per method).")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="run directory, results.h5 file, or a directory holding runs (e.g. a sweep's output)")
    p.add_argument("--by", action="append", metavar="KEY[,KEY]",
                   help="group by these config keys, e.g. --by algorithm.name,algorithm.lr (a unique leaf such as "
                        "lr is enough; repeatable); default: the keys that differ across the runs")
    p.add_argument("--target", type=float,
                   help="quality to reach: test accuracy as a fraction (0.9), or test loss for loss-only models")
    p.add_argument("--last-k", type=int, default=5, metavar="K", help="average the last K evaluations (default 5)")
    p.add_argument("--baseline", metavar="KEY=VALUE",
                   help="the group the others are compared with, e.g. algorithm.name=fedavg (or a label): "
                        "columns of paired differences matched by seed (Δ final vs FedAvg: +0.0120 ± 0.0040 "
                        "(3/3 better)) and, with --target, speedups")
    p.add_argument("--order", metavar="ITEM[,ITEM]",
                   help="group order: these first, e.g. --order fedlga,fedavg (labels, KEY=VALUE or a grouping "
                        "key's values), the rest after; or one grouping key to sort by (--order lr); "
                        "default: the sweep grid's order")
    p.add_argument("--best-by", metavar="KEY",
                   help="report each method at its best value of KEY from a grid, e.g. --best-by algorithm.lr "
                        "(chosen by --criterion, mean over seeds; the label names the value)")
    p.add_argument("--criterion", default="last_k", choices=("last_k", "final", "best"),
                   help="what --best-by maximises (accuracy) or minimises (loss) (default last_k)")
    p.add_argument("--select-seeds", metavar="SEED[,SEED]",
                   help="--best-by chooses on these seeds only and the table shows the other seeds, held out "
                        "from the choice (e.g. --select-seeds 0)")
    p.add_argument("--paper", action="append", default=[], metavar="LABEL=VALUE",
                   help="a published number shown beside the group labelled LABEL (repeatable)")
    p.add_argument("--format", default="text", choices=FORMATS, help="output format (default text)")
    p.add_argument("--per-run", action="store_true", help="text/markdown/latex: also one row per run")
    p.add_argument("--out", metavar="FILE", help="write the report to FILE instead of printing it")


def main(args, comm) -> int:
    """``hpcfl report``: prints (or writes) the report on rank 0; exit 2 on bad input."""
    if comm.rank != 0:
        return 0
    by = grouping_keys(args.by)
    try:
        text = report_text(args.paths, by=by, fmt=args.format, target=args.target, last_k=args.last_k,
                           baseline=args.baseline, paper=args.paper, per_run=args.per_run, order=args.order,
                           best_by=args.best_by, criterion=args.criterion, select_seeds=args.select_seeds)
    except HpcflError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.out).write_text(text)
    except OSError as exc:
        print(f"--out {args.out} cannot be written ({exc.strerror or exc}); choose a path in a writable directory",
              file=sys.stderr)
        return EXIT_INPUT
    print(f"report written to {args.out}")
    return 0
