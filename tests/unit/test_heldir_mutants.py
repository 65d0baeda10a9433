"""Unit tests of :mod:`hpcfl.io.heldir` from its mutation pass.

What a held checkpoint folder refuses (a link, a file, an unopenable path), what it names when the
folder was swapped (another folder, a link, an unknown place) and how it behaves without ``/proc``
and after :meth:`HeldDir.close`.
"""

from __future__ import annotations

import os
import re

import pytest

from hpcfl.errors import HpcflError
from hpcfl.io import heldir
from hpcfl.io.heldir import DirectoryMoved, HeldDir, link_error


def test_link_error_names_the_checkpoint_folder_by_default(tmp_path):
    """link_error's default subject is 'the checkpoint folder' (hpcfl run calls it without one)."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "ck"
    link.symlink_to(tmp_path / "real")
    msg = str(link_error(link))
    assert msg == (f"the checkpoint folder {link} is a symbolic link (to {tmp_path / 'real'}); a run holds its "
                   f"checkpoint folder open and never follows a link there. Set checkpoint.dir to the folder itself")


def test_a_link_is_refused_with_the_default_subject(tmp_path):
    """HeldDir on a link raises link_error with its own default subject, the link's target and the fix."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "ck"
    link.symlink_to(tmp_path / "real")
    with pytest.raises(HpcflError, match=rf"^the checkpoint folder {re.escape(str(link))} is a symbolic link "
                                         rf"\(to {re.escape(str(tmp_path / 'real'))}\); a run holds"):
        HeldDir(link)


def test_a_link_is_refused_with_the_callers_subject(tmp_path):
    """The caller's ``what`` reaches the link message (the results folder is held too)."""
    (tmp_path / "real").mkdir()
    link = tmp_path / "res"
    link.symlink_to(tmp_path / "real")
    with pytest.raises(HpcflError, match=rf"^the results folder {re.escape(str(link))} is a symbolic link"):
        HeldDir(link, "the results folder")


def test_a_regular_file_is_refused_as_not_a_directory(tmp_path):
    """A file at the path is refused (O_DIRECTORY) with 'cannot open ... (Not a directory)', not a link message."""
    f = tmp_path / "ck"
    f.write_text("x")
    with pytest.raises(HpcflError, match=rf"^cannot open the checkpoint folder {re.escape(str(f))} "
                                         r"\(Not a directory\)$"):
        HeldDir(f)


def test_a_missing_folder_names_the_os_reason(tmp_path):
    """A missing path gives the strerror in parentheses, not the errno repr of the exception."""
    p = tmp_path / "gone"
    with pytest.raises(HpcflError, match=rf"^cannot open the results folder {re.escape(str(p))} "
                                         r"\(No such file or directory\)$"):
        HeldDir(p, "the results folder")


def test_the_held_descriptor_is_not_inherited(tmp_path):
    """The held folder's descriptor is close-on-exec (a launched child must not keep it)."""
    h = HeldDir(tmp_path)
    try:
        assert os.get_inheritable(h.fd) is False
        assert h.ident == (os.stat(tmp_path).st_dev, os.stat(tmp_path).st_ino)
    finally:
        h.close()


def test_without_proc_paths_and_where_use_the_path(tmp_path):
    """Without /proc, at() joins the name to the path and where() is the path itself."""
    h = HeldDir(tmp_path)
    try:
        assert h.proc is True
        assert h.at("a.h5") == heldir._PROC / str(h.fd) / "a.h5"
        assert h.where() == str(tmp_path)
        h.proc = False
        assert h.at("a.h5") == tmp_path / "a.h5"
        assert h.where() == str(tmp_path)
    finally:
        h.close()


def test_without_proc_where_is_the_path_even_after_a_move(tmp_path):
    """Without /proc, where() is the path the run was given, not asked of the kernel (it cannot be)."""
    ck = tmp_path / "ck"
    ck.mkdir()
    h = HeldDir(ck)
    try:
        ck.rename(tmp_path / "moved")
        assert h.where() == str(tmp_path / "moved")
        h.proc = False
        assert h.where() == str(ck)
        assert h.at("a.h5") == ck / "a.h5"
    finally:
        h.close()


def test_where_says_an_unknown_place_when_the_kernel_cannot_name_it(tmp_path, monkeypatch):
    """If readlink on the descriptor fails, where() says 'an unknown place' (the message still goes out)."""
    h = HeldDir(tmp_path)
    try:
        def fail(_p):
            raise OSError(9, "Bad file descriptor")
        monkeypatch.setattr(heldir.os, "readlink", fail)
        assert h.where() == "an unknown place"
    finally:
        h.close()


def test_a_folder_swapped_for_another_folder_is_named_as_such(tmp_path):
    """verify() names 'another folder' at the path and where the held one went."""
    ck = tmp_path / "ck"
    ck.mkdir()
    h = HeldDir(ck)
    try:
        ck.rename(tmp_path / "moved")
        ck.mkdir()
        with pytest.raises(DirectoryMoved, match=rf"^the checkpoint folder {re.escape(str(ck))} was replaced while "
                                                 r"this run was live \(there is another folder there now\); the run "
                                                 r"stopped without writing to or deleting from it\. Its checkpoints "
                                                 rf"are in the folder it held, now at "
                                                 rf"{re.escape(str(tmp_path / 'moved'))}: put that folder back"):
            h.verify()
    finally:
        h.close()


def test_close_closes_once_and_marks_the_descriptor_gone(tmp_path):
    """close() closes the descriptor, sets fd to -1, and a second close is a no-op."""
    h = HeldDir(tmp_path)
    fd = h.fd
    h.close()
    assert h.fd == -1
    with pytest.raises(OSError):
        os.fstat(fd)
    h.close()
    assert h.fd == -1


def test_close_closes_descriptor_zero_too(tmp_path, monkeypatch):
    """fd 0 is a valid descriptor (stdin may be closed before the run): close() closes it too."""
    h = HeldDir(tmp_path)
    real = h.fd
    closed = []
    monkeypatch.setattr(heldir.os, "close", closed.append)
    h.fd = 0
    h.close()
    monkeypatch.undo()
    os.close(real)
    assert closed == [0]
    assert h.fd == -1
