"""A paper job's ``[paper]`` table: the paper's figures the job quotes, the run each belongs to, and
which settings are hpcfl's own rules rather than the paper's. The engine ignores it; a job is
refused when the table is malformed, and :func:`check_job` checks every quote against the runs.

::

    [paper]
    hpcfl_rules = { "algorithm.gift.mode" = ["stagnation"] }   # values that are hpcfl's, not the paper's

    [[paper.quote]]
    figure = "Table II, LeNet-5, GIFT"
    point = { "algorithm.gift.mode" = "literal" }   # the [sweep] point(s) it belongs to
    metric = "final_accuracy"
    value = 0.568

A quote's run is the job's ``[sweep]`` points whose values agree with ``point`` (every point
when ``point`` is left out; a job without ``[sweep]`` is one point), with ``set`` applied on top
as ``--set`` would (a run the header derives from a point: FedProx from the FedAvg point). A
relative figure ("28.9 % less time than AdaComm") names its other run in ``versus``, with its
own ``point`` and ``set``. A quote on a run that uses a value listed in ``hpcfl_rules`` must say
so with ``rules = "hpcfl"`` (the paper's figure shown beside hpcfl's rule, not a reproduction of
it); a quote with ``rules = "hpcfl"`` on a run that uses none of them is refused too.
"""

from __future__ import annotations

import itertools

from ..errors import ConfigError
from .tomltext import flatten

# What a quoted figure measures; the ones that end in "target" (and time_saved) need a target accuracy.
METRICS = {
    "final_accuracy": "test accuracy after the last round",
    "best_accuracy": "best test accuracy over the run",
    "last10_accuracy": "mean test accuracy of the last 10 evaluations",
    "rounds_to_target": "first evaluated round whose test accuracy reaches target",
    "sim_hours": "simulated hours of the whole run",
    "time_saved": "fraction of simulated time to target saved against the versus run",
}
NEEDS_TARGET = ("rounds_to_target", "time_saved")
RULES = ("paper", "hpcfl")
QUOTE_KEYS = ("figure", "metric", "value", "point", "set", "versus", "target", "rules", "note")
EXAMPLE = ('[[paper.quote]] figure = "Table II, GIFT", point = { "algorithm.gift.mode" = "literal" }, '
           'metric = "final_accuracy", value = 0.568')


def read(raw) -> tuple[dict, list[str]]:
    """Validate a ``[paper]`` table. Returns ({"hpcfl_rules": {key: [values]}, "quotes": [quote dicts
    with ``point``, ``set`` flattened to dotted keys]}, problems); problems name the key and the fix."""
    out = {"hpcfl_rules": {}, "quotes": []}
    if not isinstance(raw, dict):
        return out, [f"paper must be a table ([paper]), found {raw!r}"]
    problems = [f"paper.{k} is not a key of [paper]; it takes hpcfl_rules and [[paper.quote]] tables"
                for k in raw if k not in ("hpcfl_rules", "quote")]
    rules = raw.get("hpcfl_rules", {})
    if not isinstance(rules, dict):
        problems.append(f"paper.hpcfl_rules must be a table of \"section.key\" = [values], found {rules!r}")
        rules = {}
    for key, values in flatten(rules).items():
        if not isinstance(values, list) or not values:
            problems.append(f"paper.hpcfl_rules.{key!r} = {values!r} must be a non-empty list of values, e.g. "
                            f"\"algorithm.gift.mode\" = [\"stagnation\"]")
        else:
            out["hpcfl_rules"][key] = values
    quotes = raw.get("quote", [])
    if not isinstance(quotes, list) or not all(isinstance(q, dict) for q in quotes):
        problems.append(f"paper.quote must be an array of tables ([[paper.quote]]), e.g. {EXAMPLE}")
        quotes = []
    for i, q in enumerate(quotes):
        quote, found = _quote(q, f"paper.quote[{i}]")
        problems += found
        if quote is not None:
            out["quotes"].append(quote)
    return out, problems


def _quote(q: dict, where: str) -> tuple[dict | None, list[str]]:
    problems = [f"{where}.{k} is not a key of a quote; valid keys: {', '.join(QUOTE_KEYS)}" for k in q
                if k not in QUOTE_KEYS]
    for key in ("figure", "metric", "value"):
        if key not in q:
            problems.append(f"{where} has no {key}; a quote reads e.g. {EXAMPLE}")
    if not isinstance(q.get("figure", ""), str) or not q.get("figure", "x"):
        problems.append(f"{where}.figure must name the table or figure and row, e.g. \"Table II, LeNet-5, GIFT\"")
    metric = q.get("metric")
    if metric is not None and metric not in METRICS:
        problems.append(f"{where}.metric = {metric!r} is not one of {', '.join(METRICS)}")
    value = q.get("value")
    if value is not None and not _is_value(value):
        problems.append(f"{where}.value = {value!r} must be a number, or a bound such as \">1000\"")
    if metric in NEEDS_TARGET and not isinstance(q.get("target"), (int, float)):
        problems.append(f"{where}: metric {metric!r} needs target (the test accuracy to reach, e.g. target = 0.6)")
    if q.get("rules", "paper") not in RULES:
        problems.append(f"{where}.rules = {q.get('rules')!r} must be \"paper\" (the run follows the paper) or "
                        f"\"hpcfl\" (the paper's figure beside a run of hpcfl's own rule)")
    if metric == "time_saved" and "versus" not in q:
        problems.append(f"{where}: metric 'time_saved' needs versus (the run it saves time against)")
    run, found = _run(q, where)
    problems += found
    versus = None
    if "versus" in q:
        if not isinstance(q["versus"], dict):
            problems.append(f"{where}.versus must be a table with point and/or set, e.g. versus = {{ point = "
                            f"{{ \"algorithm.name\" = \"adacomm\" }} }}")
        else:
            bad = [k for k in q["versus"] if k not in ("point", "set")]
            problems += [f"{where}.versus.{k} is not a key of versus; it takes point and set" for k in bad]
            versus, found = _run(q["versus"], f"{where}.versus")
            problems += found
    if problems:
        return None, problems
    return {**{k: q[k] for k in q if k not in ("point", "set", "versus")}, "rules": q.get("rules", "paper"),
            **run, "versus": versus}, []


def _run(q: dict, where: str) -> tuple[dict, list[str]]:
    out, problems = {}, []
    for key in ("point", "set"):
        v = q.get(key, {})
        if not isinstance(v, dict):
            problems.append(f"{where}.{key} must be a table of \"section.key\" = value, found {v!r}")
            v = {}
        out[key] = flatten(v)
    return out, problems


def _is_value(v) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    if isinstance(v, str) and v[:1] in "<>":
        try:
            float(v[1:])
            return True
        except ValueError:
            return False
    return False


# ---- checking the quotes against the runs ----------------------------------------------------

def runs_of(base: dict, grid: dict, run: dict) -> tuple[list[tuple[str, dict]], list[str]]:
    """The runs a quote's ``point`` and ``set`` name: [(label, job tables)], problems."""
    from . import apply_overrides
    from ..cli.sweepgrid import set_text

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
    from . import from_dict

    resolved = flatten(from_dict(table).to_dict())
    return [f"{k} = {resolved[k]!r}" for k, values in rules.items() if k in resolved and resolved[k] in values]


def check_table(table: dict) -> list[str]:
    """Problems of a parsed paper job (``[sweep]`` and ``[paper]`` still in it): each quote must name
    at least one valid run, and its rules label must agree with the ``hpcfl_rules`` values its runs use."""
    from ..cli.sweepgrid import read_grid

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
    from .read import read_job

    return check_table(read_job(path))
