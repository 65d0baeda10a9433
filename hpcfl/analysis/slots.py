"""What the algorithm presets set differently between ``hpcfl report``'s groups.

An algorithm name fills the four policy slots (``local``, ``steps``, ``weights``, ``server``;
docs/architecture.md) from its preset: FedLGA weights clients uniformly, FedAvg by size. The
grouping leaves these slots out of the labels (they follow from ``algorithm.name``), so a table
comparing FedAvg and FedLGA would not say that the two also differ in how clients are weighted.
This module finds every slot whose value differs between groups although no label names it, and

- adds to a group's label the slot values that set it apart and that are not its algorithm's own
  policy: ``FedLGA (uniform weights)``; FedNova's ``FedNova aggregation`` is what FedNova is, and
  is left out;
- writes one note per such slot: ``weights slot (set by each algorithm's preset): FedLGA weights
  clients uniformly; the others by size``.

"Sets it apart" is measured against the baseline group's value when there is a baseline, else
against the value most groups have (ties: FedAvg's, size weights and averaging, else the first
group's).
"""

from __future__ import annotations

from collections import Counter

from ..algorithms import registry
from ..config import flatten

SLOT_KEYS = tuple(f"algorithm.{slot}" for slot in registry.SLOTS)
# how a note says a weights policy: "FedLGA weights clients uniformly; the others by size"
WEIGHTS_WORDS = {"size": "by size", "uniform": "uniformly", "disco": "by size and label discrepancy"}


def _value(g, key: str):
    values = {repr(flatten(c).get(key)) for c in g.configs}
    return flatten(g.configs[0]).get(key) if len(values) == 1 else None


def _words(slot: str, value) -> str:
    return registry.SLOT_LABELS.get(slot, {}).get(value, f"{slot} {value}")


def _own(g, slot: str, value) -> bool:
    """Whether ``value`` is the policy the group's algorithm is named for (its words begin with
    the algorithm's name: FedNova's "FedNova aggregation", FedDisco's "FedDisco weights")."""
    name = _value(g, "algorithm.name")
    label = registry.LABELS.get(name, name) if isinstance(name, str) else None
    return bool(label) and label != "custom" and _words(slot, value).startswith(label)


def differing_slots(groups: list, label_keys: list[str]) -> list[str]:
    """The slot keys whose value differs between groups and that no label names."""
    out = []
    for key in SLOT_KEYS:
        if key in label_keys:
            continue
        values = [_value(g, key) for g in groups]
        if len({repr(v) for v in values}) > 1:
            out.append(key)
    return out


def _reference(groups: list, key: str, base) -> object:
    if base is not None:
        return _value(base, key)
    counts = Counter(repr(_value(g, key)) for g in groups)
    top = [_value(g, key) for g in groups if counts[repr(_value(g, key))] == max(counts.values())]
    plain = registry.PRESETS["fedavg"].get(key.split(".", 1)[1], "epochs")   # FedAvg's: the usual reference
    return plain if plain in top else top[0]


def _who(g) -> str:
    """The group's algorithm by name (``FedLGA``: one note for its every lr), else its label."""
    name = _value(g, "algorithm.name")
    return registry.LABELS.get(name, g.short) if isinstance(name, str) and name != "custom" else g.short


def _say(slot: str, value) -> str:
    if slot == "weights" and value in WEIGHTS_WORDS:
        return f"weights clients {WEIGHTS_WORDS[value]}"
    return f"uses {_words(slot, value)}"


def name_slots(groups: list, label_keys: list[str], base=None) -> list[str]:
    """Add the differing slot values to the groups' labels; return the notes that say them.

    ``g.short`` keeps the label without them (accepted wherever a label is).
    """
    notes = []
    extra: dict[int, list[str]] = {id(g): [] for g in groups}
    for key in differing_slots(groups, label_keys):
        slot = key.split(".", 1)[1]
        ref = _reference(groups, key, base)
        apart = [g for g in groups if repr(_value(g, key)) != repr(ref)]
        named = [g for g in apart if not _own(g, slot, _value(g, key))]
        if not named:   # only algorithms' own policies differ (FedNova's aggregation): the names say it
            continue
        for g in named:
            extra[id(g)].append(_words(slot, _value(g, key)))
        said = "; ".join(dict.fromkeys(f"{_who(g)} {_say(slot, _value(g, key))}" for g in apart))
        rest = [g for g in groups if all(g is not a for a in apart)]
        others = _who(rest[0]) if len({_who(g) for g in rest}) == 1 else "the others"
        tail = (f"{others} {WEIGHTS_WORDS[ref]}" if slot == "weights" and ref in WEIGHTS_WORDS
                else f"{others} {'use' if others == 'the others' else 'uses'} {_words(slot, ref)}")
        notes.append(f"{slot} slot (set by each algorithm's preset, not in the grouping keys): {said}; {tail}")
    for g in groups:
        if extra[id(g)]:
            g.label = f"{g.short} ({', '.join(extra[id(g)])})"
    return notes
