"""What ``hpcfl report`` prints (its command line is :mod:`hpcfl.cli.report`): a table of final, best
and time-to-target quality per group of runs.

Runs are grouped by the config keys that differ between them (:mod:`.runs`), so seeds of
one configuration form one group, summarised as mean ± sample std over the seeds. The
quality metric is test accuracy, or test loss for models without one (the quadratic
model). Formats: an aligned text table, a GitHub markdown table, CSV (plain numbers) and
JSON (with every run's own values).
"""

from __future__ import annotations

import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import flatten
from ..errors import HpcflError
from . import runs as R

FORMATS = ("text", "markdown", "csv", "json")
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

def _value_matches(v, text: str) -> bool:
    """Whether config value ``v`` is what ``text`` says (``0.1`` == ``0.10``, ``fedavg``, ``true``)."""
    if R.format_value(v) == text or str(v) == text:
        return True
    try:
        return not isinstance(v, bool) and isinstance(v, (int, float)) and float(v) == float(text)
    except ValueError:
        return False


def find_baseline(groups: list[GroupStats], spec: str, keys: list[str]) -> GroupStats:
    """The group named by ``--baseline``: a group's full label, or ``KEY=VALUE`` matching one group."""
    for g in groups:
        if spec in (g.label, g.alias):
            return g
    key, sep, value = spec.partition("=")
    if not sep:
        raise HpcflError(f"--baseline {spec!r}: expected KEY=VALUE, e.g. --baseline algorithm.name=fedavg")
    flat = [flatten(c) for g in groups for c in g.configs]
    full = R.resolve_key(key.strip(), flat, preferred=keys)
    value = value.strip()
    hits = [g for g in groups if all(_value_matches(flatten(c).get(full), value) for c in g.configs)]
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
    labels = {g.alias: g for g in groups if g.alias} | {g.label: g for g in groups}
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

def build(paths: list, by=None, target: float | None = None, last_k: int = 5, baseline: str | None = None,
          paper: list[str] | None = None) -> list[GroupStats]:
    """Find, load, group and summarise the runs; see :func:`report_text` for the arguments."""
    if last_k < 1:
        raise HpcflError(f"--last-k {last_k}: must be at least 1 (the number of last evaluations to average)")
    if baseline is not None and target is None:
        raise HpcflError("--baseline needs --target: the speedup compares rounds to reach the target")
    files = R.find_runs(list(paths))
    results = R.load_runs(files)   # damaged runs are skipped with a warning naming them
    path_of = {id(r): r.source for r in results}
    keys = R.group_keys(results, by)
    aliases = R.dotted_labels(results, by)
    groups = []
    for label, members in R.group_runs(results, by).items():
        configs = [m.config for m in members]
        flat0 = flatten(configs[0])
        g = GroupStats(label=label, keys={k: flat0.get(k) for k in keys}, configs=configs,
                       runs=[R.run_stats(m, path_of[id(m)], target, last_k) for m in members],
                       alias=aliases[label])
        summarise(g)
        groups.append(g)
    _check_target(target, _check_kinds(groups))
    if baseline is not None:
        apply_baseline(groups, find_baseline(groups, baseline, keys))
    apply_paper(groups, paper or [])
    return groups


# --------------------------------------------------------------------------- cells

def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and not np.isfinite(v))


def _fmt(v, style: str) -> str:
    """One number as text: ``acc`` 4 decimals, ``loss``/``sim`` 4 significant digits, ``round``
    an integer (one decimal for a mean that is not one), ``x`` a speedup; "-" when undefined."""
    if _missing(v):
        return "-"
    if style == "round":
        return str(int(v)) if float(v).is_integer() else f"{v:.1f}"
    return {"acc": f"{v:.4f}", "x": f"{v:.2f}x"}.get(style, f"{v:.4g}")


def _pm(g: GroupStats, name: str, style: str) -> str:
    """``mean ± std`` of a group's statistic; the mean alone from a single run (no std to show)."""
    mean, std = g.mean[name], g.std[name]
    if _missing(mean):
        return "-"
    return _fmt(mean, style) + ("" if _missing(std) else f" ± {_fmt(std, 'sim' if style == 'round' else style)}")


