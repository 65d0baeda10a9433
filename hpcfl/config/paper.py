"""A paper job's ``[paper]`` table: the paper's figures the job quotes, the run each belongs to, and
which settings are hpcfl's own rules rather than the paper's. The engine ignores it; a job is
refused when the table is malformed, and :func:`hpcfl.config.paperjobs.check_job` checks every quote
against the runs.

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
