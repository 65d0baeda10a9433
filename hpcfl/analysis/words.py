"""Config values in words, for figures: legend entries and captions.

``hpcfl report`` names its groups by dotted keys (``name=fednova, lr=0.1``), which its
``--baseline`` and ``--paper`` options match; a figure for a paper says the same in words:
``FedNova, lr 0.1``, ``FedAvg, E ~ U{1..5}``, and puts what all runs share in a caption
(``digits, Dirichlet alpha = 0.5 over 20 clients, 10 per round; mlp [64]; ...``).
"""

from __future__ import annotations

import json

from ..algorithms import registry
from ..plugins import table_name

# The presets' and policies' words are declared beside their registry entries (a new algorithm
# brings its own); these are the same dicts, so a policy registered later is found too.
PRESETS = registry.LABELS
SLOTS = {f"algorithm.{slot}": words for slot, words in registry.SLOT_LABELS.items()}
# "{}" is the value
KEYS = {"algorithm.lr": "lr {}", "algorithm.mu": "mu = {}", "algorithm.momentum": "momentum {}",
        "algorithm.server_lr": "server lr {}", "algorithm.server_momentum": "server momentum {}",
        "algorithm.local_epochs": "E = {}", "algorithm.local_steps": "K = {} steps", "algorithm.batch_size": "B = {}",
        "algorithm.weight_decay": "weight decay {}", "algorithm.clients_per_round": "{} clients per round",
        "algorithm.sampling": "{} sampling", "data.num_clients": "{} clients", "data.dataset": "{}",
        "data.partition": "{} split", "model.name": "{}", "run.rounds": "{} rounds", "runtime.reduce": "{} sum",
        "runtime.dtype": "{}", "algorithm.lr_schedule": "{} lr"}


def value_text(v) -> str:
    """A config value as words: strings bare, numbers as written, lists as [a, b]."""
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, str):
        return v
    if isinstance(v, float):
        return f"{v:g}"
    return json.dumps(v).replace(",", ", ").replace(",  ", ", ")


def _random_epochs(flat: dict) -> str:
    lo, hi = flat.get("algorithm.random_epochs.low", "?"), flat.get("algorithm.random_epochs.high", "?")
    return f"E ~ U{{{lo}..{hi}}}"


def key_words(key: str, flat: dict) -> str:
    """One grouping key of one run (its flattened config ``flat``) in words."""
    v = flat.get(key)
    parts = key.split(".")
    if (v is None and len(parts) == 3 and parts[0] == "algorithm" and parts[1] in registry.OPTIONS
            and parts[1] not in {flat.get(f"algorithm.{slot}") for slot in registry.SLOTS}):
        return ""   # an option of a policy this run does not use: nothing to say ("FedAvg", not "FedAvg, q unset")
    if v is None:
        return f"{key.rsplit('.', 1)[-1]} unset"
    if key == "algorithm.name":
        return PRESETS.get(v, str(v))
    if key.startswith("algorithm.random_epochs.") or (key == "algorithm.steps" and v == "random_epochs"):
        return _random_epochs(flat)
    if key in SLOTS:
        return SLOTS[key].get(v, f"{key.rsplit('.', 1)[-1]} {v}")
    if key.startswith("data.dirichlet") and key.endswith(".alpha"):
        return f"Dirichlet alpha = {value_text(v)}"
    if key in KEYS:
        return KEYS[key].format(value_text(v))
    return f"{key.rsplit('.', 1)[-1]} = {value_text(v)}"


def group_words(keys: list[str], flat: dict) -> str:
    """A group's legend entry: its grouping keys in words, each idea once (``FedNova, lr 0.1``)."""
    parts = [p for p in dict.fromkeys(key_words(k, flat) for k in keys) if p]
    return ", ".join(parts) or "all runs"


def partition_words(name: str, options: dict, defaults: dict | None = None) -> str:
    """``dirichlet (alpha = 0.5)``: the partition with its first option and any option off its default."""
    shown = [k for i, k in enumerate(options) if i == 0 or (defaults is not None and options[k] != defaults.get(k))]
    shown = [k for k in shown if options.get(k) is not None]
    inner = ", ".join(f"{k} = {value_text(options[k])}" for k in shown)
    return f"{name} ({inner})" if inner else name


