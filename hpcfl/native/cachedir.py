"""hpcfl's cache folder: compiled kernels (:mod:`hpcfl.native.cc`, numba's through
:mod:`hpcfl.native.jit`) and generated datasets (:mod:`hpcfl.data.cache`) are kept there between runs.

What is in the cache is trusted: a library there is mapped (its constructor runs), a dataset
there is trained on. A hash kept beside each file only catches damage, since whoever can write
the folder writes the hash too. So a folder is used only when nobody else can write it, as ssh
treats its keys (:func:`private_folder`): every level from the cache root down to the folder
that holds the files must be owned by this user (or by root) and not writable by group or others.
The levels hpcfl creates (the root, its missing parents, ``kernels/``, ``datasets/``,
``numba/``) are created 0700. A folder that fails the check is refused with a warning naming it
and the fix, once per process, and the caller compiles or generates privately instead.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UntrustedFolder(OSError):
    """A cache folder (or a file in it) that someone other than this user could have written."""


_told: set = set()   # folders already warned about in this process


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


def untrusted_because(st: os.stat_result) -> str | None:
    """Why a file or folder with status ``st`` could have been written by someone else, or None."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):   # root can write anything anyway
        return f"owned by another user (uid {st.st_uid}; you are uid {me})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by {'group' if st.st_mode & stat.S_IWGRP else 'others'} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check(path: Path) -> None:
    """Raise :class:`UntrustedFolder` naming ``path`` and the fix unless only this user (or root) can
    write it (links are followed: what counts is the folder or file that is used)."""
    why = untrusted_because(os.stat(path))
    if why:
        fix = (f"chmod go-w {path}" if "writable" in why else f"remove {path} or set HPCFL_CACHE_DIR to a folder "
               f"of your own")
        raise UntrustedFolder(f"{path} is {why}, so what is kept there could have been planted by someone else; "
                              f"fix: {fix} (or set HPCFL_CACHE_DIR to a folder only you can write, e.g. made with "
                              f"mkdir -m 700)")


def private_folder(root: Path, *parts: str) -> Path:
    """``root/parts...``, created 0700 where missing (the missing parents of ``root`` too), with every
    level from ``root`` down checked (:func:`check`).

    Raises
    ------
    UntrustedFolder
        For a level someone else could write (an :class:`OSError`: callers that fall back on an
        unwritable cache fall back here too, but should say why, see :func:`first_time`).
    OSError
        Where a level cannot be created (a read-only file system, a file in the way).
    """
    root = Path(root)
    missing = []
    up = root
    while not up.exists() and up != up.parent:   # the parents this process creates are private too
        missing.append(up)
        up = up.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:   # another rank made it meanwhile: checked below like any other
            pass
    path = root
    check(path)
    for part in parts:
        path = path / part
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
        check(path)
    return path


def first_time(err: UntrustedFolder) -> bool:
    """Whether this process has not yet warned about ``err``'s folder (warn once per folder)."""
    text = str(err)
    if text in _told:
        return False
    _told.add(text)
    return True
