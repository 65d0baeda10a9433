"""Public reader of results files: ``hpcfl.results.load(path)``.

``print(load(run))`` shows :func:`summary`, a few lines about the run; the arrays are in
``.metrics`` and ``.clients`` (docs/results.md). The code lives in :mod:`hpcfl.io`.
"""

from __future__ import annotations

from .io.results import Results, load
from .io.summary import summary

__all__ = ["Results", "load", "summary"]