def caption(flat: dict, differing: set[str]) -> str:
    """What every run of a figure shares, from one run's flattened config: data, split,
    clients, model, algorithm and its main settings; keys in ``differing`` are left out
    (the legend says them)."""
    def same(*keys):
        return not any(k in differing or any(d.startswith(k + ".") for d in differing) for k in keys)

    parts = []
    data = flat.get("data.dataset", "?")
    part = flat.get("data.partition")
    if same("data.dataset"):
        parts.append(str(data))
    table = table_name(part) if isinstance(part, str) else part   # a plug-in's options: [data.<attribute>]
    if part and same("data.partition", f"data.{table}"):
        opts = {k.rsplit(".", 1)[-1]: v for k, v in flat.items() if k.startswith(f"data.{table}.")}
        parts.append(partition_words(str(part), opts))
    clients = []
    if same("data.num_clients") and "data.num_clients" in flat:
        clients.append(f"{flat['data.num_clients']} clients")
    cohort = flat.get("algorithm.clients_per_round")
    if same("algorithm.clients_per_round") and cohort is not None:
        clients.append("all per round" if cohort == 0 else f"{cohort} per round")
    if clients:
        parts.append(", ".join(clients))
    model = flat.get("model.name")
    if model and same("model.name", f"model.{table_name(model) if isinstance(model, str) else model}"):
        hidden = flat.get(f"model.{table_name(model) if isinstance(model, str) else model}.hidden")
        parts.append(f"{model} {value_text(hidden)}" if hidden is not None else str(model))
    alg = [key_words("algorithm.name", flat)] if same("algorithm.name") and "algorithm.name" in flat else []
    alg += [key_words(k, flat) for k in ("algorithm.lr", "algorithm.batch_size") if same(k) and k in flat]
    steps = flat.get("algorithm.steps")
    if steps == "epochs" and same("algorithm.local_epochs", "algorithm.steps"):
        alg.append(key_words("algorithm.local_epochs", flat))
    elif steps == "fixed" and same("algorithm.local_steps", "algorithm.steps"):
        alg.append(key_words("algorithm.local_steps", flat))
    if alg:
        parts.append(", ".join(alg))
    # every other shared setting off its default (E ~ U{1..5}, momentum 0.9, 30 rounds, ...)
    said = set(parts) | set(alg)
    more = [w for w in dict.fromkeys(key_words(k, flat) for k in sorted(off_default(flat))
                                     if not k.startswith((*CAPTIONED, f"data.{part}.")) and same(k))
            if w not in said]
    if more:
        parts.append(", ".join(more))
    return "; ".join(parts)


# keys the caption says above, or that identify a run or do not change its results
CAPTIONED = ("data.dataset", "data.partition", "data.num_clients", "algorithm.clients_per_round", "model.",
             "algorithm.name", "algorithm.lr", "algorithm.batch_size", "algorithm.local_epochs",
             "algorithm.local_steps", "run.name", "run.seed", "run.eval_", "runtime.", "checkpoint.", "watchdog.",
             "results.", "data.root", "data.cache", "guard.")


def off_default(flat: dict) -> list[str]:
    """The keys of a run's flattened config whose value differs from the job's default: that of a
    job naming the same dataset, partition, model and algorithm and nothing else (so a preset's own
    settings are no difference). Empty when such a job cannot be built (an older file's keys)."""
    from ..config import flatten, from_dict
    from ..errors import HpcflError

    base = {"data": {k: flat[f"data.{k}"] for k in ("dataset", "partition") if f"data.{k}" in flat},
            "model": {"name": flat["model.name"]} if "model.name" in flat else {},
            "algorithm": {"name": flat["algorithm.name"]} if "algorithm.name" in flat else {}}
    try:
        defaults = flatten(from_dict({k: v for k, v in base.items() if v}).to_dict())
    except (HpcflError, KeyError, TypeError, ValueError):
        return []
    return [k for k, v in flat.items() if k in defaults and defaults[k] != v]