def repeated_seeds(groups: list[GroupStats]) -> list[str]:
    """A warning per group that holds several runs of one seed: its n then counts one run twice
    (a copy of a run directory, the same job into two --out) and its std is too small."""
    out = []
    for g in groups:
        seeds = [r.seed for r in g.runs]
        for seed in dict.fromkeys(s for s in seeds if seeds.count(s) > 1):
            dirs = ", ".join(str(r.path.parent) for r in g.runs if r.seed == seed)
            out.append(f"warning: group {g.label!r} holds {seeds.count(seed)} runs of seed {seed} ({dirs}); n counts "
                       f"each, as if they were independent: pass each run once, or --by run.seed to see them apart")
    return out


def _to_target_cell(g: GroupStats, name: str, style: str) -> str:
    n = sum(r.evaluated for r in g.runs)
    if g.mean[name] is not None and n and g.reached < n:
        return f"- ({g.reached}/{n})"   # some runs never reached it: no mean to show
    return _pm(g, name, style)


def _status(g: GroupStats) -> str:
    parts = [f"{n} {what}" for n, what in ((g.running, "running"), (g.diverged, "diverged")) if n]
    return ", ".join(parts) or "finished"


def _paper_cell(g: GroupStats) -> str:
    if g.paper is None:
        return "-"
    return f"{g.paper:g}" if isinstance(g.paper, float) else str(g.paper)


def _run_label(r: R.RunStats, markdown: bool) -> str:
    d = r.path.parent
    try:
        d = d.relative_to(Path.cwd())
    except ValueError:
        pass
    return f"{'↳ ' if markdown else '  '}seed {r.seed}: {d}"


def _columns(groups: list[GroupStats], kind: str, target, last_k: int, baseline: bool, markdown: bool) -> list[tuple]:
    """(header, group cell, run cell) of each shown column; the headers name the metric."""
    m, st = SHORT[kind], "acc" if kind == "accuracy" else "loss"
    cols = [("group", lambda g: g.label, lambda r: _run_label(r, markdown)),
            ("n", lambda g: str(len(g.runs)), lambda r: ""),
            (f"final {m}", lambda g: _pm(g, "final", st), lambda r: _fmt(r.final, st)),
            (f"best {m}", lambda g: _pm(g, "best", st), lambda r: _fmt(r.best, st)),
            ("best round", lambda g: _pm(g, "best_round", "round"), lambda r: _fmt(r.best_round, "round")),
            (f"last-{last_k} {m}", lambda g: _pm(g, "last_k", st), lambda r: _fmt(r.last_k, st))]
    if target is not None:
        t = f"{target:g}"
        cols.append((f"rounds to {t}", lambda g: _to_target_cell(g, "to_target", "round"),
                     lambda r: _fmt(r.to_target, "round")))
        if any(g.mean["sim_to_target"] is not None for g in groups):
            cols.append((f"sim s to {t}", lambda g: _to_target_cell(g, "sim_to_target", "sim"),
                         lambda r: _fmt(r.sim_to_target, "sim")))
    if baseline:
        cols.append(("speedup", lambda g: _fmt(g.speedup, "x"), lambda r: ""))
        if any(g.sim_speedup is not None for g in groups):
            cols.append(("sim speedup", lambda g: _fmt(g.sim_speedup, "x"), lambda r: ""))
    if any(g.paper is not None for g in groups):
        cols.append(("paper", _paper_cell, lambda r: ""))
    if any(np.isfinite(r.client_mean) for g in groups for r in g.runs):
        for name, head in CLIENT_COLUMNS.items():
            cols.append((head, lambda g, n=name: _pm(g, n, "acc"), lambda r, n=name: _fmt(getattr(r, n), "acc")))
    cols += [("rounds", lambda g: _pm(g, "rounds", "round"), lambda r: str(r.rounds)),
             ("status", _status, lambda r: r.status)]
    return cols


