"""What ``hpcfl report`` prints (its command line is :mod:`hpcfl.cli.report`): a table of final, best
and time-to-target quality per group of runs.

Runs are grouped by the config keys that differ between them (:mod:`.runs`), so seeds of
one configuration form one group, summarised as mean ± sample std over the seeds
(:mod:`.groupstats`). The quality metric is test accuracy, or test loss for models without one
(the quadratic model). Formats (:mod:`.tables`): an aligned text table, a GitHub markdown table,
CSV (plain numbers) and JSON (with every run's own values).
"""

from __future__ import annotations

import sys

from ..errors import HpcflError
from .groupstats import CLIENT_COLUMNS, STATS, GroupStats, _check_kinds, build  # noqa: F401  (found here too)
from .tables import _columns, _notes, render_csv, render_json, render_markdown, render_text, repeated_seeds

FORMATS = ("text", "markdown", "csv", "json")


def report_text(paths: list, by=None, fmt: str = "text", target: float | None = None, last_k: int = 5,
                baseline: str | None = None, *, paper: list[str] | None = None, per_run: bool = False) -> str:
    """The report of the runs under ``paths`` as a string.

    Parameters
    ----------
    paths : list of str or Path
        Run directories, results files, or directories holding runs (see :func:`.runs.find_runs`).
    by : list of str, optional
        Config keys to group by; default the keys that differ across the runs.
    fmt : {"text", "markdown", "csv", "json"}
    target : float, optional
        Test accuracy (fraction) to reach, or test loss to get down to for loss-only runs.
    last_k : int
        How many last evaluations to average.
    baseline : str, optional
        ``KEY=VALUE`` (or a group's label) naming the group speedups are relative to; needs ``target``.
    paper : list of str, optional
        ``LABEL=VALUE``: a published number shown beside the group labelled LABEL.
    per_run : bool
        Text and markdown: one row per run under its group's row.
    """
    if fmt not in FORMATS:
        raise HpcflError(f"--format {fmt!r}: choose one of {', '.join(FORMATS)}")
    groups = build(paths, by, target, last_k, baseline, paper)
    kind = _check_kinds(groups)
    if fmt in ("csv", "json"):   # machine-read: the data alone, the warnings on stderr
        for warning in repeated_seeds(groups):
            print(warning, file=sys.stderr)
        return (render_csv if fmt == "csv" else render_json)(groups, kind, target, last_k)
    cols = _columns(groups, kind, target, last_k, baseline is not None, fmt == "markdown")
    render = render_text if fmt == "text" else render_markdown
    client = any(c[0] == CLIENT_COLUMNS["client_jain"] for c in cols)
    return render(groups, cols, per_run, _notes(kind, target, last_k, baseline, client) + repeated_seeds(groups))
