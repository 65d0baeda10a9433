"""The ``[sweep]`` grid of a job: its validation, the ``--set`` text of a value, and point names
(unique as folder names, also on a case-insensitive filesystem). Used by :mod:`hpcfl.cli.sweep` and by the paper-job checks (:mod:`.paper`); a config module, so both may use it."""

from __future__ import annotations

import hashlib
import re
from collections import Counter

from ..errors import ConfigError
from .tomltext import _canonical, toml_value

_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_MAX_NAME = 128   # config.RUN_NAME's limit


def read_grid(raw) -> dict:
    """Validate a ``[sweep]`` table; returns {dotted key: list of values} in file order."""
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep must be a table ([sweep] with \"section.key\" = [values...]), found {raw!r}")
    from . import flatten  # unquoted dotted keys were grouped by section by TOML

    grid, problems = flatten(raw), []
    for key, values in grid.items():
        if len(key.split(".")) < 2 or not all(key.split(".")):
            problems.append(f"sweep key {key!r} must be a dotted config key, e.g. \"algorithm.lr\" = [0.01, 0.1]")
        elif not isinstance(values, list):
            problems.append(f"sweep.{key!r} = {values!r} must be a list of values, e.g. \"{key}\" = "
                            f"[{toml_value(values) if isinstance(values, (bool, int, float, str)) else '...'}]")
        elif not values:
            problems.append(f"sweep.{key!r} is an empty list; give it at least one value, or remove the key")
        if key == "run.name":
            problems.append("sweep key 'run.name' cannot be swept: each point's run.name is its point name")
    if not grid:
        problems.append("the [sweep] table is empty; add \"section.key\" = [values...] lines, or use hpcfl run")
    if problems:
        raise ConfigError(problems)
    return grid


def set_text(key: str, value) -> str:
    """``key=value`` as ``--set`` reads it: the plain value when it parses back the same, else TOML."""
    from . import parse_override

    plain = f"{key}={value}" if isinstance(value, str) else None
    if plain is not None and parse_override(plain)[1] == value:
        return plain
    return f"{key}={toml_value(value)}"


def _leaf_labels(keys: list[str]) -> dict:
    """Each key's leaf, or the whole key when leaves collide (every key's label in earlier hpcfl versions)."""
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: leaf if leaves.count(leaf) == 1 else k for k, leaf in zip(keys, leaves)}


def _labels(keys: list[str]) -> dict:
    """Each key's label in point names: its leaf, or the whole key when leaves collide; None for a
    component's name (``algorithm.name``, ``model.name``, ``data.dataset``, ``data.partition``),
    whose value names itself: ``fedavg_seed-0``, not ``name-fedavg_seed-0`` (``name`` is also
    ``run.name`` and ``model.name``)."""
    leaf = _leaf_labels(keys)
    return {k: None if k.endswith(".name") or k in BARE_KEYS else leaf[k] for k in keys}


BARE_KEYS = ("data.dataset", "data.partition")   # with every "<section>.name": the value alone in point names


def _joined(grid: dict, labels: dict, combos: list[tuple]) -> list[str]:
    """Each combo's name: ``label-value`` for every key, joined by '_'; the value alone where the label is None."""
    return ["_".join(_safe(v) if labels[k] is None else f"{labels[k]}-{_safe(v)}" for k, v in zip(grid, combo))
            for combo in combos]


def legacy_names(grid: dict, combos: list[tuple]) -> list[str]:
    """The names earlier hpcfl versions gave the points (``name-fedavg_seed-0``: leaf, '-', value for
    every key), so that a sweep started then resumes in its own folders."""
    return _joined(grid, _leaf_labels(list(grid)), combos)


def _safe(value) -> str:
    """A value as a file-name fragment: runs of other characters than [A-Za-z0-9._-] become '-'."""
    text = value if isinstance(value, str) else toml_value(value)
    return "-".join(_NAME_CHARS.findall(text)) or "_"


def point_names(grid: dict, combos: list[tuple]) -> list[str]:
    """Names of the points ``combos`` (value tuples in ``grid``'s key order), unique as folder names.

    Unique by construction except when two values look alike once made safe ("a/b", "a:b"):
    those points get their index appended. Where that still collides (a third value "a-b_1"),
    or names differ only in letter case (one folder on a case-insensitive filesystem), each
    colliding point gets a hash of its exact values instead. Names too long for run.name are
    shortened and made unique with a hash of the full name. Raises ConfigError if two points
    would still share a folder, so that nothing runs and no point's job overwrites another's.
    """
    base = _joined(grid, _labels(list(grid)), combos)
    folded = Counter(n.casefold() for n in base)
    names = [n if folded[n.casefold()] == 1 else f"{n}_{i}" for i, n in enumerate(base)]
    folded = Counter(n.casefold() for n in names)
    for i, combo in enumerate(combos):
        if folded[names[i].casefold()] > 1:
            names[i] = f"{base[i]}-{_digest(_canonical(list(combo)))}"
    names = [n if len(n) <= _MAX_NAME else f"{n[:_MAX_NAME - 9]}-{_digest(n)}" for n in names]
    folded = Counter(n.casefold() for n in names)
    clash = [n for n in names if folded[n.casefold()] > 1]
    if clash:
        raise ConfigError(f"[sweep] points {clash[0]!r} and another would share one folder; make their values "
                          f"differ in letters or digits")
    return names


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:8]