def _rows(groups, cols, per_run: bool) -> list[list[str]]:
    rows = []
    for g in groups:
        rows.append([c[1](g) for c in cols])
        if per_run:
            rows += [[c[2](r) for c in cols] for r in g.runs]
    return rows


def _notes(kind: str, target, last_k: int, baseline: str | None, client: bool = False) -> list[str]:
    what = "test accuracy (higher is better)" if kind == "accuracy" else "test loss (lower is better)"
    notes = [f"{SHORT[kind]}: {what}; mean ± sample std over a group's runs (seeds); last-{last_k}: mean of the "
             f"last {last_k} evaluations"]
    if target is not None:
        notes.append("rounds to target: first round reaching it; - (k/n): only k of n runs reached it")
    if baseline is not None:
        notes.append(f"speedup: mean rounds to target of the baseline ({baseline}) / the group's")
    if client:
        notes.append("client acc, worst 10%, client std, Jain: each client's test accuracy on its own held-out "
                     "rows at the last evaluated round (run.eval_clients): mean over clients, mean of the worst "
                     "10% of clients, std over clients, Jain's index (sum a)^2 / (N sum a^2)")
    return notes


# --------------------------------------------------------------------------- formats

def render_text(groups, cols, per_run: bool, notes: list[str]) -> str:
    rows = [[c[0] for c in cols]] + _rows(groups, cols, per_run)
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines + [""] + notes) + "\n"


def render_markdown(groups, cols, per_run: bool, notes: list[str]) -> str:
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    out = [line([c[0] for c in cols]), "|" + "|".join([":---"] + ["---:"] * (len(cols) - 1)) + "|"]
    out += [line(r) for r in _rows(groups, cols, per_run)]
    return "\n".join(out + [""] + [f"{n}." for n in notes]) + "\n"


CSV_STATS = {"final": "final", "best": "best", "best_round": "best_round", "last_k": "last_k",
             "to_target": "rounds_to_target", "sim_to_target": "sim_time_to_target", "rounds": "rounds",
             "client_mean": "client_accuracy", "client_worst10": "client_worst10", "client_std": "client_std",
             "client_jain": "client_jain"}


def _plain(v):
    """A number as plain CSV text (NaN and None empty)."""
    if _missing(v):
        return ""
    return format(v, ".10g") if isinstance(v, float) else str(v)


def render_csv(groups: list[GroupStats], kind: str, target, last_k: int) -> str:
    """One row per group, every column always present (empty where undefined)."""
    head = ["group", "n", "metric", "target", "k"]
    for name in CSV_STATS.values():
        head += [f"{name}_mean", f"{name}_std"]
    head += ["reached", "speedup", "sim_speedup", "paper", "running"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for g in groups:
        row = [g.label, len(g.runs), kind, _plain(target), last_k]
        for name in CSV_STATS:
            row += [_plain(g.mean[name]), _plain(g.std[name])]
        row += [g.reached if target is not None else "", _plain(g.speedup), _plain(g.sim_speedup), _plain(g.paper),
                g.running]
        w.writerow(row)
    return buf.getvalue()


def _json_num(v):
    return None if _missing(v) else v


def render_json(groups: list[GroupStats], kind: str, target, last_k: int) -> str:
    """A list of group dicts: mean/std per statistic, and each run's own values under ``runs``."""
    out = []
    for g in groups:
        d = {"group": g.label, "keys": g.keys, "n": len(g.runs), "metric": kind, "target": target, "k": last_k}
        d |= {CSV_STATS[k]: {"mean": _json_num(g.mean[k]), "std": _json_num(g.std[k])} for k in CSV_STATS}
        d |= {"reached": g.reached if target is not None else None, "speedup": _json_num(g.speedup),
              "sim_speedup": _json_num(g.sim_speedup), "paper": g.paper, "running": g.running,
              "runs": [{"path": str(r.path), "seed": r.seed, "status": r.status, "rounds": r.rounds}
                       | {CSV_STATS[k]: _json_num(getattr(r, k)) for k in CSV_STATS if k != "rounds"}
                       for r in g.runs]}
        out.append(d)
    return json.dumps(out, indent=1) + "\n"


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
