"""Mutation-testing pins for :mod:`hpcfl.data.fetch` (issue 48): unpacking and the small helpers.

What an archive writes where and what it refuses (with the exact message, which names the
archive), how :func:`~hpcfl.data.fetch.unpack` places loose members, and the texts of
``size_text`` / ``url_of`` / ``checksum_text`` / ``verify``. No network; < 1 s.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import zipfile

import pytest

from hpcfl.data import fetch
from hpcfl.data.sources import Remote
from hpcfl.errors import DataError


def _tar(members) -> bytes:
    """A tar of ``(name, type, data)``; type is a tarfile type constant."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            if kind == tarfile.REGTYPE:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                    info.linkname = data.decode()
                tf.addfile(info)
    return buf.getvalue()


def _zip(names) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in names:
            zf.writestr(name, b"z")
    return buf.getvalue()


def _remote(data: bytes, **kw) -> Remote:
    return Remote("f.bin", "https://example.invalid/f.bin", len(data), **kw)


# ------------------------------------------------------------------ _safe_name


@pytest.mark.parametrize("name", ["..", "../x", "..\\x", "/etc/x", "C:evil", "a/../../x"])
def test_unsafe_member_names_are_refused_with_the_archive_named(name):
    """Each way out of the folder (``..`` alone, a Windows ``..\\``, absolute, a drive) is refused, exact text."""
    with pytest.raises(DataError, match=r"^arch\.tar: member " + re.escape(repr(name)) +
                       r" would be written outside the dataset folder; refusing the archive \(it is not the "
                       r"source's\)$"):
        fetch._safe_name(name, "arch.tar")


@pytest.mark.parametrize("name, norm", [("a/b:c", "a/b:c"), ("a\\b", "a/b"), ("./a//b/", "a/b")])
def test_safe_member_names_are_normalised(name, norm):
    """A colon past the first part is no drive; backslashes are folder separators."""
    assert fetch._safe_name(name, "arch.zip") == norm


def test_write_members_names_the_archive_when_it_refuses(tmp_path):
    """_write_members checks names itself too, and its refusal names the archive's path."""
    with pytest.raises(DataError, match=r"^/x/a\.zip: member '\.\./e' would be written outside"):
        fetch._write_members([("../e", False, lambda: io.BytesIO(b""))], str(tmp_path), "/x/a.zip")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------ _unpack_tar / _unpack_zip


@pytest.mark.parametrize("kind, member, what", [
    (tarfile.SYMTYPE, b"/etc/passwd", "a link"),
    (tarfile.LNKTYPE, b"a", "a link"),
    (tarfile.FIFOTYPE, b"", "a device or pipe"),
    (tarfile.CHRTYPE, b"", "a device or pipe"),
])
def test_tar_links_and_devices_are_refused_by_kind(tmp_path, kind, member, what):
    """A symlink and a hard link are "a link", a FIFO or device "a device or pipe", exact message."""
    blob = _tar([("a", tarfile.REGTYPE, b"x"), ("bad", kind, member)])
    with pytest.raises(DataError, match=rf"^/d/t\.tar: member 'bad' is {what}; refusing the archive \(hpcfl "
                                        r"unpacks only plain files and folders\)$"):
        fetch._unpack_tar("/d/t.tar", str(tmp_path), io.BytesIO(blob))
    assert os.listdir(tmp_path) == []   # checked before anything is written


@pytest.mark.parametrize("unpacker, blob", [(fetch._unpack_tar, _tar([("../up", tarfile.REGTYPE, b"x")])),
                                            (fetch._unpack_zip, _zip(["../up"]))])
def test_a_climbing_member_refusal_names_the_archive(tmp_path, unpacker, blob):
    """The name check before writing says which archive it refuses (its path, not None)."""
    with pytest.raises(DataError, match=r"^/d/a\.arc: member '\.\./up' would be written outside"):
        unpacker("/d/a.arc", str(tmp_path), io.BytesIO(blob))


@pytest.mark.parametrize("unpacker, what, error", [(fetch._unpack_tar, "tar", "ReadError"),
                                                   (fetch._unpack_zip, "zip", "BadZipFile")])
def test_garbage_is_not_a_readable_archive(tmp_path, unpacker, what, error):
    """Bytes that are no archive: the message names the path, the kind and the exception's type."""
    with pytest.raises(DataError, match=rf"(?s)^/d/g\.bin is not a readable {what} archive \({error}: .+\)$"):
        unpacker("/d/g.bin", str(tmp_path), io.BytesIO(b"no archive at all" * 40))


def test_a_folder_member_after_its_files_is_no_error(tmp_path):
    """A folder already made by an earlier member's file is fine (makedirs with exist_ok)."""
    blob = _tar([("d/f", tarfile.REGTYPE, b"abc"), ("d", tarfile.DIRTYPE, b""), ("d", tarfile.DIRTYPE, b"")])
    fetch._unpack_tar("t.tar", str(tmp_path), io.BytesIO(blob))
    assert (tmp_path / "d" / "f").read_bytes() == b"abc"


# ------------------------------------------------------------------ unpack


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_loose_members_are_put_into_the_folder_readable(tmp_path, kind):
    """An archive without the folder at its top is unpacked into it, mode 0755 (mkdtemp's is 0700),
    reading the already-open file (``path`` names it only), and no scratch folder is left."""
    blob = _tar([("x", tarfile.REGTYPE, b"1"), ("y", tarfile.REGTYPE, b"22")]) if kind == "tar" else _zip(["x", "y"])
    fetch.unpack("/nowhere/a." + kind, kind, str(tmp_path), "ds", fileobj=io.BytesIO(blob))
    assert os.listdir(tmp_path) == ["ds"]
    assert sorted(os.listdir(tmp_path / "ds")) == ["x", "y"]
    assert stat.S_IMODE(os.stat(tmp_path / "ds").st_mode) == 0o755


