"""How ``hpcfl report``'s tables are laid out: each cell's text (``mean ± std``, a speedup, a target
not reached by every run), the columns a report shows, its notes, and the four formats: aligned
text, GitHub markdown, CSV (plain numbers) and JSON (every run's own values). The groups and
their statistics come from :mod:`.groupstats`.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from . import paired as P
from . import runs as R
from .groupstats import CLIENT_COLUMNS, SHORT, GroupStats
from .precision import pm_text

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
    """``mean ± std`` of a group's statistic, the std to 2 significant digits and the mean to the
    same place (:mod:`.precision`); the mean alone, as ``style`` writes it, from a single run."""
    return pm_text(g.mean[name], g.std[name], lambda v: _fmt(v, style))


def _delta_cell(g: GroupStats, name: str, style: str, base) -> str:
    """``+0.012 ± 0.0040 (3/3 better)``: the paired difference to the baseline (:mod:`.paired`)."""
    if g is base:
        return "baseline"
    return P.cell(g.paired.get(name), lambda m, s: pm_text(m, s, lambda v: _fmt(v, style), sign=True))


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


def _columns(groups: list[GroupStats], kind: str, target, last_k: int, baseline, markdown: bool) -> list[tuple]:
    """(header, group cell, run cell) of each shown column; the headers name the metric.

    ``baseline``: the baseline group (or None): a speedup column with a target, and the paired
    differences to it.
    """
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
    if baseline is not None and target is not None:
        cols.append(("speedup", lambda g: _fmt(g.speedup, "x"), lambda r: ""))
        if any(g.sim_speedup is not None for g in groups):
            cols.append(("sim speedup", lambda g: _fmt(g.sim_speedup, "x"), lambda r: ""))
    if baseline is not None:
        for name, head in (("final", "final"), ("last_k", f"last-{last_k}")):
            cols.append((f"Δ {head} vs {baseline.short}", lambda g, n=name: _delta_cell(g, n, st, baseline),
                         lambda r: ""))
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
    notes = [f"{SHORT[kind]}: {what}; mean ± sample std over a group's runs (seeds), the std to 2 significant "
             f"digits and the mean to the same place; last-{last_k}: mean of the last {last_k} evaluations"]
    if target is not None:
        notes.append("rounds to target: first round reaching it; - (k/n): only k of n runs reached it")
    if baseline is not None and target is not None:
        notes.append(f"speedup: mean rounds to target of the baseline ({baseline}) / the group's")
    if baseline is not None:
        better = "higher" if kind == "accuracy" else "lower"
        notes.append(f"Δ: the group minus the baseline ({baseline}) run by run, matched by seed: mean ± sample std "
                     f"over the matched seeds, and in how many of them the group is better ({better})")
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
    for name in P.PAIRED_STATS:   # paired differences to --baseline (empty without one, and on its own row)
        head += [f"delta_{name}_{x}" for x in ("mean", "std", "n", "better")]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for g in groups:
        row = [g.label, len(g.runs), kind, _plain(target), last_k]
        for name in CSV_STATS:
            row += [_plain(g.mean[name]), _plain(g.std[name])]
        row += [g.reached if target is not None else "", _plain(g.speedup), _plain(g.sim_speedup), _plain(g.paper),
                g.running]
        for name in P.PAIRED_STATS:
            p = g.paired.get(name)
            row += ["", "", "", ""] if p is None else [_plain(p.mean), _plain(p.std), p.n, p.better]
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
              "paired": {k: None if p is None else {"mean": p.mean, "std": _json_num(p.std), "n": p.n,
                                                     "better": p.better, "worse": p.worse, "seeds": list(p.seeds)}
                         for k, p in g.paired.items()} or None,
              "runs": [{"path": str(r.path), "seed": r.seed, "status": r.status, "rounds": r.rounds}
                       | {CSV_STATS[k]: _json_num(getattr(r, k)) for k in CSV_STATS if k != "rounds"}
                       for r in g.runs]}
        out.append(d)
    return json.dumps(out, indent=1) + "\n"
