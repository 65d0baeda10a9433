"""The refusal to write a different job into a run folder names what the user changed,
and the keys a changed preset fills in as following from it (README tour, first line)."""

import re

from hpcfl import config
from hpcfl.engine.planning import job_difference

JOB = {"run": {"rounds": 3}, "data": {"dataset": "digits", "num_clients": 4}, "model": {"name": "mlp"},
       "algorithm": {"name": "fedavg", "clients_per_round": 2}}


def differ(**sets):
    old = config.from_dict(JOB)
    table = {k: dict(v) for k, v in JOB.items()}
    for key, value in sets.items():
        section, name = key.split("__")
        table[section][name] = value
    new = config.from_dict(table)
    changed, _ = config.resume_changes(old.to_dict(), new)
    return job_difference(old.to_dict(), new, [k for k in changed if not config.is_safe_change(k)])


def test_preset_keys_follow_the_name():
    text = differ(algorithm__name="fednova")
    assert text.startswith('differs in algorithm.name "fedavg" -> "fednova" (its preset also sets ')
    implied = re.search(r"its preset also sets (.*)\)$", text).group(1).split(", ")
    assert "algorithm.server" in implied and "algorithm.name" not in implied


def test_keys_the_user_set_keep_their_values():
    assert differ(algorithm__lr=0.1) == "differs in algorithm.lr 0.05 -> 0.1"
    text = differ(algorithm__name="fednova", algorithm__lr=0.1)
    assert text.startswith('differs in algorithm.name "fedavg" -> "fednova", ')
    assert "its preset also sets" in text and "algorithm.lr" in text
