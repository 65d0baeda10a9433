"""Mutation-testing pins for :func:`hpcfl.data.fetch.get` / ``_get_file`` / ``_kept`` (issue 48).

What ``get`` says and raises, word for word, for a plain file already in place (right or wrong),
a wrong download, a complete but wrong ``.part``, an archive (unpacked from the very file that was
verified); and what Ctrl-C reports for each state of the ``.part``. Files are served by the local
HTTP server of ``test_data_get``; ~1 s.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile

import pytest
from test_data_get import Mirror

from hpcfl.data import fetch
from hpcfl.data.scratch import Scratch
from hpcfl.data.sources import Remote, Source
from hpcfl.errors import DataError

DATA = b"the dataset's one file\n" * 100


def _source(data: bytes = DATA, name: str = "f.bin", unpack: str | None = None, both: bool = False) -> Source:
    sha = hashlib.sha256(data).hexdigest() if both else None
    one = Remote(name, "https://example.invalid/" + name, len(data), md5=hashlib.md5(data).hexdigest(),
                 sha256=sha, unpack=unpack)
    return Source("n", "https://example.invalid", "ds", (one,))


def _get(root, source, served: dict[str, bytes]):
    said = []
    with Mirror(served) as m:
        fetch.get("myset", source, str(root), mirror=m.url, say=said.append)
    return said, m


def _tgz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


# ------------------------------------------------------------------ a plain file already in place


def test_a_plain_file_in_place_is_verified_without_network(tmp_path):
    """The right file already at root/folder/name is verified and said so; nothing is downloaded."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f.bin").write_bytes(DATA)
    said, m = _get(tmp_path, _source(), {})
    assert said == [f"{tmp_path}/ds/f.bin: present and verified"]
    assert m.log == []


def test_a_wrong_plain_file_in_place_is_an_error_naming_the_problem(tmp_path):
    """A wrong file in place is left there and DataError says what is wrong and what to do, exactly."""
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "f.bin").write_bytes(b"mine")
    with pytest.raises(DataError, match=r"^" + re.escape(
            f"{tmp_path}/ds/f.bin exists but is not the source's file (4 bytes where the source's file has "
            f"{len(DATA):,}); delete it and run the same command again") + "$"):
        _get(tmp_path, _source(), {"f.bin": DATA})
    assert (tmp_path / "ds" / "f.bin").read_bytes() == b"mine"


# ------------------------------------------------------------------ downloads


def test_a_download_says_the_url_size_and_checksum_used(tmp_path):
    """The lines said: "<name>: <url> (<size>)", then which checksum matched (sha256 when both are published)."""
    with Mirror({"f.bin": DATA}) as m:
        said = []
        fetch.get("myset", _source(both=True), str(tmp_path), mirror=m.url, say=said.append)
    assert said[0] == f"myset: {m.url}/f.bin ({len(DATA):,} bytes ({len(DATA) / 1e3:.1f} kB))"
    assert said[-1] == "  verified (sha256 matches)"
    assert (tmp_path / "ds" / "f.bin").read_bytes() == DATA


def test_a_wrong_download_is_rejected_with_the_whole_message(tmp_path):
    """Wrong bytes of the right size: moved to .rejected; the message names URL, dataset, problem, fix."""
    bad = bytes(len(DATA))
    with Mirror({"f.bin": bad}) as m, pytest.raises(DataError) as e:
        fetch.get("myset", _source(), str(tmp_path), mirror=m.url, say=[].append)
    rejected = tmp_path / fetch.SCRATCH / "f.bin.rejected"
    assert str(e.value) == (
        f"{m.url}/f.bin is not the file myset needs: md5 {hashlib.md5(bad).hexdigest()} where the source's file "
        f"has {hashlib.md5(DATA).hexdigest()}. Nothing was placed where a run reads; it was moved to {rejected} "
        "(delete it). Run the same command again to download the file; if it repeats, the server or mirror serves "
        "another file")
    assert rejected.read_bytes() == bad and not (tmp_path / "ds").exists()


