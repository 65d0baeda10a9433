"""hpcfl's cache folder: compiled kernels (:mod:`hpcfl.native.cc`) and generated datasets
(:mod:`hpcfl.data.cache`) are kept there between runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root(setting: str) -> Path | None:
    """The cache folder for ``data.cache`` (None when it is "off"); "auto" is ``$HPCFL_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/hpcfl``, else ``~/.cache/hpcfl``."""
    if setting == "off":
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    if os.environ.get("HPCFL_CACHE_DIR"):
        return Path(os.environ["HPCFL_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hpcfl"
