"""A directory a live run holds open, so that swapping it for another mid-run is noticed, not followed.

A run's checkpoint folder is checked to be the run's own (its ``.hpcfl-run`` marker) once, at the
start. Whoever can write ``--out`` could later move the folder away and put a link (or another
folder) at its name: every save and rotation that went through the path would then write into,
and delete from, another run's checkpoints. So the run opens the folder once, without following a
link (``O_DIRECTORY | O_NOFOLLOW``), and from then on:

* every file operation goes through the descriptor: ``/proc/self/fd/<fd>/<name>`` resolves to the
  held folder wherever it has been moved (h5py cannot open a file relative to a directory
  descriptor, but it can open that path; rename and unlink use it too);
* before each save, :meth:`HeldDir.verify` compares the folder now at the path with the held one
  (device and inode) and raises :class:`DirectoryMoved` when they differ, naming where the held
  folder is now (its checkpoints are there) and the fix; the run stops with exit 2.

Without ``/proc`` (not Linux) the paths are used as they are, and the check before each save is
the only protection.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ..errors import HpcflError
from . import safefs

_PROC = Path("/proc/self/fd")


class DirectoryMoved(HpcflError):
    """The folder at a held directory's path is no longer the held directory."""


def link_error(path: Path, what: str = "the checkpoint folder") -> HpcflError:
    """The input error for a folder to hold that is a symbolic link (``hpcfl run`` raises it before
    it writes a probe file through the link, :class:`HeldDir` when it meets one)."""
    return HpcflError(f"{what} {path} is a symbolic link (to {os.readlink(path)}); a run holds its checkpoint "
                      f"folder open and never follows a link there. Set checkpoint.dir to the folder itself")


class HeldDir:
    """``path``, opened once and held until :meth:`close` (or the end of the process).

    Raises HpcflError when ``path`` is a symbolic link or not a directory.
    """

    def __init__(self, path: Path, what: str = "the checkpoint folder"):
        self.path, self.what = Path(path), what
        flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
        try:
            self.fd = os.open(self.path, flags)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR) and self.path.is_symlink():
                raise link_error(self.path, what) from None
            raise HpcflError(f"cannot open {what} {self.path} ({exc.strerror or exc})") from None
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        self.proc = (_PROC / str(self.fd)).is_dir()

    def at(self, name: str) -> Path:
        """The path of ``name`` inside the held folder (through the descriptor where there is /proc)."""
        return _PROC / str(self.fd) / name if self.proc else self.path / name

    def names(self) -> list[str]:
        """The names in the held folder."""
        return os.listdir(self.fd)

    def fsync(self) -> None:
        """Put a rename in the held folder on disk (some network filesystems refuse: nothing more to do)."""
        safefs.fsync_dir(self.fd)

    def where(self) -> str:
        """Where the held folder is now (it may have been moved), as the kernel names it."""
        try:
            return os.readlink(_PROC / str(self.fd)) if self.proc else str(self.path)
        except OSError:
            return "an unknown place"

    def verify(self) -> None:
        """Raise DirectoryMoved unless the folder at :attr:`path` is still the held one."""
        try:
            st = os.stat(self.path)
            now = (st.st_dev, st.st_ino)
        except OSError:
            now = None
        if now == self.ident:
            return
        found = "nothing" if now is None else (f"a symbolic link to {os.readlink(self.path)}"
                                              if self.path.is_symlink() else "another folder")
        raise DirectoryMoved(
            f"{self.what} {self.path} was replaced while this run was live (there is {found} there now); the run "
            f"stopped without writing to or deleting from it. Its checkpoints are in the folder it held, now at "
            f"{self.where()}: put that folder back at {self.path} (after moving away what is there) and run the "
            f"same command again to resume")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