def test_a_complete_but_wrong_part_message_ends_with_the_fix(tmp_path):
    """Offline rejection of a complete .part: the message ends at "download the file" (no server hint)."""
    (tmp_path / fetch.SCRATCH).mkdir(mode=0o700)
    (tmp_path / fetch.SCRATCH / "f.bin.part").write_bytes(bytes(len(DATA)))
    with pytest.raises(DataError, match=r" Run the same command again to download the file$"):
        _get(tmp_path, _source(), {})


# ------------------------------------------------------------------ archives


def test_an_archive_is_unpacked_from_the_verified_file_and_said(tmp_path, monkeypatch):
    """The archive is unpacked from the open, verified file (not reopened by path) and the folder is said."""
    blob = _tgz({"a.txt": b"A", "b.txt": b"BB"})
    calls = []
    real = fetch.unpack

    def spy(path, kind, root, folder, fileobj=None):
        calls.append((path, kind, fileobj is not None and not fileobj.closed))
        return real(path, kind, root, folder, fileobj=fileobj)

    monkeypatch.setattr(fetch, "unpack", spy)
    said, _ = _get(tmp_path, _source(blob, "a.tgz", unpack="tar"), {"a.tgz": blob})
    assert calls == [(str(tmp_path / fetch.SCRATCH / "a.tgz.part"), "tar", True)]
    assert said[-1] == f"  unpacked into {tmp_path}/ds"
    assert (tmp_path / "ds" / "b.txt").read_bytes() == b"BB"


def test_an_unsafe_archive_refusal_names_the_downloaded_part(tmp_path):
    """A climbing member: the refusal names the .part it was read from (the path unpack is given)."""
    blob = _tgz({"../evil": b"E"})
    part = tmp_path / fetch.SCRATCH / "a.tgz.part"
    with pytest.raises(DataError, match=r"^" + re.escape(f"{part}: member '../evil' would be written outside")):
        _get(tmp_path, _source(blob, "a.tgz", unpack="tar"), {"a.tgz": blob})
    assert not (tmp_path / "evil").exists() and not (tmp_path / "ds").exists()


# ------------------------------------------------------------------ Ctrl-C: _kept and get


@pytest.fixture
def scratch(tmp_path):
    s = Scratch(str(tmp_path))
    yield s
    s.close()


R = Remote("f.bin", "u", 10, md5="0")
PART = "f.bin.part"


def test_kept_before_any_file(scratch):
    """No file begun: the exact text."""
    assert fetch._kept(scratch, None) == "interrupted before any download; run the same command again"


@pytest.mark.parametrize("planted", [False, True])
def test_kept_with_no_part_or_a_planted_one(scratch, planted):
    """No .part (or one that is a link, which size() refuses): nothing half written was placed."""
    if planted:
        os.symlink("/etc/hostname", os.path.join(scratch.folder, PART))
    assert fetch._kept(scratch, R) == ("interrupted; what is already in place was verified, nothing half written "
                                       "was placed: run the same command again to finish")


@pytest.mark.parametrize("size, text, kept", [
    (4, "interrupted: the 4 bytes of f.bin downloaded so far are kept in {p}; run the same command again to resume",
     True),
    (10, "interrupted: {p} is complete and kept; run the same command again to finish", True),
    (11, "interrupted; the download of f.bin was removed: run the same command again", False),
])
def test_kept_by_the_size_of_the_part(scratch, size, text, kept):
    """A prefix is kept to resume, a complete .part kept to verify, a longer one removed."""
    p = os.path.join(scratch.folder, PART)
    with open(p, "wb") as f:
        f.write(b"x" * size)
    assert fetch._kept(scratch, R) == text.format(p=p)
    assert os.path.exists(p) is kept


def test_ctrl_c_before_the_first_file_says_so(tmp_path):
    """KeyboardInterrupt before any file was begun (here: from the list of files itself) ends in Interrupted."""

    class Files:
        seen = 0

        def __iter__(self):
            Files.seen += 1
            if Files.seen > 1:   # the first pass is get's "is any an archive" check
                raise KeyboardInterrupt
            return iter(())

    source = Source("n", "h", "ds", Files())
    with pytest.raises(fetch.Interrupted, match=r"^interrupted before any download; run the same command again$"):
        fetch.get("myset", source, str(tmp_path), say=[].append)
