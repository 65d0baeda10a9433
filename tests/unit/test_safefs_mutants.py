"""Unit tests of :mod:`hpcfl.io.safefs` from its mutation pass.

What a safe write refuses or keeps (an existing name, a planted link, a folder), the fsyncs it
does, what a failed write leaves (nothing), and the exact disk-full and refusal messages.
"""

from __future__ import annotations

import errno
import os
import re
import stat

import pytest

from hpcfl.errors import HpcflError
from hpcfl.io import safefs
from hpcfl.io.safefs import DiskFull


@pytest.fixture
def fsyncs(monkeypatch):
    """Record every os.fsync as the path its descriptor names (then really fsync)."""
    calls = []
    real = os.fsync

    def spy(fd):
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(safefs.os, "fsync", spy)
    return calls


@pytest.fixture
def created(monkeypatch):
    """Record the paths safefs.create is asked for."""
    names = []
    real = safefs.create

    def spy(path, *a, **k):
        names.append(str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(safefs, "create", spy)
    return names


# ---------------------------------------------------------------- messages


def test_full_message_with_need_free_and_reason(tmp_path, monkeypatch):
    """The whole message: path, reason in parentheses, need and free with thousands separators, fix."""
    seen = []
    monkeypatch.setattr(safefs, "free_bytes", lambda d: seen.append(d) or 1234)
    msg = safefs.full_message("a checkpoint", tmp_path / "c.h5", 5_000_000, "Free space.", "at round 3")
    assert msg == (f"cannot write a checkpoint to {tmp_path / 'c.h5'} (at round 3): the filesystem (or your quota, "
                   "or the file size limit) is full: it needs about 5,000,000 bytes; 1,234 bytes are free there. "
                   "Free space.")
    assert seen == [tmp_path]


def test_full_message_without_need_free_or_reason(tmp_path, monkeypatch):
    """No need, no known free space, no reason: 'more space is needed', no free part, no parentheses."""
    monkeypatch.setattr(safefs, "free_bytes", lambda d: None)
    msg = safefs.full_message("results", tmp_path / "r.h5", None, "Fix it.")
    assert msg == (f"cannot write results to {tmp_path / 'r.h5'}: the filesystem (or your quota, or the file size "
                   "limit) is full: more space is needed. Fix it.")


def test_need_space_raises_only_when_free_is_below_need(tmp_path, monkeypatch):
    """Free below need raises DiskFull with the 'checked before writing' message; equal or unknown passes."""
    seen = []
    free = {"n": 99}
    monkeypatch.setattr(safefs, "free_bytes", lambda d: seen.append(d) or free["n"])
    p = tmp_path / "sub" / "c.h5"
    with pytest.raises(DiskFull) as e:
        safefs.need_space(p, 100, "a checkpoint", "Free space.")
    assert str(e.value) == (f"cannot write a checkpoint to {p} (checked before writing): the filesystem (or your "
                            "quota, or the file size limit) is full: it needs about 100 bytes; 99 bytes are free "
                            "there. Free space.")
    assert seen[0] == tmp_path / "sub"
    free["n"] = 100
    assert safefs.need_space(p, 100, "a checkpoint", "Free space.") is None
    free["n"] = None
    assert safefs.need_space(p, 100, "a checkpoint", "Free space.") is None


def test_need_space_uses_the_real_free_space(tmp_path):
    """Without stubs: a need beyond any disk raises, a need of one byte passes."""
    with pytest.raises(DiskFull, match=r"^cannot write x to .* \(checked before writing\): .* it needs about "
                                       r"1,000,000,000,000,000,000 bytes; [0-9,]+ bytes are free there\. F$"):
        safefs.need_space(tmp_path / "f", 10**18, "x", "F")
    safefs.need_space(tmp_path / "f", 1, "x", "F")


def test_remove_stale_refuses_a_folder_by_name(tmp_path):
    """A folder where a temporary file goes is an error naming it, and it is kept."""
    d = tmp_path / ".hpcfl-lock"
    d.mkdir()
    with pytest.raises(HpcflError, match=rf"^{re.escape(str(d))} is a folder where hpcfl writes a temporary file; "
                                         r"remove it$"):
        safefs.remove_stale(d)
    assert d.is_dir()


# ---------------------------------------------------------------- create


def test_create_makes_mode_0644_exclusively_and_close_on_exec(tmp_path):
    """create() makes a 0644 file (umask 0), close-on-exec, and refuses an existing file or a link."""
    old = os.umask(0)
    try:
        fd = safefs.create(tmp_path / "a")
    finally:
        os.umask(old)
    try:
        assert os.get_inheritable(fd) is False
    finally:
        os.close(fd)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644
    with pytest.raises(FileExistsError):
        safefs.create(tmp_path / "a")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        safefs.create(tmp_path / "link")
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- write_new


def test_write_new_temp_name_and_one_fsync(tmp_path, fsyncs, created):
    """The temporary name is .NAME.PID.8HEX.tmp; it is fsynced once, before the rename; no temp is left."""
    p = tmp_path / "m.json"
    safefs.write_new(p, b"{}")
    assert p.read_bytes() == b"{}"
    assert len(created) == 1
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/\.m\.json\.{os.getpid()}\.[0-9a-f]{{8}}\.tmp", created[0])
    assert fsyncs == [created[0]]
    assert os.listdir(tmp_path) == ["m.json"]


def test_write_new_failed_rename_in_a_folder_fd_leaves_nothing(tmp_path, monkeypatch):
    """A rename that fails under dir_fd removes the temporary file from that folder (not from the cwd)."""
    d = tmp_path / "d"
    d.mkdir()
    monkeypatch.chdir(tmp_path)

    def fail(*a, **k):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(safefs.os, "replace", fail)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match=r"I/O error"):
            safefs.write_new("m.json", b"x", dir_fd=dfd, tmp=".m.json.tmp")
    finally:
        os.close(dfd)
    assert os.listdir(d) == []
    assert sorted(os.listdir(tmp_path)) == ["d"]


