"""The statistics of ``hpcfl report``: runs grouped by the config keys that differ between them
(:mod:`.runs`), each group's mean ± sample std per statistic over its seeds, speedups to a
baseline group and the paper's numbers beside a group (:func:`build`). How they are laid out is
:mod:`.tables`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..config import flatten
from ..errors import HpcflError
from . import bestby, order, paired, slots
from . import runs as R

STATS = ("final", "best", "best_round", "last_k", "to_target", "sim_to_target", "rounds", "client_mean",
         "client_worst10", "client_std", "client_jain")
# per-client test accuracy at the last evaluated round (/client_eval): header of each statistic
CLIENT_COLUMNS = {"client_mean": "client acc", "client_worst10": "worst 10%", "client_std": "client std",
                  "client_jain": "Jain"}
SHORT = {"accuracy": "acc", "loss": "loss"}


@dataclass
class GroupStats:
    """A group's runs and their mean and std (ddof=1) per statistic, plus baseline and paper values."""

    label: str
    keys: dict                 # dotted grouping key -> this group's value
    configs: list[dict]        # the runs' configs, in the order of runs
    runs: list[R.RunStats]
    mean: dict = field(default_factory=dict)
    std: dict = field(default_factory=dict)
    reached: int = 0
    speedup: float = float("nan")
    sim_speedup: float | None = None
    paper: object = None
    alias: str = ""            # the label by keys (name=fednova, lr=0.1), accepted where the label is
    short: str = ""            # the label without the preset slots it names (.slots), accepted too
    paired: dict = field(default_factory=dict)   # statistic -> paired.Paired against the baseline

    @property
    def running(self) -> int:
        return sum(r.status not in ("finished", "diverged") for r in self.runs)

    @property
    def diverged(self) -> int:
        return sum(r.status == "diverged" for r in self.runs)


# --------------------------------------------------------------------------- statistics

def mean_std(values: list) -> tuple[float, float]:
    """Mean and sample std (ddof=1) of the values; std NaN for fewer than two; NaN mean for none."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(np.mean(v)), float(np.std(v, ddof=1)) if v.size > 1 else float("nan")


def summarise(group: GroupStats) -> None:
    """Fill ``group.mean``/``std`` over its evaluated runs.

    Time to target is NaN for the group unless every evaluated run reached the target
    (``reached`` counts those that did), and None when a run has no simulated clock.
    """
    done = [r for r in group.runs if r.evaluated]
    group.reached = sum(bool(np.isfinite(r.to_target)) for r in done)
    for name in STATS:
        vals = [getattr(r, name) for r in (group.runs if name == "rounds" else done)]
        if name == "sim_to_target" and any(r.sim_to_target is None for r in group.runs):
            group.mean[name] = group.std[name] = None
            continue
        group.mean[name], group.std[name] = mean_std(vals)


def _check_kinds(groups: list[GroupStats]) -> str:
    """The one quality metric of all evaluated runs; error when accuracy and loss runs mix."""
    by_kind = {}
    for g in groups:
        for r in g.runs:
            if r.evaluated:
                by_kind.setdefault(r.kind, (g.label, r.path))
    if len(by_kind) > 1:
        (la, pa), (ll, pl) = by_kind["accuracy"], by_kind["loss"]
        raise HpcflError(f"runs with a test accuracy (e.g. {pa.parent}, group {la!r}) and runs with a test loss "
                         f"only (e.g. the quadratic model: {pl.parent}, group {ll!r}) cannot share one table; "
                         f"report them separately, passing each kind's run directories to its own hpcfl report")
    return next(iter(by_kind), "accuracy")


def _check_target(target: float | None, kind: str) -> None:
    if target is not None and kind == "accuracy" and not 0 <= target <= 1:
        raise HpcflError(f"--target {target:g}: test accuracy is a fraction in [0, 1]; e.g. --target 0.9 for 90%")


# --------------------------------------------------------------------------- baseline and paper

def find_baseline(groups: list[GroupStats], spec: str, keys: list[str]) -> GroupStats:
    """The group named by ``--baseline``: a group's full label, or ``KEY=VALUE`` matching one group."""
    for g in groups:
        if spec in (g.label, g.short, g.alias):
            return g
    key, sep, value = spec.partition("=")
    if not sep:
        raise HpcflError(f"--baseline {spec!r}: expected KEY=VALUE, e.g. --baseline algorithm.name=fedavg")
    flat = [flatten(c) for g in groups for c in g.configs]
    full = R.resolve_key(key.strip(), flat, preferred=keys)
    value = value.strip()
    hits = [g for g in groups if all(R.value_matches(flatten(c).get(full), value) for c in g.configs)]
    if not hits:
        seen = sorted({R.format_value(f.get(full)) for f in flat})
        raise HpcflError(f"--baseline {spec}: no group has {full} = {value}; its values are {', '.join(seen)}")
    if len(hits) > 1:
        raise HpcflError(f"--baseline {spec} matches {len(hits)} groups ({'; '.join(g.label for g in hits)}); "
                         f"pass one group's full label instead, e.g. --baseline '{hits[0].label}'")
    return hits[0]


