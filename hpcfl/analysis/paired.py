"""Paired differences against ``hpcfl report --baseline``: each group's runs matched to the
baseline's by seed.

Runs of one seed share their data split, cohorts and straggler draws across algorithms (every
draw is keyed by seed, stream, round and client: docs/architecture.md, "Randomness is keyed"), so the per-seed difference removes what the seed
alone does, and its spread is far smaller than the two groups' spreads side by side. For each
statistic (the final and the mean-of-last-k quality) and each non-baseline group::

    d_s   = stat(group, seed s) - stat(baseline, seed s)   for the seeds both groups evaluated
    mean  = mean of d_s,  std = sample std of d_s (ddof=1),  n = number of seeds
    better = seeds where the group is better (higher accuracy, lower loss); worse; ties

Seeds only one side has are named in a warning and left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PAIRED_STATS = ("final", "last_k")


@dataclass(frozen=True)
class Paired:
    """A group's paired difference to the baseline in one statistic over the matched seeds."""

    mean: float
    std: float        # NaN for one seed
    n: int
    better: int
    worse: int
    seeds: tuple      # the matched seeds, in the group's run order


def _by_seed(group) -> dict:
    """seed -> the first evaluated run of that seed (a repeated seed is warned about elsewhere)."""
    out: dict = {}
    for r in group.runs:
        if r.evaluated and r.seed not in out:
            out[r.seed] = r
    return out


def paired(mine: dict, theirs: dict, stat: str, kind: str) -> Paired | None:
    """A group minus the baseline in ``stat`` over their common seeds; None when they share none.
    ``mine`` and ``theirs`` are the two groups' runs by seed (:func:`_by_seed`)."""
    seeds = tuple(s for s in mine if s in theirs)
    if not seeds:
        return None
    d = np.array([getattr(mine[s], stat) - getattr(theirs[s], stat) for s in seeds], dtype=np.float64)
    up = int(np.sum(d > 0)) if kind == "accuracy" else int(np.sum(d < 0))
    down = int(np.sum(d < 0)) if kind == "accuracy" else int(np.sum(d > 0))
    std = float(np.std(d, ddof=1)) if d.size > 1 else float("nan")
    return Paired(mean=float(np.mean(d)), std=std, n=int(d.size), better=up, worse=down, seeds=seeds)


def apply_paired(groups: list, base, kind: str) -> list[str]:
    """Set ``g.paired[stat]`` for every group but the baseline; return the unmatched-seed warnings."""
    warnings = []
    theirs = _by_seed(base)
    for g in groups:
        if g is base:
            continue
        mine = _by_seed(g)
        g.paired = {stat: paired(mine, theirs, stat, kind) for stat in PAIRED_STATS}
        only_g = [s for s in mine if s not in theirs]
        only_b = [s for s in theirs if s not in mine]
        if only_g or only_b:
            parts = [f"seed {', '.join(map(str, ss))} only in {who!r}"
                     for ss, who in ((only_g, g.label), (only_b, base.label)) if ss]
            common = g.paired["final"].n if g.paired["final"] else 0
            warnings.append(f"warning: paired differences of {g.label!r} against the baseline {base.label!r}: "
                            f"{'; '.join(parts)} (unmatched, left out); {common} seed(s) matched")
    return warnings


def cell(p: Paired | None, text_of) -> str:
    """``+0.012 ± 0.0040 (3/3 better)``: ``text_of(mean, std)`` writes the numbers."""
    if p is None:
        return "-"
    tie = p.n - p.better - p.worse
    return f"{text_of(p.mean, p.std)} ({p.better}/{p.n} better{f', {tie} tied' if tie else ''})"
