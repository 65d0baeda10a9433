"""``<root>/.hpcfl_download``: where ``hpcfl data get`` keeps a file until it is verified and placed.

``--root`` may be shared (a project's data folder), and whoever else can write a folder can
plant a file under a name hpcfl is about to use: a symbolic link (the download then truncated
and rewrote the link's target, any file the user can write), a FIFO (opening it to write waited
for a reader for good), or make the folder their own. So:

* the folder is made 0700 and used only when nobody else can write it, by the check hpcfl's
  caches make (:func:`hpcfl.native.cachedir.untrusted_because`: owned by this user or root, not
  writable by group or others); otherwise it is refused with a message naming it and the fix;
* it is opened once without following a link (``O_DIRECTORY | O_NOFOLLOW``), and every file in
  it is reached through that descriptor (``dir_fd``): a folder put at its name later is not used;
* a file in it is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a link is refused, a FIFO never
  waits), checked with ``fstat`` (a regular file with one name, owned by this user or root) and
  only then read or written; a new ``.part`` is created exclusively (``O_EXCL``), 0600.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import DataError
from ..inputs import kind
from ..native.cachedir import untrusted_because

SCRATCH = ".hpcfl_download"
_NOLINK = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
_MODES = {"read": os.O_RDONLY, "append": os.O_WRONLY | os.O_APPEND, "new": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def _folder_problem(path: str, st: os.stat_result) -> str | None:
    """The refusal for a scratch folder that someone else could write (owner or mode), or None."""
    why = untrusted_because(st)
    if why is None:
        return None
    if why.startswith("owned"):
        return (f"{path} is {why}, so what is in it could have been planted; hpcfl data get keeps its "
                f"downloads in a folder only you can write. Ask its owner to remove it, or choose a --root "
                f"of your own")
    return (f"{path} is {why}, so someone else could plant a file there that the download would write "
            f"through; hpcfl data get makes it 0700. Fix: chmod go-w {path}, then run the same command again")


class Scratch:
    """``<root>/.hpcfl_download``, made (0700) where missing, checked and held open until :meth:`close`.

    Raises
    ------
    DataError
        When ``root`` cannot be written, or the folder is a link, not a folder, or writable by
        someone else (the message names it and the fix).
    """

    def __init__(self, root: str):
        self.folder = os.path.join(root, SCRATCH)
        try:
            os.makedirs(root, exist_ok=True)
            try:
                os.mkdir(self.folder, 0o700)   # the umask can only take bits away: 0700 whatever it is
            except FileExistsError:
                pass   # checked below, as any folder found there
        except OSError as e:
            raise DataError(f"--root {root} cannot be written ({e.strerror or e}); choose a writable folder") from None
        self.fd = self._open_folder()
        st = os.fstat(self.fd)
        self.ident = (st.st_dev, st.st_ino)
        problem = _folder_problem(self.folder, st)
        if problem:
            self.close()
            raise DataError(problem)

    def _open_folder(self) -> int:
        try:
            return os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | _NOLINK)
        except OSError as e:
            if os.path.islink(self.folder):
                raise DataError(f"{self.folder} is a symbolic link (to {os.readlink(self.folder)}); hpcfl data get "
                                "keeps its downloads in a folder of its own and never follows a link there. Remove "
                                "the link and run the same command again") from None
            raise DataError(f"{self.folder} cannot be used as hpcfl data get's download folder "
                            f"({e.strerror or e}); remove it and run the same command again") from None

    def path(self, name: str) -> str:
        """``name``'s path, for messages."""
        return os.path.join(self.folder, name)

    # ------------------------------------------------------------------ files in the folder

    def open(self, name: str, how: str = "read") -> int | None:
        """A descriptor of ``name`` in the folder, checked (see the module's notes); None where
        ``how`` is ``"read"`` or ``"append"`` and there is no such file. ``"new"`` replaces the
        name with an empty file of this user's (a link there is removed, never followed).

        Raises
        ------
        DataError
            For a link, a FIFO, a device, a folder, a hard link or another user's file: it
            names the path and asks for it to be removed.
        """
        if how == "new":
            self.remove(name)
        try:
            fd = os.open(name, _MODES[how] | _NOLINK, 0o600, dir_fd=self.fd)
        except FileNotFoundError:
            if how == "new":
                raise
            return None
        except OSError as e:
            # ELOOP: a link; ENXIO: a FIFO opened to write with no reader; EISDIR: a folder
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.ENODEV):
                raise DataError(self._planted(name)) from None
            raise DataError(f"cannot open {self.path(name)} ({e.strerror or e}); remove it and run the same "
                            "command again") from None
        problem = self._not_ours(name, os.fstat(fd))
        if problem:
            os.close(fd)
            raise DataError(problem)
        os.set_blocking(fd, True)
        return fd

    def file(self, name: str, how: str = "read"):
        """:meth:`open` as a binary file object (None where there is no such file)."""
        fd = self.open(name, how)
        mode = {"read": "rb", "append": "ab", "new": "wb"}[how]
        return None if fd is None else os.fdopen(fd, mode)

    def size(self, name: str) -> int | None:
        """The size of ``name`` (checked as :meth:`open` does), None where there is none."""
        fd = self.open(name)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _planted(self, name: str) -> str:
        """The refusal of ``name`` when it is not a regular file (found without following a link)."""
        try:
            st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:   # removed meanwhile: still refused, it was no regular file
            return f"{self.path(name)} is not a regular file. Remove it and run the same command again"
        if stat.S_ISLNK(st.st_mode):
            what = (f"a symbolic link (to {os.readlink(name, dir_fd=self.fd)}); hpcfl data get never writes "
                    "through a link")
        else:
            what = (f"not a regular file but {kind(st.st_mode)}; hpcfl data get writes its downloads to regular "
                    "files only")
        return f"{self.path(name)} is {what}. Remove it and run the same command again"

    def _not_ours(self, name: str, st: os.stat_result) -> str | None:
        if not stat.S_ISREG(st.st_mode):
            return self._planted(name)
        if st.st_nlink > 1:
            why = f"a file with {st.st_nlink} names (a hard link): writing it would change the other names too"
        elif st.st_uid not in (os.geteuid(), 0):
            why = f"owned by another user (uid {st.st_uid}; you are uid {os.geteuid()}): it could have been planted"
        else:
            return None
        return f"{self.path(name)} is {why}. Remove it and run the same command again"

    def remove(self, name: str) -> None:
        """Remove ``name`` if it is there (a link is removed, not its target)."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            pass

    def rename(self, name: str, new: str) -> None:
        """Rename ``name`` to ``new``, both in the folder (replacing ``new``)."""
        os.replace(name, new, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def move_out(self, name: str, dest: str) -> None:
        """Move ``name`` to the path ``dest`` (one rename: ``dest`` is never half written)."""
        os.replace(name, dest, src_dir_fd=self.fd)

    # ------------------------------------------------------------------ the end

    def close(self, tidy: bool = False) -> None:
        """Let the folder go; ``tidy``: remove it when it is empty (nothing left to resume or to
        look at), provided the folder at its path is still the one held."""
        if self.fd < 0:
            return
        try:
            if tidy and not os.listdir(self.fd):
                st = os.lstat(self.folder)
                if (st.st_dev, st.st_ino) == self.ident:
                    os.rmdir(self.folder)
        except OSError:
            pass   # gone, replaced or filled meanwhile: leave it
        finally:
            os.close(self.fd)
            self.fd = -1
