"""Finding and opening a dataset's files under ``data.root``, for every dataset read from disk.

``_open`` opens a regular file only (a FIFO would block start-up: :mod:`hpcfl.inputs`) and makes a
missing or unreadable file a :class:`DataError` naming it and what was expected; ``_need_root`` and
``_find_dir`` check data.root and find the extracted folder in it; :func:`root_check` makes a
dataset's ``DatasetSpec.files`` check from them (stat calls only).
"""

from __future__ import annotations

import os

from ..errors import ConfigError, DataError, HpcflError
from ..inputs import open_regular
from .sources import get_hint


def _open(path: str, expected: str):
    """``path`` for reading, if it is a regular file (a FIFO would block start-up: :mod:`hpcfl.inputs`)."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise DataError(f"missing file {path}; expected {expected}") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}; expected {expected}") from None


def _under(root: str, subdirs: tuple[str, ...]) -> list[str]:
    """The folders ``subdirs`` of ``root``, in order ("" is ``root`` itself)."""
    return [os.path.join(root, s) if s else root for s in subdirs]


def _find_dir(root: str, marker: str, candidates: tuple[str, ...], what: str) -> str:
    tried = _under(root, candidates)
    for d in tried:
        if os.path.exists(os.path.join(d, marker)):
            return d
    raise DataError(f"{what}: no {marker} found in any of {', '.join(tried)}; "
                    f"set data.root to the directory that holds the extracted files{get_hint(what)}")


def _need_root(root: str | None, name: str, what: str) -> str:
    if root is None:
        raise ConfigError(f"data.root is not set; dataset {name!r} reads {what} from it{get_hint(name)}")
    if not os.path.isdir(root):
        raise DataError(f"data.root = {root!r} is not a directory (dataset {name!r} reads {what} from it)"
                        f"{get_hint(name)}")
    return root


def root_check(name: str, what: str, find=None):
    """The ``DatasetSpec.files`` check of a dataset that reads ``what`` from ``data.root``;
    ``find(opts, root)``, when given, looks for its first file there (stat calls only)."""
    def check(opts, root: str | None) -> list[str]:
        try:
            _need_root(root, name, what)
            if find is not None:
                find(opts, root)
        except HpcflError as exc:
            return [str(exc).removeprefix("config error: ")]
        return []
    return check