def test_an_archive_with_the_folder_at_its_top_is_placed_as_it_is(tmp_path):
    """Members already in ``folder/`` end up in root/folder, not root/folder/folder."""
    blob = _tar([("ds", tarfile.DIRTYPE, b""), ("ds/f", tarfile.REGTYPE, b"q")])
    fetch.unpack("a.tar", "tar", str(tmp_path), "ds", fileobj=io.BytesIO(blob))
    assert os.listdir(tmp_path) == ["ds"] and (tmp_path / "ds" / "f").read_bytes() == b"q"


def test_the_scratch_folder_is_hidden_inside_root(tmp_path, monkeypatch):
    """Unpacking goes to ``root/.hpcfl_unpack_*`` (same file system for the rename, hidden from listings)."""
    seen = []

    def spy(path, into, fileobj):
        seen.append(into)
        open(os.path.join(into, "f"), "wb").close()

    monkeypatch.setattr(fetch, "_unpack_tar", spy)
    fetch.unpack("a.tar", "tar", str(tmp_path), "ds", fileobj=io.BytesIO())
    assert os.path.dirname(seen[0]) == str(tmp_path)
    assert os.path.basename(seen[0]).startswith(".hpcfl_unpack_")
    assert os.listdir(tmp_path) == ["ds"]


# ------------------------------------------------------------------ texts


@pytest.mark.parametrize("size, text", [
    (999, "999 bytes (1.0 kB)"),
    (1_251, "1,251 bytes (1.3 kB)"),
    (999_999, "999,999 bytes (1000.0 kB)"),
    (1_000_000, "1,000,000 bytes (1.0 MB)"),
    (1_250_001, "1,250,001 bytes (1.3 MB)"),
    (1_000_000_000, "1,000,000,000 bytes (1.0 GB)"),
    (1_250_000_001, "1,250,000,001 bytes (1.3 GB)"),
])
def test_size_text(size, text):
    """The unit switches at exactly 1e6 and 1e9 bytes; x.x5-and-a-bit rounds up (the scale is exact)."""
    assert fetch.size_text(Remote("f", "u", size, md5="0")) == text


def test_url_of():
    """No mirror: the source's URL; a mirror: ``<mirror>/<name>`` with its trailing slashes (only) dropped."""
    r = Remote("f.gz", "https://src.example/f.gz", 1, md5="0")
    assert fetch.url_of(r, None) == fetch.url_of(r, "") == "https://src.example/f.gz"
    assert fetch.url_of(r, "http://m.example/PX//") == "http://m.example/PX/f.gz"
    assert fetch.url_of(r, "/srv/mirror ") == "/srv/mirror /f.gz"


def test_checksum_text():
    """sha256 first, then md5, joined by ", "; a missing one is left out."""
    assert fetch.checksum_text(Remote("f", "u", 1, md5="ab", sha256="cd")) == "sha256 cd, md5 ab"
    assert fetch.checksum_text(Remote("f", "u", 1, md5="ab")) == "md5 ab"


def test_verify_a_file_by_path(tmp_path):
    """verify: None for the right file; the size, sha256 or md5 problem; a missing file cannot be read."""
    data = b"hello world\n"
    path = tmp_path / "f"
    path.write_bytes(data)
    sha, md5 = hashlib.sha256(data).hexdigest(), hashlib.md5(data).hexdigest()
    assert fetch.verify(str(path), _remote(data, md5=md5.upper(), sha256=sha)) is None
    assert fetch.verify(str(path), Remote("f", "u", 3, md5=md5)) == "12 bytes where the source's file has 3"
    assert fetch.verify(str(path), _remote(data, sha256="0" * 64)) == f"sha256 {sha} where the source's file has {'0' * 64}"
    assert fetch.verify(str(path), _remote(data, md5="ff")) == f"md5 {md5} where the source's file has ff"
    assert fetch.verify(str(tmp_path / "none"), _remote(data, md5=md5)) == \
        "it cannot be read (No such file or directory)"


# ------------------------------------------------------------------ how files are read


class _Reads(io.BytesIO):
    """A binary file that records the size asked of each read."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.asked = []

    def read(self, n=-1):
        self.asked.append(n)
        return super().read(n)


def test_digests_read_in_one_mib_blocks():
    """A multi-GB download is hashed 1 MiB at a time, never read whole into memory."""
    data = os.urandom(3 << 20)
    f = _Reads(data)
    md5, sha = fetch._digests(f)
    assert (md5.hexdigest(), sha.hexdigest()) == (hashlib.md5(data).hexdigest(), hashlib.sha256(data).hexdigest())
    assert f.asked == [1 << 20] * 4


def test_md5_is_asked_for_as_a_plain_checksum(monkeypatch):
    """md5 is requested with usedforsecurity=False, so that a FIPS-mode OpenSSL does not refuse it."""
    seen = []
    real = hashlib.md5

    def md5(*a, **kw):
        seen.append(kw)
        return real(*a, **kw)

    monkeypatch.setattr(fetch.hashlib, "md5", md5)
    fetch._digests(io.BytesIO(b"x"))
    assert seen == [{"usedforsecurity": False}]


def test_members_are_copied_in_one_mib_blocks(tmp_path):
    """Each member is written 1 MiB at a time (not shutil's 64 kB default: archives hold GBs)."""
    data = os.urandom((2 << 20) + 5)
    src = _Reads(data)
    fetch._write_members([("d/big", False, lambda: src)], str(tmp_path), "a.tar")
    assert (tmp_path / "d" / "big").read_bytes() == data
    assert src.asked and set(src.asked) == {1 << 20}
