"""``hpcfl plot``: learning curves of grouped runs and per-client heatmaps, as PNG files.

Two pictures, each a pure function of already-loaded :class:`hpcfl.results.Results`:

- :func:`curves_png`: one panel per metric; per group of runs (e.g. the seeds of one
  configuration) the mean as a line and the min..max over the runs as a band.
- :func:`client_heatmap_png`: clients x rounds image of one per-client record.

Drawing uses matplotlib's object API on an Agg canvas (``Figure`` + ``FigureCanvasAgg``),
never pyplot: that needs no display and, unlike ``matplotlib.use("Agg")``, does not switch
the backend of a notebook that calls these functions. matplotlib is imported inside the
functions, because ``hpcfl.cli`` imports this module for every command.

Rounds are 1-based (``/metrics/round``: round r's row holds the metrics after r rounds).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import HpcflError

DPI = 100
DEFAULT_SIZE = (1200, 800)
SIZE_RANGE = (100, 10000)      # pixels per side accepted by parse_size
MAX_HEATMAP_ROWS = 1000        # more clients than this: evenly spaced cohort members are drawn
BAND_ALPHA = 0.2
EXIT_INPUT = 2
OUT_FIX = "choose a path in a writable directory"


# ----------------------------------------------------------------------------- helpers

def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` (pixels) -> ``(W, H)``; each side in :data:`SIZE_RANGE`."""
    parts = str(text).lower().split("x")
    lo, hi = SIZE_RANGE
    try:
        w, h = (int(p) for p in parts)
    except ValueError:
        raise HpcflError(f"--size {text!r} is not WIDTHxHEIGHT in pixels; use e.g. --size 1200x800") from None
    if not (lo <= w <= hi and lo <= h <= hi):
        raise HpcflError(f"--size {text!r}: each side must be {lo}..{hi} pixels; use e.g. --size 1200x800")
    return w, h


def check_out_path(path) -> Path:
    """Raise unless ``path`` names a ``.png`` file in an existing, writable directory."""
    import os

    path = Path(path)
    if path.is_dir():
        raise HpcflError(f"{path} is a directory; give a file name such as {path / 'plot.png'}")
    if path.suffix.lower() != ".png":
        raise HpcflError(f"{path}: plots are PNG files; give a path ending in .png")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise HpcflError(f"cannot write {path}: {parent} is not a writable directory; {OUT_FIX}")
    return path