def _ratio(base, mine) -> float:
    if base is None or mine is None or not (np.isfinite(base) and np.isfinite(mine)) or mine == 0:
        return float("nan")
    return base / mine


def apply_baseline(groups: list[GroupStats], base: GroupStats) -> None:
    """speedup = baseline's mean rounds (and simulated seconds) to target / the group's."""
    for g in groups:
        g.speedup = _ratio(base.mean["to_target"], g.mean["to_target"])
        if base.mean["sim_to_target"] is not None and g.mean["sim_to_target"] is not None:
            g.sim_speedup = _ratio(base.mean["sim_to_target"], g.mean["sim_to_target"])


def apply_paper(groups: list[GroupStats], specs: list[str]) -> None:
    """``LABEL=VALUE``: the paper's number for the group labelled LABEL (split at the last ``=``)."""
    labels = {g.alias: g for g in groups if g.alias} | {g.short: g for g in groups} | {g.label: g for g in groups}
    for spec in specs:
        label, sep, value = spec.rpartition("=")
        if not sep or label.strip() not in labels:
            raise HpcflError(f"--paper {spec!r}: expected GROUP LABEL=VALUE with one of the labels "
                             f"{'; '.join(repr(g.label) for g in groups)}, e.g. --paper '{groups[0].label}=0.85'")
        try:
            labels[label.strip()].paper = float(value)
        except ValueError:
            labels[label.strip()].paper = value.strip()


# --------------------------------------------------------------------------- building

@dataclass
class Built:
    """What :func:`build` finds: the groups in their order, and what the tables say under them."""

    groups: list[GroupStats]
    kind: str                     # "accuracy" or "loss"
    notes: list[str]              # slot differences, the --best-by choice
    warnings: list[str]           # unmatched seeds of the paired differences
    baseline: GroupStats | None = None


def restrict(g: GroupStats, runs: list) -> GroupStats:
    """``g`` holding only ``runs`` (a subset of its own), re-summarised."""
    keep = [i for i, r in enumerate(g.runs) if any(r is x for x in runs)]
    out = replace(g, configs=[g.configs[i] for i in keep], runs=[g.runs[i] for i in keep], mean={}, std={},
                  paired={})
    summarise(out)
    return out


def build(paths: list, by=None, target: float | None = None, last_k: int = 5, baseline: str | None = None,
          paper: list[str] | None = None, *, order_spec: str | None = None, best_by: str | None = None,
          criterion: str = "last_k", select_seeds: str | None = None) -> Built:
    """Find, load, group, order and summarise the runs; see :func:`.report.report_text` for the arguments."""
    if last_k < 1:
        raise HpcflError(f"--last-k {last_k}: must be at least 1 (the number of last evaluations to average)")
    if select_seeds is not None and best_by is None:
        raise HpcflError("--select-seeds needs --best-by: the seeds it names choose the --best-by value")
    files = order.sweep_order(list(paths), R.find_runs(list(paths)))
    results = R.load_runs(files)   # damaged runs are skipped with a warning naming them
    path_of = {id(r): r.source for r in results}
    full_best = None
    if best_by is not None:
        flat = [flatten(r.config) for r in results]
        full_best = R.resolve_key(best_by, flat, preferred=R.differing_keys([r.config for r in results]))
        if by is not None and full_best not in R.group_keys(results, by):
            by = list(by) + [full_best]   # the grid's values must stay apart to choose among them
    keys = R.group_keys(results, by)
    aliases = R.dotted_labels(results, by)
    groups = []
    for label, members in R.group_runs(results, by).items():
        configs = [m.config for m in members]
        flat0 = flatten(configs[0])
        g = GroupStats(label=label, keys={k: flat0.get(k) for k in keys}, configs=configs,
                       runs=[R.run_stats(m, path_of[id(m)], target, last_k) for m in members],
                       alias=aliases[label], short=label)
        summarise(g)
        groups.append(g)
    kind = _check_kinds(groups)
    _check_target(target, kind)
    notes: list[str] = []
    if full_best is not None:
        groups, said = bestby.choose(groups, full_best, keys, criterion, bestby.parse_seeds(select_seeds), kind,
                                     restrict)
        notes += said
    groups = order.apply_order(groups, order_spec, keys)
    base = find_baseline(groups, baseline, keys) if baseline is not None else None
    notes = slots.name_slots(groups, keys, base) + notes
    warnings: list[str] = []
    if base is not None:
        if target is not None:
            apply_baseline(groups, base)
        warnings = paired.apply_paired(groups, base, kind)
    apply_paper(groups, paper or [])
    return Built(groups, kind, notes, warnings, base)
