"""What ``hpcfl report`` prints (its command line is :mod:`hpcfl.cli.report`): a table of final, best
and time-to-target quality per group of runs.

Runs are grouped by the config keys that differ between them (:mod:`.runs`), so seeds of
one configuration form one group, summarised as mean ± sample std over the seeds
(:mod:`.groupstats`), in the sweep's order or ``--order``'s (:mod:`.order`). Labels name the
preset slots that differ (:mod:`.slots`); ``--baseline`` adds the paired differences by seed
(:mod:`.paired`); ``--best-by`` reports each method at its best value of a grid
(:mod:`.bestby`). The quality metric is test accuracy, or test loss for models without one
(the quadratic model). Formats: an aligned text table, a GitHub markdown table, a booktabs
LaTeX table (:mod:`.latex`), CSV (plain numbers) and JSON (with every run's own values).
"""

from __future__ import annotations

import sys

from ..errors import HpcflError
from .groupstats import CLIENT_COLUMNS, STATS, GroupStats, _check_kinds, build  # noqa: F401  (found here too)
from .latex import latex_columns, render_latex
from .tables import (
    _columns,
    _notes,
    _rows,
    render_csv,
    render_json,
    render_markdown,
    render_text,
    repeated_seeds,
)

FORMATS = ("text", "markdown", "latex", "csv", "json")


def report_text(paths: list, by=None, fmt: str = "text", target: float | None = None, last_k: int = 5,
                baseline: str | None = None, *, paper: list[str] | None = None, per_run: bool = False,
                order: str | None = None, best_by: str | None = None, criterion: str = "last_k",
                select_seeds: str | None = None) -> str:
    """The report of the runs under ``paths`` as a string.

    Parameters
    ----------
    paths : list of str or Path
        Run directories, results files, or directories holding runs (see :func:`.runs.find_runs`).
    by : list of str, optional
        Config keys to group by; default the keys that differ across the runs.
    fmt : {"text", "markdown", "latex", "csv", "json"}
    target : float, optional
        Test accuracy (fraction) to reach, or test loss to get down to for loss-only runs.
    last_k : int
        How many last evaluations to average.
    baseline : str, optional
        ``KEY=VALUE`` (or a group's label) naming the group the paired differences (and, with
        ``target``, the speedups) are relative to.
    paper : list of str, optional
        ``LABEL=VALUE``: a published number shown beside the group labelled LABEL.
    per_run : bool
        Text, markdown and LaTeX: one row per run under its group's row.
    order : str, optional
        ``fedlga,fedavg`` (labels, ``KEY=VALUE`` or key values first, in that order) or one
        grouping key to sort by; default the sweep's order (:mod:`.order`).
    best_by : str, optional
        A config key (``algorithm.lr``): each method at its best value of it (:mod:`.bestby`).
    criterion : {"last_k", "final", "best"}
        What ``best_by`` maximises (accuracy) or minimises (loss), mean over the seeds.
    select_seeds : str, optional
        ``0`` or ``0,1``: the seeds that choose for ``best_by``; the table shows the others.
    """
    if fmt not in FORMATS:
        raise HpcflError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    built = build(paths, by, target, last_k, baseline, paper, order_spec=order, best_by=best_by,
                  criterion=criterion, select_seeds=select_seeds)
    groups, kind = built.groups, built.kind
    warnings = repeated_seeds(groups) + built.warnings
    if fmt in ("csv", "json"):   # machine-read: the data alone, the notes and warnings on stderr
        for line in built.notes + warnings:
            print(line, file=sys.stderr)
        return (render_csv if fmt == "csv" else render_json)(groups, kind, target, last_k)
    base = built.baseline
    cols = _columns(groups, kind, target, last_k, base, fmt in ("markdown", "latex"))
    client = any(c[0] == CLIENT_COLUMNS["client_jain"] for c in cols)
    notes = _notes(kind, target, last_k, base.short if base is not None else None, client) + built.notes
    if fmt == "latex":
        cols, said = latex_columns(groups, cols)
        return render_latex(cols, _rows(groups, cols, per_run), notes, warnings, said)
    render = render_text if fmt == "text" else render_markdown
    return render(groups, cols, per_run, notes + warnings)
