"""Reading a job: a TOML file (:func:`read_job`), or any of the forms :func:`hpcfl.run` takes, a
file's path, TOML text or a dict of tables (:func:`read_any`), as plain tables ready for
:func:`hpcfl.config.apply_overrides` and :func:`hpcfl.config.from_dict`."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path

from ..errors import ConfigError
from ..inputs import open_regular


def read_job(path: str | Path) -> dict:
    """The tables of the TOML job file ``path``; a path that is missing, or not a regular file (a
    FIFO, ``/dev/zero``, a folder: read without blocking, never in full), is a ConfigError saying which."""
    path = Path(path)
    try:
        f = open_regular(path, "rb")
    except FileNotFoundError:
        raise ConfigError(f"job file {str(path)!r} not found; pass the path of a TOML job file (see jobs/)") from None
    except OSError as exc:
        raise ConfigError(f"job file {str(path)!r} cannot be read: {exc.strerror or exc}; pass the path of a TOML "
                          f"job file (see jobs/)") from None
    try:
        with f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"job file {str(path)!r} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:   # TOML is UTF-8
        raise ConfigError(f"job file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason}); save it "
                          f"as UTF-8") from None
    except RecursionError:
        raise ConfigError(f"job file {str(path)!r} nests arrays or tables too deeply to read; a job nests a few "
                          f"levels at most") from None


def _plain(value, key: str):
    """A copy of a job dict's ``value`` in TOML's types: tables, lists (from tuples too), str, bool, int,
    float (numpy scalars become Python's); anything else is a ConfigError naming its key."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{key}.{k}" if key else str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, key) for v in value]
    if hasattr(value, "item") and getattr(value, "shape", None) == ():   # a numpy scalar
        value = value.item()
    if isinstance(value, (str, bool, int, float)):
        return value
    raise ConfigError(f"{key or 'the job'} = {value!r} (of type {type(value).__name__}) cannot be a job's value; "
                      f"use a table (dict), list, str, bool, int or float")


def read_any(job) -> tuple[dict, str, Path]:
    """A job given as the path of a TOML job file, TOML text, or a dict of its tables.

    Returns (its tables, how messages name it, the folder that relative paths in it start from:
    the job file's own, or the current folder for text and dicts). A ``str`` holding a newline or
    an ``=`` is TOML text; any other ``str`` or path-like is a file's path (pass ``pathlib.Path``
    for a file name with ``=`` in it). A dict is copied: the caller's stays as it was.
    """
    if isinstance(job, Mapping):
        return _plain(job, ""), "the job dict", Path.cwd()
    if isinstance(job, str) and ("\n" in job or "=" in job):
        try:
            return tomllib.loads(job), "the job's TOML text", Path.cwd()
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"the job's TOML text is not valid TOML: {exc}") from None
        except RecursionError:
            raise ConfigError("the job's TOML text nests arrays or tables too deeply to read; a job nests a few "
                              "levels at most") from None
    if isinstance(job, (str, os.PathLike)):
        return read_job(job), f"job file {str(job)!r}", Path(job).resolve().parent
    raise ConfigError(f"a job is the path of a TOML job file, TOML text or a dict of tables; got {job!r:.60} (of "
                      f"type {type(job).__name__})")
