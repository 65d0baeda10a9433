"""Checking a paper job's ``[paper]`` quotes against its runs (:mod:`.paper` reads the table): each
quote's run is built from the job's ``[sweep]`` points and ``set``, validated and resolved (defaults
and presets filled in), and refused when it uses one of ``hpcfl_rules`` without ``rules = "hpcfl"``.
A module of its own because it builds jobs through :mod:`hpcfl.config`, which imports :mod:`.paper`.
"""

from __future__ import annotations

import itertools

from ..errors import ConfigError
from . import apply_overrides, from_dict
from .paper import read
from .read import read_job
from .sweepgrid import read_grid, set_text
from .tomltext import flatten


def runs_of(base: dict, grid: dict, run: dict) -> tuple[list[tuple[str, dict]], list[str]]:
    """The runs a quote's ``point`` and ``set`` name: [(label, job tables)], problems."""
    point, problems = run["point"], []
    for key, value in point.items():
        if key not in grid:
            problems.append(f"point key {key!r} is not a [sweep] key of the job ({', '.join(grid) or 'none'}); "
                            f"put it in set")
        elif value not in grid[key]:
            problems.append(f"point {key} = {value!r} is not among the [sweep] values {grid[key]!r}")
    if problems:
        return [], problems
    found = []
    for combo in itertools.product(*grid.values()):
        values = dict(zip(grid, combo))
        if all(values[k] == v for k, v in point.items()):
            sets = [set_text(k, v) for k, v in values.items()] + [set_text(k, v) for k, v in run["set"].items()]
            found.append((" ".join(sets) or "the job as written", apply_overrides(base, sets)))
    return found, []


def rule_values(table: dict, rules: dict) -> list[str]:
    """The ``hpcfl_rules`` values the resolved job ``table`` uses, as "key = value" texts."""

    resolved = flatten(from_dict(table).to_dict())
    return [f"{k} = {resolved[k]!r}" for k, values in rules.items() if k in resolved and resolved[k] in values]


def check_table(table: dict) -> list[str]:
    """Problems of a parsed paper job (``[sweep]`` and ``[paper]`` still in it): each quote must name
    at least one valid run, and its rules label must agree with the ``hpcfl_rules`` values its runs use."""

    table = dict(table)
    grid = read_grid(table.pop("sweep")) if "sweep" in table else {}
    paper, problems = read(table.get("paper", {}))
    if problems:
        return problems
    for i, q in enumerate(paper["quotes"]):
        where = f"paper.quote[{i}] ({q['figure']}, {q['metric']} {q['value']})"
        for side, run in (("", q), (" versus", q["versus"])):
            if run is None:
                continue
            runs, found = runs_of(table, grid, run)
            problems += [f"{where}{side}: {p}" for p in found]
            if not runs and not found:
                problems.append(f"{where}{side}: no [sweep] point matches point = {run['point']!r}")
            for label, job in runs:
                try:
                    used = rule_values(job, paper["hpcfl_rules"])
                except ConfigError as exc:
                    problems += [f"{where}{side}: the run ({label}) is not a valid job: {p}" for p in exc.problems]
                    continue
                if used and q["rules"] != "hpcfl":
                    problems.append(f"{where}{side}: the run ({label}) uses hpcfl's own rule {', '.join(used)}, not "
                                    f"the paper's; attach the quote to the paper's setting, or label it "
                                    f"rules = \"hpcfl\"")
                elif not used and q["rules"] == "hpcfl" and side == "":
                    problems.append(f"{where}: labelled rules = \"hpcfl\" but the run ({label}) uses none of "
                                    f"paper.hpcfl_rules; drop the label or list the rule in paper.hpcfl_rules")
    return problems


def check_job(path) -> list[str]:
    """:func:`check_table` of the job file ``path``."""

    return check_table(read_job(path))
