"""``hpcfl plot --kind fairness``: the distribution over clients of each client's accuracy (or
loss) on its own held-out rows, by evaluated round (``/client_eval``, ``run.eval_clients``).

Left panel, per group of runs: the median over clients as a line, the 10th..90th percentile as a
band and the mean of the worst 10 % of clients (:mod:`.fairness`) as a thin line of the same
colour, by round. Right panel: the distribution at the last evaluated round as an empirical CDF.
A group's seeds are pooled: each (run, client) pair is one value.
"""

from __future__ import annotations

import numpy as np

from ..errors import HpcflError
from .fairness import by_round, fairness
from .figures import DEFAULT_SIZE, check_out_path, figure, run_label, save, style

FIELDS = ("accuracy", "loss")


def pooled(runs: list, field: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """(rounds (E,), per round the values of every run's clients pooled) of a group's runs."""
    per_run = [by_round(r.client_eval, field) for r in runs]
    rounds = np.unique(np.concatenate([rs for rs, _ in per_run])) if per_run else np.zeros(0, np.int64)
    values = []
    for rnd in rounds:
        values.append(np.concatenate([v[list(rs).index(rnd)] for rs, v in per_run if rnd in rs]))
    return rounds, values


def _check(groups: dict, field: str) -> None:
    if field not in FIELDS:
        raise HpcflError(f"--field {field!r}: --kind fairness plots {' or '.join(FIELDS)}")
    for runs in groups.values():
        for r in runs:
            if not getattr(r, "client_eval", None) or not len(r.client_eval.get("round", ())):
                raise HpcflError(f"run {run_label(r)} has no per-client evaluation (/client_eval): it ran with "
                                 f"run.eval_clients = false, before its first evaluation, or with a model "
                                 f"without accuracy; run it with run.eval_clients = true")


def fairness_png(groups: dict, path, field: str = "accuracy", size=DEFAULT_SIZE, *, legend: dict | None = None,
                 title: str | None = None) -> str:
    """Draw the figure (see the module's docstring); returns ``path``.

    Parameters
    ----------
    groups : dict of label -> list of Results
    path : str or Path
        .png, .pdf or .svg.
    field : {"accuracy", "loss"}
    size : (int, int)
        Pixels (1/100 inch for .pdf and .svg).
    legend : dict of label -> str, optional
        The words per group (``hpcfl plot`` passes :func:`hpcfl.analysis.plots.legend_words`).
    title : str, optional
        A caption above the panels.
    """
    if not groups or not any(groups.values()):
        raise HpcflError("no runs to plot; pass run directories, results.h5 files or sweep directories")
    _check(groups, field)
    check_out_path(path)
    from matplotlib.ticker import MaxNLocator

    with style(size):
        fig = figure(size)
        over, cdf = fig.subplots(1, 2, squeeze=True, width_ratios=(3, 2))
        handles, texts = [], []
        for i, (label, runs) in enumerate(groups.items()):
            rounds, values = pooled(runs, field)
            color = f"C{i % 10}"
            p10, p50, p90 = (np.array([np.nanpercentile(v, q) for v in values]) for q in (10, 50, 90))
            worst = np.array([fairness(v if field == "accuracy" else -v)["worst10"] for v in values])
            worst = worst if field == "accuracy" else -worst   # the worst losses are the highest
            line, = over.plot(rounds, p50, color=color, marker="o", ms=4, mfc="white")
            over.fill_between(rounds, p10, p90, color=color, alpha=0.15, lw=0)
            over.plot(rounds, worst, color=color, lw=1.0, linestyle="--")
            last = np.sort(values[-1][np.isfinite(values[-1])])
            cdf.step(last, np.arange(1, last.size + 1) / max(last.size, 1), where="post", color=color)
            f = fairness(values[-1])
            handles.append(line)
            name = str((legend or {}).get(label, label)) + (f" ({len(runs)} runs pooled)" if len(runs) > 1 else "")
            texts.append(f"{name}: Jain {f['jain']:.3f}" if field == "accuracy" else name)
        what = "accuracy" if field == "accuracy" else "mean loss"
        over.set_xlabel("round")
        over.xaxis.set_major_locator(MaxNLocator(integer=True))
        over.set_ylabel(f"client {what} on its held-out rows")
        over.set_title("median over clients; band 10-90 %; dashed: worst 10 %", fontsize="medium")
        cdf.set_xlabel(f"client {what}, last evaluated round")
        cdf.set_ylabel("fraction of clients")
        cdf.set_title("distribution at the last evaluation", fontsize="medium")
        for ax in (over, cdf):
            ax.grid(True, alpha=0.3)
        fig.legend(handles, texts, loc="outside lower center", ncols=min(len(texts), 3), frameon=False)
        if title:
            fig.suptitle(title, fontsize="medium")
        return save(fig, path)
