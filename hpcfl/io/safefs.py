"""Files the engine creates in a run directory: never through a planted link, never half left behind.

A run directory may be shared or group-writable, so anyone who can write there could plant
a symbolic link named like a file hpcfl is about to write (``.hpcfl-lock``, a temporary
file) and make the run overwrite a file its owner can write. So every file hpcfl creates
there is created exclusively (``O_CREAT | O_EXCL``, which refuses an existing name and
never follows a link), after removing a stale name (removing a link removes the link, not
its target), and the one file hpcfl opens again, the lock, is opened with ``O_NOFOLLOW``
and must be a regular file with one link.

A write that fails for want of space removes what it had written (:func:`discard`) and
says so: :func:`full_message` names the path, the bytes needed and free, and the fix.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from ..errors import HpcflError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
FULL_WORDS = ("no space left", "disk quota", "file too large", "file size limit")
_FLAGS = os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


class DiskFull(HpcflError):
    """A write failed because the filesystem (or a quota, or a file size limit) is full."""


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk, a quota or a file size limit is full (HDF5 errors carry only text)."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return True
    text = str(exc).lower()
    return any(w in text for w in FULL_WORDS)


def free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def full_message(what: str, path: Path, need: int | None, fix: str, reason: str = "") -> str:
    """``cannot write WHAT to PATH (REASON): the filesystem (or your quota) is full: it needs about N
    bytes; M bytes are free there. FIX``"""
    free = free_bytes(Path(path).parent)
    need_text = f"it needs about {need:,} bytes" if need else "more space is needed"
    free_text = f"; {free:,} bytes are free there" if free is not None else ""
    why = f" ({reason})" if reason else ""
    return (f"cannot write {what} to {path}{why}: the filesystem (or your quota, or the file size limit) is full: "
            f"{need_text}{free_text}. {fix}")


def need_space(path: Path, need: int, what: str, fix: str) -> None:
    """Raise DiskFull before a write of about ``need`` bytes into ``path``'s folder that cannot fit."""
    free = free_bytes(Path(path).parent)
    if free is not None and free < need:
        raise DiskFull(full_message(what, path, need, fix, "checked before writing"))


def remove_stale(path: Path) -> None:
    """Remove ``path`` if it is there (a link is removed, never followed); a folder is an error."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise HpcflError(f"{path} is a folder where hpcfl writes a temporary file; remove it")
    os.unlink(path)


def create(path: Path, mode: int = 0o644, dir_fd: int | None = None) -> int:
    """A new file at ``path``, created exclusively (fails on any existing name, link included); an fd.

    ``dir_fd``: ``path`` is a name in that open folder (so no link on the way to it is followed).
    """
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _FLAGS, mode, dir_fd=dir_fd)


def write_new(path: Path, data: bytes, dir_fd: int | None = None, tmp: str | None = None) -> None:
    """Write ``data`` to ``path`` through a fresh temporary name, fsynced, renamed into place.

    Parameters
    ----------
    path : the file; a name in ``dir_fd`` when that is given
    data : its bytes
    dir_fd : an open folder that ``path`` and the temporary name are relative to
    tmp : the temporary name (default ``.NAME.PID.RANDOM.tmp``), for a caller whose readers
        pick files by a word in their names (TensorBoard reads any name holding ``tfevents``)
    """
    path = Path(path)
    tmp_path = path.with_name(tmp or f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = create(tmp_path, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        # rename replaces whatever is at path, a link included, and never writes through it
        os.replace(tmp_path, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        discard(tmp_path, dir_fd)
        raise


def write_once(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` unless something is there already (a file, a link: never
    followed, never replaced); the file appears whole. True when this call wrote it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = create(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)   # atomic, and fails on any existing name: a planted link stays a link
        except FileExistsError:
            return False
        return True
    finally:
        discard(tmp)


def copy(src: Path, dst: Path) -> None:
    """Copy ``src`` to a new file ``dst`` (a stale ``dst`` is removed first), fsynced; on failure
    nothing is left at ``dst``."""
    remove_stale(dst)
    fd = create(dst)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
            fout.flush()
            os.fsync(fout.fileno())
    except BaseException:
        discard(dst)
        raise


def fsync(path: Path, directory: bool = False) -> None:
    """Put ``path``'s data on disk: a file hpcfl wrote (not followed if it is a link), or a directory
    after a rename in it (so that the new name survives a crash)."""
    flags = os.O_RDONLY | (os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) if directory else _FLAGS)
    fd = os.open(path, flags)
    try:
        if directory:
            fsync_dir(fd)
        else:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(fd: int) -> None:
    """Put a rename in the open directory ``fd`` on disk."""
    try:
        os.fsync(fd)
    except OSError as e:
        # Some network filesystems refuse fsync on a directory; the rename is then as
        # durable as that filesystem makes it, and nothing more can be done.
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def discard(path: Path, dir_fd: int | None = None) -> None:
    """Remove a partial file, quietly (it may not exist)."""
    try:
        os.unlink(path, dir_fd=dir_fd)
    except OSError:
        pass


def read_small(path: Path, limit: int = 1 << 16, dir_fd: int | None = None) -> str | None:
    """The text of a small regular file (a marker, a lock), or None if there is none.

    Never blocks on a FIFO or device planted under that name, never reads more than ``limit``
    bytes; anything but a regular file raises HpcflError. ``dir_fd``: ``path`` is a name in that
    open folder.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HpcflError(f"{path} is a symbolic link; hpcfl does not follow links there. Remove it") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise HpcflError(f"{path} is not a regular file; remove it")
        return os.read(fd, limit).decode(errors="replace")
    finally:
        os.close(fd)