def _figure(size):
    """A ``size`` = (width, height) pixel figure on an Agg canvas (no display, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    w, h = size
    fig = Figure(figsize=(w / DPI, h / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path) -> str:
    # No bbox_inches="tight": it would crop the figure and break the requested pixel size.
    path = check_out_path(path)
    try:
        fig.savefig(path, format="png", dpi=DPI)
    except OSError as exc:
        raise HpcflError(f"cannot write {path} ({exc.strerror or exc}); {OUT_FIX}") from None
    return str(path)


def run_label(res) -> str:
    """A short name of one run for messages: its ``run.name``, else its run id."""
    return str(res.config.get("run", {}).get("name") or res.attrs.get("run_id", "?"))


# ----------------------------------------------------------------------------- curves

@dataclass
class Curve:
    """One group's metric aligned on round numbers (all arrays shape (rounds,)).

    ``mean`` averages the runs that have a value at that round; ``lo``/``hi`` are the
    min/max over the runs and ``full`` is True where every run has a value (bands are
    drawn only there). ``x`` is the round, or the mean cumulative simulated time.
    """

    rounds: np.ndarray
    x: np.ndarray
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    full: np.ndarray
    runs: int


def quality_metric(runs) -> tuple[str, str]:
    """(metric name, axis label) of the quality panel for these runs.

    Test accuracy when every run has one (:func:`.runs.quality`); otherwise test loss,
    which every model reports (the quadratic model has no accuracy), so mixed groups
    share one axis.
    """
    from .runs import quality

    if runs and all(quality(r)[0] == "accuracy" for r in runs):
        return "test_accuracy", "test accuracy (fraction)"
    return "test_loss", "test loss (lower is better)"


def _check_sim_time(res) -> None:
    if not np.any(res.metrics["sim_time"] != 0):
        raise HpcflError(f"run {run_label(res)}: sim_time is 0 in every round: its job has no [system] section, "
                         f"so there is no simulated clock; plot against rounds (--x round) or add a [system] "
                         f"section to the job")


def _run_series(res, metric: str, x: str):
    """(rounds, x values, values) of one run where ``metric`` is finite, shapes (n,)."""
    if metric not in res.metrics:
        raise HpcflError(f"run {run_label(res)} has no metric {metric!r}; available: "
                         f"quality, {', '.join(sorted(res.metrics))}")
    y = np.asarray(res.metrics[metric], dtype=np.float64)
    keep = np.isfinite(y)
    rounds = np.asarray(res.metrics["round"])[keep]
    xs = rounds.astype(np.float64) if x == "round" else np.asarray(res.metrics["sim_time"], np.float64)[keep]
    return rounds, xs, y[keep]


def group_curve(runs, metric: str, x: str = "round") -> Curve:
    """Align the runs of one group on round numbers and summarise them (see :class:`Curve`).

    Parameters
    ----------
    runs : list of Results
    metric : str
        A ``/metrics`` name (``quality`` is resolved by the caller, :func:`quality_metric`).
    x : {"round", "sim_time"}
    """
    series = [_run_series(r, metric, x) for r in runs]
    rounds = np.unique(np.concatenate([s[0] for s in series])) if series else np.zeros(0, np.int64)
    xs = np.full((len(series), len(rounds)), np.nan)
    ys = np.full_like(xs, np.nan)
    for i, (r, xv, yv) in enumerate(series):
        col = np.searchsorted(rounds, r)
        xs[i, col], ys[i, col] = xv, yv
    have = np.isfinite(ys)
    with np.errstate(invalid="ignore"):   # columns are never empty: every round comes from some run
        return Curve(rounds, np.nanmean(xs, axis=0), np.nanmean(ys, axis=0), np.nanmin(ys, axis=0),
                     np.nanmax(ys, axis=0), have.all(axis=0), len(series))


def _draw_group(ax, curve: Curve, color: str, label: str) -> None:
    if curve.rounds.size == 0:
        return
    name = label if curve.runs == 1 else f"{label}: mean of {curve.runs} runs"
    ax.plot(curve.x, curve.mean, color=color, lw=1.8, marker="o" if curve.rounds.size < 30 else None, ms=3,
            label=name)
    if curve.runs > 1 and curve.full.any():
        ax.fill_between(curve.x, curve.lo, curve.hi, where=curve.full, color=color, alpha=BAND_ALPHA, lw=0,
                        label=f"{label}: min..max over runs")


def curves_png(groups: dict, path, x: str = "round", metrics=("quality", "train_loss"),
               size=DEFAULT_SIZE) -> str:
    """Learning curves of groups of runs, one panel per metric.

    Parameters
    ----------
    groups : dict of label -> list of Results
        E.g. the seeds of each configuration (``hpcfl.analysis.runs.group_runs``).
    path : str or Path
        PNG to write.
    x : {"round", "sim_time"}
        1-based rounds, or cumulative simulated seconds (needs a ``[system]`` section).
    metrics : sequence of str
        ``"quality"`` (test accuracy, or test loss for models without accuracy) or any
        ``/metrics`` name such as ``train_loss``, ``test_loss``, ``lr``.
    size : (int, int)
        Width and height in pixels.

    Returns
    -------
    str : ``path``.
    """
    if x not in ("round", "sim_time"):
        raise HpcflError(f"x = {x!r}: choose 'round' or 'sim_time'")
    if not groups or not any(groups.values()):
        raise HpcflError("no runs to plot; pass run directories, results.h5 files or sweep directories")
    if not metrics:
        raise HpcflError("no metrics to plot; give at least one, e.g. quality or train_loss")
    all_runs = [r for runs in groups.values() for r in runs]
    if x == "sim_time":
        for r in all_runs:
            _check_sim_time(r)
    check_out_path(path)   # before drawing: a bad path fails fast
    from matplotlib.ticker import MaxNLocator

    fig = _figure(size)
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        name, ylabel = quality_metric(all_runs) if metric == "quality" else (metric, metric.replace("_", " "))
        for i, (label, runs) in enumerate(groups.items()):
            if runs:
                _draw_group(ax, group_curve(runs, name, x), f"C{i % 10}", str(label))
        if not ax.lines:
            ax.text(0.5, 0.5, f"no {name} values yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("round" if x == "round" else "simulated time [s] (mean over runs)")
        if x == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize="small")
    return _save(fig, path)


# ----------------------------------------------------------------------------- client heatmap

def _client_unit(res, field: str) -> str | None:
    """The unit of ``/clients/<field>`` as the file records it, or None when it has none."""
    return res.units.get("clients", {}).get(field) or None


def _num_clients(res) -> int:
    ids = np.asarray(res.clients["client"])
    held = int(res.class_counts.shape[0]) if res.class_counts is not None else 0
    return max(held, int(ids.max()) + 1 if ids.size else 0)


def _heatmap_rows(res, n: int) -> np.ndarray:
    """Client ids drawn: all ``n`` clients, or evenly spaced cohort members above the limit."""
    if n <= MAX_HEATMAP_ROWS:
        return np.arange(n)
    seen = np.unique(res.clients["client"])   # clients never in a cohort would be blank rows
    pick = np.unique(np.linspace(0, seen.size - 1, min(seen.size, MAX_HEATMAP_ROWS)).round().astype(np.int64))
    return seen[pick]


def client_matrix(res, field: str):
    """Per-client record as a (clients drawn, rounds) masked array.

    Returns
    -------
    rows : np.ndarray, shape (k,)
        Client ids of the rows.
    rounds : np.ndarray, shape (R,)
        Round numbers of the columns (contiguous).
    values : np.ma.MaskedArray, shape (k, R), float64
        Masked where the client was not in that round's cohort or its value is NaN.
    member : np.ndarray of bool, shape (k, R)
        True where the client was in the cohort.
    """
    if field not in res.clients or field in ("round", "client"):
        available = [f for f in sorted(res.clients) if f not in ("round", "client")]
        raise HpcflError(f"unknown per-client field {field!r}; available: {', '.join(available)}")
    rid = np.asarray(res.clients["round"])
    if rid.size == 0:
        raise HpcflError(f"run {run_label(res)} has no rounds recorded yet; plot it after its first round")
    rows = _heatmap_rows(res, _num_clients(res))
    rounds = np.arange(int(rid.min()), int(rid.max()) + 1)
    cid = np.asarray(res.clients["client"])
    r_idx = np.minimum(np.searchsorted(rows, cid), rows.size - 1)
    keep = rows[r_idx] == cid                      # rows not drawn (subsampled) drop out
    grid = np.full((rows.size, rounds.size), np.nan)
    member = np.zeros(grid.shape, dtype=bool)
    cols = rid[keep] - rounds[0]
    grid[r_idx[keep], cols] = np.asarray(res.clients[field], dtype=np.float64)[keep]
    member[r_idx[keep], cols] = True
    return rows, rounds, np.ma.masked_invalid(grid), member


def client_heatmap_png(results, field: str, path, size=DEFAULT_SIZE) -> str:
    """Clients x rounds image of one per-client record (``results.clients[field]``).

    Cells of clients outside the round's cohort are blank; cohort members whose value
    is NaN (e.g. train_loss of a client that did not train) are light grey. With more
    than :data:`MAX_HEATMAP_ROWS` clients, evenly spaced cohort members are drawn and
    the title says how many.

    Parameters
    ----------
    results : Results
    field : str
        ``steps``, ``weight``, ``train_loss``, ``dropped``, ``anorm``, ``sim_time`` or a
        policy's field such as ``disco_d`` or ``gsnr``.
    path : str or Path
        PNG to write.
    size : (int, int)
        Width and height in pixels.

    Returns
    -------
    str : ``path``.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.ticker import MaxNLocator

    rows, rounds, values, member = client_matrix(results, field)
    check_out_path(path)
    n = _num_clients(results)
    fig = _figure(size)
    ax = fig.add_subplot(1, 1, 1)
    extent = (rounds[0] - 0.5, rounds[-1] + 0.5, rows.size - 0.5, -0.5)
    no_value = np.ma.masked_where(~(member & values.mask), np.ones(member.shape))
    ax.imshow(no_value, aspect="auto", interpolation="nearest", cmap=ListedColormap(["0.85"]), extent=extent)
    im = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis", extent=extent)
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("client")
    if rows.size <= 30:
        ax.set_yticks(range(rows.size), [str(r) for r in rows])
    else:
        ticks = np.linspace(0, rows.size - 1, 6).round().astype(int)
        ax.set_yticks(ticks, [str(rows[t]) for t in ticks])
    shown = f" ({rows.size} of {n} clients shown)" if rows.size < n else ""
    ax.set_title(f"{run_label(results)}: {field} per client{shown}; blank: not in cohort, grey: no value")
    unit = _client_unit(results, field)
    fig.colorbar(im, ax=ax, label=field if unit is None else f"{field} [{unit}]")
    return _save(fig, path)


