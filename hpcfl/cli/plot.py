"""``hpcfl plot``: the command line of :mod:`hpcfl.analysis.plots` (learning curves of groups of runs,
or one run's clients x rounds heatmap)."""

from __future__ import annotations

import sys

from ..analysis.fairness_plot import fairness_png
from ..analysis.figures import check_out_path, parse_size
from ..analysis.heatmap import client_heatmap_png
from ..analysis.plots import caption_words, curves_png, legend_words
from ..analysis.runs import find_runs, group_keys, group_runs, load_runs
from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT
from .report import grouping_keys


def add_parser(sub) -> None:
    """Add ``hpcfl plot`` to the CLI's subparsers."""
    p = sub.add_parser("plot", help="plot learning curves of runs, or a per-client heatmap of one run")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories, results.h5 files or sweep directories")
    p.add_argument("--out", required=True, metavar="FILE",
                   help="file to write: .png, or .pdf / .svg (vector, for a paper)")
    p.add_argument("--kind", choices=("curves", "clients", "fairness"), default="curves",
                   help="curves: quality and train loss per group of runs (default); clients: clients x rounds "
                        "heatmap of one run's --field; fairness: each client's accuracy (--field loss: loss) on its "
                        "own held-out rows, its distribution over clients by round (run.eval_clients)")
    p.add_argument("--x", choices=("round", "sim_time"), default="round",
                   help="x axis of curves: rounds, or cumulative simulated seconds (needs [system])")
    p.add_argument("--metric", dest="metrics", action="append", metavar="NAME",
                   help="a curves panel: quality or a /metrics name such as test_loss (repeatable; default: "
                        "quality and train_loss)")
    p.add_argument("--field", default=None,
                   help="per-client record for --kind clients: steps, weight, train_loss, dropped, or a policy's "
                        "field such as gsnr (default steps); for --kind fairness: accuracy (default) or loss")
    p.add_argument("--log", action="store_true",
                   help="clients: log colour scale (for skewed positive values such as train_loss)")
    p.add_argument("--by", action="append", metavar="KEY[,KEY]",
                   help="group runs by these config keys, e.g. --by algorithm.name,algorithm.lr (repeatable; "
                        "default: the keys that differ across the runs, seeds together)")
    p.add_argument("--size", default="1200x800", metavar="WxH",
                   help="image size in pixels, 1/100 inch for .pdf and .svg (default 1200x800); fonts scale with "
                        "the width, to about 9 pt when printed 7 inches wide")
    p.add_argument("--log-y", action="store_true", help="curves: log scale on the panels showing a loss")
    p.add_argument("--title", metavar="TEXT",
                   help="curves: the caption above the panels (default: what the runs share, e.g. dataset, "
                        "split, clients, model; '' for none)")


def _plot(args) -> str:
    size = parse_size(args.size)   # cheap checks first: no run is read for a typo
    check_out_path(args.out)
    paths = find_runs(args.runs)
    if args.kind == "clients":
        if len(paths) != 1:
            raise HpcflError(f"--kind clients plots one run, but {len(paths)} were found in "
                             f"{' '.join(args.runs)}; give one run directory")
        return client_heatmap_png(load_runs(paths)[0], args.field or "steps", args.out, size, log=args.log)
    if args.log:
        raise HpcflError("--log is for --kind clients (a log colour scale); curves take --log-y")
    by = grouping_keys(args.by) or None   # an empty --by groups as no --by does
    results = load_runs(paths)
    groups, keys = group_runs(results, by=by), group_keys(results, by=by)
    title = caption_words(groups, keys) if args.title is None else args.title
    legend = legend_words(groups, keys)
    if args.kind == "fairness":
        return fairness_png(groups, args.out, args.field or "accuracy", size, legend=legend, title=title or None)
    metrics = tuple(args.metrics or ("quality", "train_loss"))
    return curves_png(groups, args.out, x=args.x, metrics=metrics, size=size, legend=legend, title=title or None,
                      log_y=args.log_y)


def main(args, comm) -> int:
    """``hpcfl plot``: rank 0 draws; exit 0, or 2 with a message for bad input."""
    if comm.rank != 0:
        return 0
    try:
        path = _plot(args)
    except HpcflError as exc:
        print(f"hpcfl plot: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(f"plot: {path}")
    return 0
