"""What ``hpcfl plot`` draws (its command line is :mod:`hpcfl.cli.plot`): learning curves of grouped
runs, and per-client heatmaps.

- :func:`curves_png`: one panel per metric; per group of runs (e.g. the seeds of one
  configuration) the mean as a line and the min..max over the runs as a band, each group
  with its own colour, dash pattern and marker (readable in greyscale), one legend entry
  per group in words (``FedNova, lr 0.1``), and a caption with what the runs share.
- :func:`hpcfl.analysis.heatmap.client_heatmap_png`: clients x rounds image of one
  per-client record.

Each is a pure function of already-loaded :class:`hpcfl.results.Results`; the file's
suffix picks PNG, PDF or SVG (:mod:`.figures`). Rounds are 1-based (``/metrics/round``:
round r's row holds the metrics after r rounds).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import HpcflError
from . import words
from .figures import DEFAULT_SIZE, check_out_path, figure, parse_size, run_label, save, style  # noqa: F401
from .heatmap import MAX_HEATMAP_ROWS, client_heatmap_png, client_matrix  # noqa: F401  (hpcfl plot's)
from .heatmap import client_unit as _client_unit  # noqa: F401

BAND_ALPHA = 0.15
# Group i draws with colour C<i>, dash LINESTYLES[i] and marker MARKERS[i] (cycled), so that
# curves under one another and greyscale prints stay apart.
LINESTYLES = ("-", "--", "-.", ":", (0, (6, 2)), (0, (3, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_CURVE = 8
LOSS_AXES = {"train_loss": "train loss\n(clients' mean mini-batch loss)", "test_loss": "test loss",
             "global_train_loss": "F(x) on all training data"}


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


def _draw_group(ax, curve: Curve, i: int):
    """Group i's mean line and min..max band; returns the legend handle, or None when empty."""
    if curve.rounds.size == 0:
        return None
    color, n = f"C{i % 10}", curve.rounds.size
    every = max(1, n // MARKS_PER_CURVE)
    line, = ax.plot(curve.x, curve.mean, color=color, linestyle=LINESTYLES[i % len(LINESTYLES)],
                    marker=MARKERS[i % len(MARKERS)], markevery=(i % every, every), ms=5, mfc="white", mew=1.2)
    if curve.runs > 1 and curve.full.any():
        band = ax.fill_between(curve.x, curve.lo, curve.hi, where=curve.full, color=color, alpha=BAND_ALPHA, lw=0)
        return (band, line)
    return line


def _log_minor(v: float, _pos=None) -> str:
    """Minor tick labels of a log axis: 2, 3 and 5 times a power of ten, plainly (0.3); none between."""
    if v <= 0:
        return ""
    mantissa = v / 10 ** np.floor(np.log10(v))
    return f"{v:g}" if any(abs(mantissa - m) < 1e-6 for m in (2, 3, 5)) else ""


def _is_loss(metric: str, name: str) -> bool:
    return "loss" in (name if metric == "quality" else metric)


def curves_png(groups: dict, path, x: str = "round", metrics=("quality", "train_loss"),
               size=DEFAULT_SIZE, *, legend: dict | None = None, title: str | None = None,
               log_y: bool = False) -> str:
    """Learning curves of groups of runs, one panel per metric.

    Parameters
    ----------
    groups : dict of label -> list of Results
        E.g. the seeds of each configuration (``hpcfl.analysis.runs.group_runs``).
    path : str or Path
        .png, .pdf or .svg to write.
    x : {"round", "sim_time"}
        1-based rounds, or cumulative simulated seconds (needs a ``[system]`` section).
    metrics : sequence of str
        ``"quality"`` (test accuracy, or test loss for models without accuracy) or any
        ``/metrics`` name such as ``train_loss``, ``test_loss``, ``lr``.
    size : (int, int)
        Width and height in pixels (1/100 inch for .pdf and .svg).
    legend : dict of label -> str, optional
        The legend's text per group (``hpcfl plot`` passes :func:`legend_words`); default the labels.
    title : str, optional
        A caption above the panels; None for none.
    log_y : bool
        Log scale on the panels that show a loss.

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
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    with style(size):
        fig = figure(size)
        axes = fig.subplots(1, len(metrics), squeeze=False)[0]
        handles = {}
        for ax, metric in zip(axes, metrics):
            name, ylabel = quality_metric(all_runs) if metric == "quality" else (
                metric, LOSS_AXES.get(metric, metric.replace("_", " ")))
            for i, (label, runs) in enumerate(groups.items()):
                h = _draw_group(ax, group_curve(runs, name, x), i) if runs else None
                if h is not None:
                    handles.setdefault(label, h)
            if not ax.lines:
                ax.text(0.5, 0.5, f"no {name} values yet", ha="center", va="center", transform=ax.transAxes)
            elif log_y and _is_loss(metric, name):
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))   # 0.1, not 10^-1
                ax.yaxis.set_minor_formatter(FuncFormatter(_log_minor))
                first, _, rest = ylabel.partition("\n")
                ylabel = f"{first}, log scale" + (f"\n{rest}" if rest else "")
            ax.set_xlabel("round" if x == "round" else "simulated time [s] (mean over runs)")
            if x == "round":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
        if handles:
            texts = [_entry((legend or {}).get(label, str(label)), groups[label]) for label in handles]
            fig.legend(list(handles.values()), texts, loc="outside lower center", ncols=min(len(texts), 4),
                       frameon=False)
        banded = any(len(runs) > 1 for runs in groups.values())
        note = "lines: mean over a group's runs (seeds); bands: min..max" if banded else ""
        caption = "\n".join(t for t in (title, note) if t)
        if caption:
            fig.suptitle(caption, fontsize="medium")
        return save(fig, path)


def _entry(text: str, runs: list) -> str:
    """The legend entry: the group, and how many runs (seeds, when they all differ) its line averages."""
    if len(runs) < 2:
        return text
    seeds = [r.config.get("run", {}).get("seed") for r in runs]
    return f"{text} ({len(runs)} {'seeds' if len(set(seeds)) == len(seeds) else 'runs'})"


def legend_words(groups: dict, keys: list[str]) -> dict:
    """label -> the group in words (``FedNova, lr 0.1``) from its grouping ``keys`` (``runs.group_keys``)."""
    from ..config import flatten

    return {label: words.group_words(keys, flatten(runs[0].config)) for label, runs in groups.items() if runs}


def caption_words(groups: dict, keys: list[str] = ()) -> str:
    """What all runs of the figure share, in words (:func:`hpcfl.analysis.words.caption`);
    the grouping ``keys`` and every key the runs differ in are the legend's."""
    from ..config import flatten
    from .runs import _differing

    flats = [flatten(r.config) for runs in groups.values() for r in runs]
    return words.caption(flats[0], set(_differing(flats)) | set(keys)) if flats else ""
