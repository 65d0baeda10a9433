"""Job tables as dotted keys (:func:`flatten`) and written back as TOML text (``hpcfl sweep``'s
point jobs, ``hpcfl config``).

:func:`toml_document` checks that its text reads back as the same table, so a value TOML
cannot carry is refused rather than turned into another job.
"""

from __future__ import annotations

import json
import math
import re
import tomllib

from ..errors import HpcflError

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def flatten(d: dict, prefix: str = "") -> dict:
    """{"a": {"b": 1}} -> {"a.b": 1}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def toml_value(value) -> str:
    """``value`` as TOML (inline: arrays and inline tables); raises HpcflError for other types."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)   # JSON's escapes are valid in TOML basic strings
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise HpcflError(f"cannot write {value!r} ({type(value).__name__}) as a job value; use a string, number, "
                     f"boolean, array or table")


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key, ensure_ascii=False)


def toml_document(table: dict, header: str = "") -> str:
    """A job dict as a TOML file; checked to read back as the same dict.

    Parameters
    ----------
    table : nested dict of sections (plain keys first, then ``[section.sub]`` tables)
    header : comment lines put on top (each without the leading '#')
    """
    lines = [f"# {line}".rstrip() for line in header.splitlines()]

    def emit(node: dict, prefix: str) -> None:
        plain = [(k, v) for k, v in node.items() if not isinstance(v, dict)]
        subs = [(k, v) for k, v in node.items() if isinstance(v, dict)]
        if prefix and (plain or not subs):   # a table holding only sub-tables needs no header
            lines.extend(["", f"[{prefix}]"])
        lines.extend(f"{_key(k)} = {toml_value(v)}" for k, v in plain)
        for k, v in subs:
            emit(v, f"{prefix}.{_key(k)}" if prefix else _key(k))

    emit(table, "")
    text = "\n".join(lines) + "\n"
    try:
        same = _canonical(tomllib.loads(text)) == _canonical(table)
    except tomllib.TOMLDecodeError:
        same = False
    if not same:   # e.g. a string with a DEL character: refuse rather than run another job
        raise HpcflError("the job cannot be written back as TOML unchanged; remove unusual characters from its "
                         "strings")
    return text


def _canonical(obj) -> str:
    return json.dumps(obj, sort_keys=True)   # NaN compares equal to NaN here; 1 and 1.0 stay apart