# ---------------------------------------------------------------- write_once


def test_write_once_writes_a_new_file_whole(tmp_path, fsyncs, created):
    """A free name gets the data (True), fsynced once under a .NAME.PID.8HEX.tmp name that is then gone."""
    p = tmp_path / "done"
    assert safefs.write_once(p, b"rank 3") is True
    assert p.read_bytes() == b"rank 3"
    assert re.fullmatch(rf"{re.escape(str(tmp_path))}/\.done\.{os.getpid()}\.[0-9a-f]{{8}}\.tmp", created[0])
    assert fsyncs == [created[0]]
    assert os.listdir(tmp_path) == ["done"]


def test_write_once_keeps_what_is_there(tmp_path):
    """An existing file is kept as it was (False), and no temporary file is left."""
    p = tmp_path / "done"
    p.write_bytes(b"first")
    assert safefs.write_once(p, b"second") is False
    assert p.read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["done"]


def test_write_once_never_writes_through_a_planted_link(tmp_path):
    """A link at the name stays a link and its target is untouched (False)."""
    target = tmp_path / "victim"
    target.write_bytes(b"keep")
    link = tmp_path / "done"
    link.symlink_to(target)
    assert safefs.write_once(link, b"evil") is False
    assert link.is_symlink()
    assert target.read_bytes() == b"keep"
    assert sorted(os.listdir(tmp_path)) == ["done", "victim"]


# ---------------------------------------------------------------- copy


def test_copy_reads_in_one_mebibyte_chunks(tmp_path, monkeypatch, fsyncs):
    """copy() passes a 1 MiB buffer to copyfileobj and fsyncs the copy once."""
    lengths = []
    real = safefs.shutil.copyfileobj
    monkeypatch.setattr(safefs.shutil, "copyfileobj", lambda a, b, n=0: lengths.append(n) or real(a, b, n))
    (tmp_path / "s").write_bytes(b"abc")
    safefs.copy(tmp_path / "s", tmp_path / "d")
    assert (tmp_path / "d").read_bytes() == b"abc"
    assert lengths == [1 << 20]
    assert fsyncs == [str(tmp_path / "d")]


def test_copy_that_fails_leaves_no_destination(tmp_path):
    """A source that cannot be read (a folder) leaves nothing at the destination."""
    (tmp_path / "src").mkdir()
    with pytest.raises(IsADirectoryError):
        safefs.copy(tmp_path / "src", tmp_path / "dst")
    assert not (tmp_path / "dst").exists()


