"""The order of ``hpcfl report``'s groups: the sweep's, or the one ``--order`` gives.

By default the runs are read in *sweep order* and the groups come in the order of their first
run, so a grid ``"algorithm.name" = ["fedavg", "fednova", "feddisco", "fedlga"]`` gives its
methods in that order, not alphabetically. A run's place is, in turn:

1. the position of the PATH argument it was found under (``hpcfl report a b``: a's runs first);
2. its sweep point index, recorded on the first line of the ``job.toml`` that ``hpcfl sweep``
   writes into every point's folder (:mod:`hpcfl.io.sweeppoint`; every sweep has);
3. its directory's path, for runs not made by a sweep (after the sweep's, under one PATH).

``--order`` then moves groups: ``--order fedlga,fedavg`` puts the groups each item names first,
in that order (an item is a group's label or key label, ``KEY=VALUE``, or a value of a grouping
key: ``fedlga`` names every group whose algorithm is FedLGA); the groups it does not name
follow in sweep order. ``--order KEY`` (one grouping key, e.g. ``--order lr``) sorts the groups
by that key's value instead, numbers ascending.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import HpcflError
from ..io.sweeppoint import point_index
from . import runs as R


def sweep_order(paths: list, files: list[Path]) -> list[Path]:
    """``files`` (results files found under ``paths``) in sweep order; see the module's text."""
    roots = [Path(p).resolve() for p in paths]

    def key(f: Path):
        arg = next((i for i, r in enumerate(roots) if f == r or r in f.parents), len(roots))
        index = point_index(f.parent)
        return arg, index is None, index or 0, str(f)

    return sorted(files, key=key)


def _names(g) -> set:
    return {g.label, g.short, g.alias} - {""}


def _matches(g, item: str, keys: list[str], flat_keys: dict) -> bool:
    """Whether ``item`` names group ``g``: a label, ``KEY=VALUE`` or a grouping key's value."""
    if item in _names(g):
        return True
    key, sep, value = item.partition("=")
    if sep:
        full = flat_keys.get(key.strip())
        return full is not None and R.value_matches(g.keys.get(full), value.strip())
    return any(R.value_matches(g.keys.get(k), item) for k in keys)


def _short_keys(keys: list[str]) -> dict:
    """Each grouping key by its full name, its leaf, and (when unique) its name in labels."""
    out = {k: k for k in keys}
    for k, name in R.short_names(keys).items():
        out.setdefault(name, k)
        out.setdefault(k.rsplit(".", 1)[-1], k)
    return out


def _sort_value(v):
    """Numbers before strings, numbers by value, the rest by their text."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return 0, float(v), ""
    return 1, 0.0, v if isinstance(v, str) else json.dumps(v, sort_keys=True)


def apply_order(groups: list, spec: str | None, keys: list[str]) -> list:
    """The groups in ``--order``'s order (None: as they are, the sweep's).

    Raises
    ------
    HpcflError
        For an item that names no group.
    """
    if not spec:
        return groups
    items = [s.strip() for s in spec.split(",") if s.strip()]
    by_name = _short_keys(keys)
    if len(items) == 1 and items[0] in by_name and not any(_matches(g, items[0], [], by_name) for g in groups):
        full = by_name[items[0]]
        return sorted(groups, key=lambda g: _sort_value(g.keys.get(full)))
    placed: list = []
    for item in items:
        hits = [g for g in groups if _matches(g, item, keys, by_name)]
        if not hits:
            raise HpcflError(f"--order {spec}: {item!r} names no group; name groups by label "
                             f"({'; '.join(repr(g.label) for g in groups)}), by KEY=VALUE, or by a value of "
                             f"{', '.join(keys) or 'a grouping key'}; or give one grouping key to sort by it")
        placed += [g for g in hits if all(g is not p for p in placed)]
    return placed + [g for g in groups if all(g is not p for p in placed)]
