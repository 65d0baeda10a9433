"""Opening the user's input files: regular files only, checked before a read can block.

A FIFO named as a data file hung start-up for good: ``open()`` of a FIFO waits for a writer,
and the stop handler only sets a flag, so SIGTERM was retried into the same wait.
A character device (``/dev/zero``, a terminal) or a folder is no data file either. So a file is
opened with ``O_NONBLOCK`` (which never waits, whatever the file is), checked with ``fstat`` to
be a regular file, and only then read (in blocking mode again). Every reader of users' data files
goes through :func:`open_regular` (results files have their own check, :mod:`hpcfl.io.h5check`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a file that is not regular is, in words, from its ``st_mode``: ``a FIFO (named pipe)``."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def open_regular(path, mode: str = "rb", encoding: str | None = None, newline: str | None = None):
    """``path`` opened for reading, like ``open(path, mode)``, provided it is a regular file.

    Raises
    ------
    FileNotFoundError, PermissionError, OSError
        As ``open`` does; a file that is not regular gives an ``OSError`` (``EINVAL``) whose
        ``strerror`` says what it is, e.g. ``not a regular file but a FIFO (named pipe)``.
    """
    if mode not in ("rb", "r"):
        raise ValueError(f"open_regular reads only (mode 'rb' or 'r'), not {mode!r}")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)   # a FIFO without a writer: no wait
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"not a regular file but {kind(st.st_mode)}", str(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        if mode == "rb":
            return os.fdopen(fd, mode)
        return os.fdopen(fd, mode, encoding=encoding, newline=newline)
    except BaseException:
        os.close(fd)
        raise