# ---------------------------------------------------------------- fsync


def test_fsync_of_a_file_does_not_follow_a_link(tmp_path, fsyncs):
    """fsync(file) syncs the file once; a link at the name is refused (ELOOP), its target not synced."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    safefs.fsync(f)
    assert fsyncs == [str(f)]
    (tmp_path / "l").symlink_to(f)
    with pytest.raises(OSError) as e:
        safefs.fsync(tmp_path / "l")
    assert e.value.errno == errno.ELOOP
    assert fsyncs == [str(f)]


def test_fsync_of_a_directory_needs_a_directory(tmp_path, fsyncs):
    """fsync(dir, directory=True) syncs the folder; a file passed as a directory is refused (O_DIRECTORY)."""
    safefs.fsync(tmp_path, directory=True)
    assert fsyncs == [str(tmp_path)]
    f = tmp_path / "f"
    f.write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        safefs.fsync(f, directory=True)
    assert fsyncs == [str(tmp_path)]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP, errno.EBADF])
def test_fsync_dir_ignores_only_the_refusals_of_network_filesystems(monkeypatch, code):
    """EINVAL/ENOTSUP/EBADF from a directory fsync are ignored; an I/O error is raised."""
    monkeypatch.setattr(safefs.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(code, "no")))
    assert safefs.fsync_dir(3) is None
    monkeypatch.setattr(safefs.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))
    with pytest.raises(OSError) as e:
        safefs.fsync_dir(3)
    assert e.value.errno == errno.EIO


# ---------------------------------------------------------------- discard, read_small


def test_discard_removes_a_name_in_the_given_folder(tmp_path, monkeypatch):
    """discard(name, dir_fd) removes the name in that folder, not in the cwd; a missing one is quiet."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "t").write_bytes(b"x")
    (tmp_path / "t").write_bytes(b"cwd")
    monkeypatch.chdir(tmp_path)
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        safefs.discard("t", dfd)
        safefs.discard("t", dfd)
    finally:
        os.close(dfd)
    assert os.listdir(d) == []
    assert (tmp_path / "t").read_bytes() == b"cwd"


def test_read_small_opens_without_blocking_or_following(tmp_path, monkeypatch):
    """read_small opens read-only with O_NONBLOCK (a planted FIFO must not hang the run) and O_NOFOLLOW."""
    flags = []
    real = os.open

    def spy(path, f, *a, **k):
        flags.append(f)
        if not f & os.O_NONBLOCK:
            raise AssertionError("a blocking open of a FIFO would hang here")
        return real(path, f, *a, **k)
    monkeypatch.setattr(safefs.os, "open", spy)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(HpcflError, match=rf"^{re.escape(str(tmp_path))}/fifo is not a regular file; remove it$"):
        safefs.read_small(tmp_path / "fifo")
    assert flags == [os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW]


def test_read_small_refuses_a_link_by_name(tmp_path):
    """A link at a marker's name is refused naming the path and the fix."""
    (tmp_path / "real").write_text("pid")
    link = tmp_path / ".hpcfl-lock"
    link.symlink_to(tmp_path / "real")
    with pytest.raises(HpcflError, match=rf"^{re.escape(str(link))} is a symbolic link; hpcfl does not follow "
                                         r"links there\. Remove it$"):
        safefs.read_small(link)


def test_read_small_refuses_a_folder_and_passes_other_errors(tmp_path):
    """A folder is 'not a regular file'; an error other than a link (ENOTDIR) is raised as it is."""
    with pytest.raises(HpcflError, match=rf"^{re.escape(str(tmp_path))} is not a regular file; remove it$"):
        safefs.read_small(tmp_path)
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError):
        safefs.read_small(tmp_path / "f" / "x")


def test_read_small_replaces_undecodable_bytes_and_stops_at_the_limit(tmp_path):
    """Bytes that are not UTF-8 become U+FFFD; no more than ``limit`` bytes are read."""
    (tmp_path / "m").write_bytes(b"ok\xff-tail")
    assert safefs.read_small(tmp_path / "m") == "ok\ufffd-tail"
    assert safefs.read_small(tmp_path / "m", limit=3) == "ok\ufffd"
