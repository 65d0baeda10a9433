"""Strict construction of frozen option dataclasses from TOML tables.

Every component (dataset, partition, model, policy) declares its options as a frozen
dataclass. Constraints live in field metadata so that validation is declarative:

>>> @dataclass(frozen=True)
... class Opts:
...     alpha: float = field(default=0.5, metadata={"gt": 0})
...     kind: str = field(default="a", metadata={"choices": ("a", "b")})

:func:`build` checks unknown keys, types and ranges and reports every problem at once,
each naming its full key (``data.dirichlet.alpha``) and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing

from ..errors import ConfigError, nearest

_UNIONS = (typing.Union, types.UnionType)  # Optional[X] and X | None

_BOUNDS = {
    "gt": (lambda v, b: v > b, "greater than"),
    "ge": (lambda v, b: v >= b, "at least"),
    "lt": (lambda v, b: v < b, "less than"),
    "le": (lambda v, b: v <= b, "at most"),
}


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        return f"a list of {_type_name(inner)}"
    if origin in _UNIONS:
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value, tp):
    """Return ``value`` converted to ``tp`` or raise TypeError. Never silently rounds."""
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a)
            except TypeError:
                pass
        raise TypeError
    if origin is tuple:
        (inner, *_rest) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise TypeError
        return tuple(_coerce(v, inner) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise TypeError
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise TypeError
        return value
    raise TypeError(f"unsupported option type {tp}")


INT64_MAX = 2**63 - 1
FLOAT_LIMIT = 1e30   # beyond this, products with other options overflow float32 arithmetic (torch's alpha)


def _representable(name: str, v, meta: dict) -> str | None:
    """Why ``v`` cannot be used at all (NaN, an infinity where none is meant, too large), or None.

    Integers must fit 64 bits (results files and torch store them so); floats must be finite,
    ``inf`` only where the field's metadata says ``"inf": True`` (e.g. a bandwidth), and at most
    :data:`FLOAT_LIMIT` in magnitude.
    """
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and not -INT64_MAX - 1 <= v <= INT64_MAX:
        return f"{name} = {v} does not fit a 64-bit integer (at most {INT64_MAX})"
    if isinstance(v, float):
        if math.isnan(v):
            return f"{name} = nan is not a number; give a value"
        if math.isinf(v):
            return None if meta.get("inf") else f"{name} = {v} must be finite"
        if abs(v) > FLOAT_LIMIT:
            return f"{name} = {v!r} is too large: at most {FLOAT_LIMIT:g} in magnitude"
    return None


def check_value(name: str, value, meta: dict) -> list[str]:
    """Range and choice problems of one value, per the field's metadata."""
    problems = []
    if value is None:
        return problems
    values = value if isinstance(value, tuple) else (value,)
    for v in values:
        bad = _representable(name, v, meta)
        if bad:
            problems.append(bad)
            break
        if "choices" in meta and v not in meta["choices"]:
            choices = ", ".join(repr(c) for c in meta["choices"])
            guess = nearest(v, meta["choices"]) if isinstance(v, str) else None
            problems.append(f"{name} = {v!r} is not valid; " + (f"did you mean {guess!r}? (or one of {choices})"
                                                                 if guess else f"choose one of {choices}"))
            break
        for key, (ok, words) in _BOUNDS.items():
            if key in meta and isinstance(v, (int, float)) and not ok(v, meta[key]):
                problems.append(f"{name} = {v!r} must be {words} {meta[key]}")
    return problems


def build(cls, table: dict | None, where: str, problems: list[str] | None = None):
    """Build the frozen dataclass ``cls`` from ``table``.

    Parameters
    ----------
    cls : dataclass type
        Frozen dataclass; each field may carry ``gt/ge/lt/le/choices`` metadata. A
        ``validate(self) -> list[str]`` method, if present, adds cross-field checks
        (messages without the prefix; it is added here).
    table : dict or None
        Parsed TOML table (None means all defaults).
    where : str
        Dotted prefix for messages, e.g. ``"data.dirichlet"``.
    problems : list of str, optional
        When given, problems are appended and the defaults-filled object (or None) is
        returned instead of raising, so a caller can report everything at once.

    Returns
    -------
    cls instance, or None when problems were found and ``problems`` was given.
    """
    own: list[str] = []
    obj, _failed = build_partial(cls, table, where, own)
    if problems is not None:
        problems += own
        return None if own else obj
    if own:
        raise ConfigError(own)
    return obj


def build_partial(cls, table: dict | None, where: str, problems: list[str]) -> tuple[object, set[str]]:
    """Build ``cls`` from the valid keys of ``table``, appending every problem to ``problems``.

    Returns ``(obj, failed)``: ``obj`` holds the valid keys and the defaults of the rest (so
    that checks across sections can still run), ``failed`` names the fields whose value
    was refused (a wrong type, range or choice; unknown keys are problems but fail no
    field). ``validate()`` runs on ``obj`` too; its messages that name a failed field are
    dropped, since they would only restate that field's own problem against a default.
    ``obj`` is None when a field without a default (a required key) has no valid value.
    """
    table = dict(table or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            guess = nearest(key, fields)
            valid = ", ".join(sorted(fields)) or "(none)"
            problems.append(f"unknown key {where}.{key}; did you mean {where}.{guess}?" if guess else
                            f"unknown key {where}.{key}; valid keys here: {valid}")
    kwargs, failed = {}, set()
    for name, f in fields.items():
        if name not in table:
            continue
        try:
            value = _coerce(table[name], hints[name])
        except TypeError:
            problems.append(f"{where}.{name} = {table[name]!r} has the wrong type; expected {_type_name(hints[name])}")
            failed.add(name)
            continue
        found = check_value(f"{where}.{name}", value, f.metadata)
        if found:
            problems += found
            failed.add(name)
        else:
            kwargs[name] = value
    # A field without a default (a plug-in's parameter without one) is a required key. Without it
    # there is no object to build: the problems say which keys to add.
    required = [n for n, f in fields.items() if f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING]
    missing = [n for n in required if n not in table]
    for name in missing:
        problems.append(f"{where}.{name} is required and missing: it has no default; add {name} = ... "
                        f"({_type_name(hints[name])}) under [{where}]")
    if any(n not in kwargs for n in required):
        return None, failed | set(missing)
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        mentions = re.compile(r"\b(" + "|".join(map(re.escape, sorted(failed))) + r")\b") if failed else None
        problems += [f"{where}: {msg}" if not msg.startswith(where) else msg for msg in obj.validate()
                     if mentions is None or not mentions.search(msg)]
    return obj, failed
