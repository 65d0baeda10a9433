"""numba, where it can be had: the one switch every numba-compiled kernel of hpcfl goes through.

The compiled kernels (:mod:`hpcfl.parallel.gridsum`, :mod:`hpcfl.client.fused`,
:mod:`hpcfl.models.pool`) are optional: each has a torch or numpy form it falls back to.
``HPCFL_NO_NUMBA=1`` turns all of them off at once (to check the fallbacks, or where numba's
cache folder cannot be written). The pooling kernels also ship as C, which is tried first
(:mod:`hpcfl.native.cc`; ``HPCFL_NO_CC=1`` turns that form off).
"""

from __future__ import annotations

import os


def numba_or_none():
    """The ``numba`` module, or None where it is not installed or ``HPCFL_NO_NUMBA`` is set."""
    if os.environ.get("HPCFL_NO_NUMBA"):
        return None
    try:
        import numba
    except ImportError:
        return None
    return numba
