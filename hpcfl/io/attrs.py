"""A results file's root attributes read as untrusted input: JSON decoded with a depth limit,
scalars only, the stored job checked to be one (:func:`root_attrs`, :func:`job_config`)."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from .h5check import BadFile

MAX_CONFIG_DEPTH = 16   # a job nests 3 deep; deeper JSON is not a job (and would exhaust the recursion limit)


def _depth(obj, limit: int) -> bool:
    """Whether ``obj`` nests at most ``limit`` containers deep (iteratively: no recursion)."""
    stack = [(obj, 0)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, (dict, list)):
            if d >= limit:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def _json(text: str, path: Path, what: str):
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise BadFile(f"{path}: the {what} attribute is not valid JSON ({str(exc)[:80]})") from None
    if not _depth(value, MAX_CONFIG_DEPTH):
        raise BadFile(f"{path}: the {what} attribute nests deeper than {MAX_CONFIG_DEPTH} levels; not an hpcfl file")
    return value


def root_attrs(f: h5py.File, path: Path) -> dict:
    """The root attributes with JSON strings decoded; scalars as Python values, arrays refused."""
    out = {}
    try:
        names = list(f.attrs)
    except (OSError, RuntimeError, KeyError, ValueError) as exc:
        raise BadFile(f"{path}: its attributes cannot be read ({exc})") from None
    for k in names:
        try:
            v = f.attrs[k]
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise BadFile(f"{path}: attribute {k!r} cannot be read ({str(exc)[:80]})") from None
        v = v.decode(errors="replace") if isinstance(v, bytes) else v
        if isinstance(v, np.ndarray):
            raise BadFile(f"{path}: attribute {k!r} is an array; an hpcfl results file has scalar attributes")
        if isinstance(v, str) and v[:1] in "[{":
            v = _json(v, path, k)
        out[k] = v.item() if isinstance(v, np.generic) else v
    return out


def job_config(attrs: dict, path: Path) -> dict:
    """The stored job (the ``config`` attribute); BadFile when there is none: not an hpcfl results file."""
    config = attrs.get("config")
    if config is None:
        raise BadFile(f"{path} has no config attribute, so it is not an hpcfl results file")
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise BadFile(f"{path}: its config attribute is not a job (a table of sections)")
    return config


def _int_attr(attrs: dict, name: str, path: Path, default=None):
    v = attrs.get(name, default)
    if v is None or (isinstance(v, (int, np.integer)) and not isinstance(v, bool)):
        return v
    raise BadFile(f"{path}: attribute {name!r} = {v!r} is not an integer")
