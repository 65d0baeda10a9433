"""numba, where it can be had: the one switch every numba-compiled kernel of hpcfl goes through.

The compiled kernels (:mod:`hpcfl.parallel.gridsum`, :mod:`hpcfl.client.fused`,
:mod:`hpcfl.models.pool`) are optional: each has a torch or numpy form it falls back to.
``HPCFL_NO_NUMBA=1`` turns all of them off at once (to check the fallbacks). The pooling and group
kernels also ship as C, which is tried first (:mod:`hpcfl.native.cc`; ``HPCFL_NO_CC=1`` turns that
form off): where it is used, numba is never imported.

numba's cache. By default numba keeps compiled kernels in the package's own ``__pycache__``:
a read-only install (usual on a cluster) then leaves it nowhere to write, and a writable one
gains files at every run. So before numba is imported, ``NUMBA_CACHE_DIR`` is pointed at
``numba/`` in hpcfl's cache folder (:mod:`hpcfl.native.cachedir`: owned by the user and not
writable by others, created 0700; numba's cache holds machine code that is run). A folder that
cannot be created or is refused gives a warning and a private temporary folder for this process,
removed at exit. A ``NUMBA_CACHE_DIR`` set by the user is left as it is.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings

from . import cachedir

_ready: list = []   # the numba module (or None) once resolved; the cache folder is set before it


def cache_folder() -> str:
    """Point ``NUMBA_CACHE_DIR`` at hpcfl's cache (unless the user set it); the folder numba will use."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    try:
        folder = str(cachedir.private_folder(cachedir.cache_root("auto"), "numba"))
    except cachedir.UntrustedFolder as err:
        why = f"is not used: {err}"
        folder = None
    except OSError as err:
        why = f"cannot be written ({err}); set HPCFL_CACHE_DIR to a writable folder"
        folder = None
    if folder is None:
        folder = tempfile.mkdtemp(prefix="hpcfl-numba-")   # 0700, this process's alone
        atexit.register(shutil.rmtree, folder, True)
        warnings.warn(f"hpcfl: numba's kernel cache {why}; numba compiles its kernels anew in every process "
                      f"until then", stacklevel=3)
    os.environ["NUMBA_CACHE_DIR"] = folder
    return folder


def numba_or_none():
    """The ``numba`` module, or None where it is not installed or ``HPCFL_NO_NUMBA`` is set."""
    if os.environ.get("HPCFL_NO_NUMBA"):
        return None
    if not _ready:
        folder = cache_folder()   # read by numba when it is imported, and again before each compile
        try:
            import numba
        except ImportError:
            numba = None
        if numba is not None:
            numba.config.CACHE_DIR = folder   # where numba was imported earlier (by the user's code)
        _ready.append(numba)
    return _ready[0]
