"""What hpcfl tells the user about a job besides its errors.

- :func:`start_notes`: what a run says before round 1 because the job leaves it implicit;
- :func:`describe_changes`: the safe keys a resumed run changed, old and new values;
- :func:`missing_tables`: the problem of a job file without ``[data]`` or ``[model]``.

The run's other notes come from where the facts are: ``Config.notes`` (a ``--set`` that
left a component table out, :func:`hpcfl.config.apply_overrides`) and
``Algorithm.notes`` (values derived from the data, such as a preset's tau0).
"""

from __future__ import annotations

import json

from ..algorithms import milestone_rounds
from .sections import defaults as section_defaults
from .tomltext import flatten


def missing_tables(what: str, missing: list[str]) -> list[str]:
    """The problem of a job without [data] or [model] (none when ``missing`` is empty); ``what``
    names the job, e.g. ``job file 'x.toml'``."""
    if not missing:
        return []
    example = {"data": 'dataset = "digits"', "model": 'name = "mlp"'}
    return [f"{what} has no {' and no '.join(f'[{m}]' for m in missing)} table: a job names its "
            f"data and model ({'; '.join(f'[{m}] {example[m]}' for m in missing)}; see jobs/quickstart.toml) "
            f"instead of running on the defaults"]


def start_notes(cfg) -> list[str]:
    """What a run of ``cfg`` should say before it starts, because the job leaves it implicit.

    - a step lr schedule given as fractions of ``run.rounds``: the rounds they resolve to
      (``--set run.rounds=100`` on a 1000-round job moves them);
    - FedLGA with no client ever cut short: then it is FedAvg with uniform weights.
    """
    a, notes = cfg.algorithm, []
    if a.lr_schedule == "step" and a.lr_milestone_rounds is None:
        at = milestone_rounds(a.lr_schedule, a.lr_milestones, None, cfg.run.rounds)
        notes.append(f"the lr is multiplied by {a.lr_gamma:g} after round{'s' if len(at) > 1 else ''} "
                     f"{', '.join(map(str, at))}: algorithm.lr_milestones {list(a.lr_milestones)} are fractions of "
                     f"run.rounds = {cfg.run.rounds} (algorithm.lr_milestone_rounds fixes them in rounds)")
    deadline = cfg.system is not None and cfg.system.enabled and cfg.system.deadline_s is not None
    if a.server == "lga" and a.steps != "straggler" and not deadline:
        notes.append("FedLGA corrects the updates of clients cut short, and in this job none is (steps = "
                     f"{a.steps!r}, no [system] deadline): it runs as FedAvg with {a.weights} weights. Give it slow "
                     "clients with algorithm.steps = 'straggler' ([algorithm.straggler]) or a system.deadline_s")
    return notes


def describe_changes(old: dict, new, keys: list[str]) -> str:
    """``run.rounds 10 -> 12, runtime.threads 0 -> 1``: changed keys with the stored and the new value."""
    a, b = flatten(old), flatten(new.to_dict())
    defaults = flatten(section_defaults())
    show = lambda d, k: json.dumps(d.get(k, defaults.get(k)))   # noqa: E731  (stored jobs omit unset keys)
    return ", ".join(f"{k} {show(a, k)} -> {show(b, k)}" for k in keys)
