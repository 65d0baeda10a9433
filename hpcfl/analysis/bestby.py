"""``hpcfl report --best-by KEY``: each method at its best value of KEY from a grid, as papers
tune their baselines.

A *method* is a group's grouping keys other than KEY (``FedAvg``, ``FedNova``); its candidates
are its groups, one per value of KEY (``lr`` 0.01, 0.1, 0.3). The chosen value is the one whose
runs have the best mean of the ``--criterion`` statistic (``last_k`` by default, or ``final``,
``best``; highest accuracy or lowest loss), the first in sweep order on a tie. The method is
then reported at that value, its label naming it (``FedAvg, lr 0.1``).

Choosing and reporting on the same seeds flatters every method a little (the maximum of noisy
means is biased upwards), the more the larger the grid. ``--select-seeds 0`` holds seeds out:
the choice looks only at seed 0's runs, and the table shows the other seeds, which took no part
in it. Without it the notes say that the choice saw the reported numbers.
"""

from __future__ import annotations

import numpy as np

from ..config import flatten
from ..errors import HpcflError
from . import runs as R
from . import words as W

CRITERIA = ("last_k", "final", "best")


def parse_seeds(text: str | None) -> list | None:
    """``--select-seeds 0,1`` -> [0, 1] (ints where they read as ints)."""
    if text is None:
        return None
    out = []
    for s in (p.strip() for p in text.split(",")):
        if s:
            try:
                out.append(int(s))
            except ValueError:
                out.append(s)
    if not out:
        raise HpcflError(f"--select-seeds {text!r}: give the seeds that choose, e.g. --select-seeds 0 or 0,1")
    return out


def _score(g, criterion: str, seeds: list | None, kind: str) -> tuple[float, int]:
    vals = [getattr(r, criterion) for r in g.runs if r.evaluated and (seeds is None or r.seed in seeds)]
    vals = [v for v in vals if np.isfinite(v)]
    return (float(np.mean(vals)) if vals else float("nan")), len(vals)


def _better(a: float, b: float, kind: str) -> bool:
    return a > b if kind == "accuracy" else a < b


def choose(groups: list, key: str, label_keys: list[str], criterion: str, seeds: list | None, kind: str,
           restrict) -> tuple[list, list[str]]:
    """The chosen group of each method, in the order of the methods' first groups, and the notes.

    Parameters
    ----------
    groups : list of GroupStats, in sweep order, each one value of ``key``
    key : the full dotted key to choose (e.g. ``algorithm.lr``)
    label_keys : the grouping keys (``key`` among them when it differs between runs)
    criterion : one of :data:`CRITERIA`
    seeds : the seeds that choose (``--select-seeds``); None: all, reported too
    kind : ``"accuracy"`` or ``"loss"``
    restrict : callable(group, runs) -> GroupStats holding only those runs (re-summarised)
    """
    if criterion not in CRITERIA:
        raise HpcflError(f"--criterion {criterion!r}: choose one of {', '.join(CRITERIA)}")
    others = [k for k in label_keys if k != key]
    methods: dict = {}
    for g in groups:
        mid = tuple(repr(g.keys.get(k)) for k in others)
        methods.setdefault(mid, []).append(g)
    chosen, lines = [], []
    leaf = key.rsplit(".", 1)[-1]
    for members in methods.values():
        name = W.group_words(others, flatten(members[0].configs[0])) if others else "all runs"
        scored = [(g, *_score(g, criterion, seeds, kind)) for g in members]
        finite = [s for s in scored if np.isfinite(s[1])]
        if not finite:
            raise HpcflError(f"--best-by {key}: no run of {name!r} has a {criterion} value"
                             + (f" among seeds {', '.join(map(str, seeds))}" if seeds else "")
                             + "; choose other --select-seeds, or let the runs evaluate first")
        best = finite[0]
        for s in finite[1:]:
            if _better(s[1], best[1], kind):
                best = s
        g = best[0]
        if seeds is not None:
            rest = [r for r in g.runs if r.seed not in seeds]
            if not rest:
                raise HpcflError(f"--best-by {key} --select-seeds {','.join(map(str, seeds))}: every run of "
                                 f"{g.label!r} chose, none is left to report; hold out fewer seeds")
            g = restrict(g, rest)
        chosen.append(g)
        fmt = (lambda v: f"{v:.4f}") if kind == "accuracy" else (lambda v: f"{v:.4g}")
        cands = ", ".join(f"{R.format_value(s[0].keys.get(key))} -> "
                          f"{fmt(s[1]) if np.isfinite(s[1]) else 'no value'} (n={s[2]})"
                          + (" chosen" if s[0] is best[0] else "") for s in scored)
        lines.append(f"{name}: {leaf} {cands}")
    return chosen, [_how(key, criterion, seeds, kind)] + lines


def _how(key: str, criterion: str, seeds: list | None, kind: str) -> str:
    what = {"last_k": "mean of the last k evaluations", "final": "final value", "best": "best value"}[criterion]
    side = "highest" if kind == "accuracy" else "lowest"
    head = f"{key} chosen per method by the {side} mean over seeds of the {what} ({criterion})"
    if seeds is None:
        return (head + " over all seeds, the ones the table shows: the choice saw the numbers reported, which "
                       "flatters every method a little (--select-seeds holds seeds out)")
    return (head + f" over seed(s) {', '.join(map(str, seeds))} only; the table shows the other seeds, which took no "
                   f"part in the choice")