# ----------------------------------------------------------------------------- CLI

def add_parser(sub) -> None:
    """Add ``hpcfl plot`` to the CLI's subparsers."""
    p = sub.add_parser("plot", help="plot learning curves of runs, or a per-client heatmap of one run")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories, results.h5 files or sweep directories")
    p.add_argument("--out", required=True, metavar="PNG", help="PNG file to write")
    p.add_argument("--kind", choices=("curves", "clients"), default="curves",
                   help="curves: quality and train loss per group of runs (default); clients: clients x rounds "
                        "heatmap of one run's --field")
    p.add_argument("--x", choices=("round", "sim_time"), default="round",
                   help="x axis of curves: rounds, or cumulative simulated seconds (needs [system])")
    p.add_argument("--metric", dest="metrics", action="append", metavar="NAME",
                   help="a curves panel: quality or a /metrics name such as test_loss (repeatable; default: "
                        "quality and train_loss)")
    p.add_argument("--field", default="steps",
                   help="per-client record for --kind clients: steps, weight, train_loss, dropped, or a policy's "
                        "field such as gsnr (default steps)")
    p.add_argument("--by", action="append", metavar="KEY[,KEY]",
                   help="group runs by these config keys, e.g. --by algorithm.name,algorithm.lr (repeatable; "
                        "default: the keys that differ across the runs, seeds together)")
    p.add_argument("--size", default="1200x800", metavar="WxH", help="image size in pixels (default 1200x800)")


def _plot(args) -> str:
    size = parse_size(args.size)   # cheap checks first: no run is read for a typo
    check_out_path(args.out)
    from .runs import find_runs, group_runs, load_runs

    paths = find_runs(args.runs)
    if args.kind == "clients":
        if len(paths) != 1:
            raise HpcflError(f"--kind clients plots one run, but {len(paths)} were found in "
                             f"{' '.join(args.runs)}; give one run directory")
        return client_heatmap_png(load_runs(paths)[0], args.field, args.out, size)
    by = [k.strip() for item in args.by or () for k in item.split(",") if k.strip()] or None   # as hpcfl report
    groups = group_runs(load_runs(paths), by=by)
    metrics = tuple(args.metrics or ("quality", "train_loss"))
    return curves_png(groups, args.out, x=args.x, metrics=metrics, size=size)


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
