"""``hpcfl data get`` against hostile servers and a hostile shared ``--root`` (issue 45 items 2, 3, 7).

A server that sends more than the published size, without end, that stalls, or that drips a
byte at a time; a ``.part`` planted as a link or a FIFO; a ``.hpcfl_download`` folder that
someone else owns or can write; Ctrl-C in the middle of a download; a complete but wrong
``.part`` with no network. The dataset is one file of random bytes ("mnist" made of a single
file), so that each test controls every byte; the limits are set small through the documented
environment variables. ~6 s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import stat
import threading
import time

import pytest
from test_data_get import Mirror

from hpcfl import cli
from hpcfl.data import fetch, sources

NAME = "blob.bin"
PART = NAME + ".part"


@pytest.fixture
def blob(monkeypatch) -> bytes:
    """200 kB of random bytes, published as the whole of "mnist" (its size and md5)."""
    data = os.urandom(200_000)
    src = sources.SOURCES["mnist"]
    one = sources.Remote(NAME, "https://example.invalid/" + NAME, len(data), md5=hashlib.md5(data).hexdigest())
    monkeypatch.setitem(sources.SOURCES, "mnist", dataclasses.replace(src, files=(one,)))
    return data


def get(root, url, capsys):
    rc = cli.main(["data", "get", "mnist", "--root", str(root), "--mirror", url])
    out = capsys.readouterr()
    return rc, out.out, out.err


def scratch(root) -> str:
    path = os.path.join(root, fetch.SCRATCH)
    os.makedirs(path, mode=0o700)
    return path


def dead_url() -> str:
    with Mirror({}) as m:   # the port is closed once the block ends: connecting is refused at once
        return m.url


# ------------------------------------------------------------------ item 2: a planted .part or folder


def test_a_link_planted_as_the_part_is_refused_and_its_target_kept(tmp_path, blob, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"the owner's precious file")
    root = tmp_path / "data"
    link = os.path.join(scratch(root), PART)
    os.symlink(victim, link)
    with Mirror({NAME: blob}) as m:
        rc, _, err = get(root, m.url, capsys)
    assert rc == 2
    assert f"{link} is a symbolic link (to {victim})" in err and "Remove it" in err
    assert victim.read_bytes() == b"the owner's precious file"
    assert m.log == []                                     # refused before anything was fetched
    assert os.path.islink(link) and not (root / "mnist").exists()


@pytest.mark.timeout(30)   # before the fix, opening the FIFO to write waited for a reader for good
def test_a_fifo_planted_as_the_part_is_refused_at_once(tmp_path, blob, capsys):
    root = tmp_path / "data"
    fifo = os.path.join(scratch(root), PART)
    os.mkfifo(fifo)
    t0 = time.monotonic()
    with Mirror({NAME: blob}) as m:
        rc, _, err = get(root, m.url, capsys)
    assert rc == 2 and time.monotonic() - t0 < 5
    assert f"{fifo} is not a regular file but a FIFO (named pipe)" in err and "Remove it" in err
    assert m.log == [] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.parametrize("how", ["another user's", "group-writable", "world-writable", "a link"])
def test_a_scratch_folder_others_can_write_is_refused(tmp_path, blob, capsys, how):
    root = tmp_path / "data"
    folder = os.path.join(root, fetch.SCRATCH)
    elsewhere = tmp_path / "elsewhere"
    if how == "a link":
        os.makedirs(root)
        elsewhere.mkdir(mode=0o700)
        os.symlink(elsewhere, folder)
    else:
        scratch(root)
        if how == "another user's":
            os.chown(folder, 4321, 4321)   # the tests run as root here: as if user 4321 had made it
        else:
            os.chmod(folder, 0o770 if how == "group-writable" else 0o707)
    with Mirror({NAME: blob}) as m:
        rc, _, err = get(root, m.url, capsys)
    assert rc == 2 and m.log == []
    assert f"hpcfl data get: {folder} " in err
    if how == "another user's":
        assert "is owned by another user (uid 4321;" in err and "choose a --root of your own" in err
    elif how == "a link":
        assert f"is a symbolic link (to {elsewhere})" in err and os.listdir(elsewhere) == []
    else:
        who, mode = ("group", "770") if how == "group-writable" else ("others", "707")
        assert f"is writable by {who} (mode {mode})" in err
        assert f"chmod go-w {folder}" in err
    assert sorted(os.listdir(root)) == [fetch.SCRATCH]
    if how != "a link":
        assert os.listdir(folder) == []


def test_the_scratch_folder_is_made_private(tmp_path, blob, capsys):
    root = tmp_path / "data"
    old = os.umask(0o002)   # a group-sharing umask must not make it group-writable (and so refused next time)
    try:
        with Mirror({NAME: blob}) as m:
            m.cut[NAME] = 1000
            rc, _, err = get(root, m.url, capsys)
    finally:
        os.umask(old)
    assert rc == 2 and "broke off after 1,000 bytes" in err
    st = os.stat(root / fetch.SCRATCH)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_IMODE(os.stat(root / fetch.SCRATCH / PART).st_mode) == 0o600


# ------------------------------------------------------------------ item 3: a size bound and time limits


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["longer", "endless"])
def test_more_than_the_published_size_is_an_error_and_removed(tmp_path, blob, capsys, how):
    root = tmp_path / "data"
    with Mirror({NAME: blob}) as m:
        m.hostile[NAME] = how
        rc, _, err = get(root, m.url, capsys)
        assert rc == 2
        assert f"the server sent more than the published size of {len(blob):,} bytes" in err
        assert "broke off" not in err
        assert os.listdir(root) == []   # no .part (nor its emptied folder), nothing placed
        del m.hostile[NAME]   # the server is fixed: a rerun starts over, it resumes no garbage
        rc, _, err = get(root, m.url, capsys)
    assert rc == 0, err
    assert m.log == [(NAME, None), (NAME, None)]
    assert (root / "mnist" / NAME).read_bytes() == blob


@pytest.mark.timeout(30)   # before the fix it waited 60 s (and a drip of a byte in less, for ever)
def test_a_stalled_transfer_times_out_and_resumes(tmp_path, blob, capsys, monkeypatch):
    monkeypatch.setenv("HPCFL_DATA_STALL_S", "0.5")
    root = tmp_path / "data"
    with Mirror({NAME: blob}) as m:
        m.hostile[NAME] = "stall"
        t0 = time.monotonic()
        rc, _, err = get(root, m.url, capsys)
        assert rc == 2 and time.monotonic() - t0 < 5
        half = len(blob) // 2
        assert f"stalled: no byte for 0.5 s after {half:,} bytes" in err and "HPCFL_DATA_STALL_S" in err
        assert "run the same command again to resume it" in err
        assert (root / fetch.SCRATCH / PART).read_bytes() == blob[:half]   # a valid prefix, kept
        del m.hostile[NAME]
        rc, out, err = get(root, m.url, capsys)
    assert rc == 0, err
    assert m.log[-1] == (NAME, f"bytes={half}-") and f"resuming after {half:,} bytes" in out
    assert (root / "mnist" / NAME).read_bytes() == blob


@pytest.mark.timeout(30)
def test_a_slow_drip_is_stopped_by_the_rate_floor(tmp_path, blob, capsys, monkeypatch):
    monkeypatch.setenv("HPCFL_DATA_STALL_S", "5")         # each byte comes well within it
    monkeypatch.setenv("HPCFL_DATA_MIN_RATE", "1000")
    monkeypatch.setenv("HPCFL_DATA_RATE_WINDOW_S", "0.5")
    root = tmp_path / "data"
    with Mirror({NAME: blob}) as m:
        m.hostile[NAME] = ("drip", 1, 0.05)                # 20 bytes/s
        t0 = time.monotonic()
        rc, _, err = get(root, m.url, capsys)
    assert rc == 2 and time.monotonic() - t0 < 5
    assert "slower than 1,000 bytes/s over 0.5 s" in err and "HPCFL_DATA_MIN_RATE" in err
    kept = (root / fetch.SCRATCH / PART).read_bytes()
    assert 0 < len(kept) < 100 and kept == blob[:len(kept)]


def test_the_limits_from_the_environment_are_checked(tmp_path, blob, capsys, monkeypatch):
    monkeypatch.setenv("HPCFL_DATA_STALL_S", "soon")
    rc, _, err = get(tmp_path / "data", dead_url(), capsys)
    assert rc == 2 and "HPCFL_DATA_STALL_S='soon' is not a positive number of seconds" in err


@pytest.fixture
def ctrl_c_default():
    """Python's own Ctrl-C handler for the test, whatever the suite inherited: a suite started in the
    background (``nohup ... &``) inherits SIGINT ignored, and Python then leaves it ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.timeout(30)
def test_ctrl_c_ends_with_one_line_and_keeps_a_prefix_to_resume(tmp_path, blob, capsys, ctrl_c_default):
    root = tmp_path / "data"
    part = root / fetch.SCRATCH / PART
    assert threading.current_thread() is threading.main_thread()   # where Python raises KeyboardInterrupt
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    main = threading.main_thread().ident

    def press_ctrl_c():   # once the download is under way, as a user at the terminal would
        while not (part.exists() and part.stat().st_size >= 2000):
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)

    with Mirror({NAME: blob}) as m:
        m.hostile[NAME] = ("drip", 1000, 0.02)             # 10 s for the whole file
        threading.Thread(target=press_ctrl_c, daemon=True).start()
        try:
            rc, _, err = get(root, m.url, capsys)
        except KeyboardInterrupt:
            pytest.fail("Ctrl-C escaped hpcfl data get as KeyboardInterrupt (a traceback)")
        kept = part.read_bytes()
        assert rc == 75
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"hpcfl data get: interrupted: the {len(kept):,} bytes of {NAME} downloaded so "
                              f"far are kept in {part}; run the same command again to resume")
        assert len(kept) >= 2000 and kept == blob[:len(kept)]
        del m.hostile[NAME]
        rc, _, err = get(root, m.url, capsys)
    assert rc == 0, err
    assert m.log[-1] == (NAME, f"bytes={len(kept)}-")
    assert (root / "mnist" / NAME).read_bytes() == blob


# ------------------------------------------------------------------ item 7: a complete .part, offline


@pytest.mark.parametrize("how", ["wrong bytes", "too long"])
def test_a_complete_but_wrong_part_is_rejected_without_network(tmp_path, blob, capsys, how):
    root = tmp_path / "data"
    part = os.path.join(scratch(root), PART)
    bad = os.urandom(len(blob)) if how == "wrong bytes" else blob + b"more"
    with open(part, "wb") as f:
        f.write(bad)
    rc, _, err = get(root, dead_url(), capsys)   # no network: it must not be needed to judge the file
    assert rc == 2
    assert "copy" not in err and "cannot reach" not in err
    problem = (f"md5 {hashlib.md5(bad).hexdigest()} where the source's file has {hashlib.md5(blob).hexdigest()}"
               if how == "wrong bytes" else f"{len(bad):,} bytes where the source's file has {len(blob):,}")
    rejected = os.path.join(root, fetch.SCRATCH, NAME + ".rejected")
    assert f"{part} is complete but is not the source's file: {problem}" in err
    assert f"moved to {rejected}" in err
    assert os.listdir(os.path.dirname(part)) == [NAME + ".rejected"]   # no .part left to resume
    with open(rejected, "rb") as f:
        assert f.read() == bad


def test_a_redirect_from_https_to_http_is_refused():
    import urllib.request

    from hpcfl.data import transfer
    from hpcfl.errors import DataError

    handler = transfer._NoDowngrade()
    req = urllib.request.Request("https://example.org/x.gz")
    with pytest.raises(DataError, match=r"https://example.org/x.gz redirects to http://evil.example/x.gz, which "
                                        r"is not https; refused"):
        handler.redirect_request(req, None, 302, "Found", {}, "http://evil.example/x.gz")
    assert handler.redirect_request(req, None, 302, "Found", {}, "https://cdn.example/x.gz").full_url == \
        "https://cdn.example/x.gz"


def test_a_server_that_ignores_range_restarts_the_part_instead_of_appending(tmp_path, blob, capsys):
    """An interrupted download's .part holds the first 1,000 bytes; the server answers the Range
    request with 200 and the whole file. The .part must start over: appended, it would hold the
    first 1,000 bytes twice (and run past the published size)."""
    root = tmp_path / "data"
    with open(os.path.join(scratch(root), PART), "wb") as f:
        f.write(blob[:1000])
    with Mirror({NAME: blob}) as m:
        m.hostile[NAME] = "ignores range"
        rc, out, err = get(root, m.url, capsys)
    assert rc == 0, err
    assert m.log == [(NAME, "bytes=1000-")]
    assert f"the server does not resume downloads: starting {PART} over" in out
    assert (root / "mnist" / NAME).read_bytes() == blob


def test_a_missing_plain_file_is_fetched_into_a_folder_that_exists(tmp_path, blob, capsys):
    """A dataset of plain files whose folder is already there (another of its files, or the user's
    own) still gets its missing file; only an unpacked dataset's folder means "already there"."""
    root = tmp_path / "data"
    (root / "mnist").mkdir(parents=True)
    (root / "mnist" / "notes.txt").write_text("mine")
    with Mirror({NAME: blob}) as m:
        rc, out, err = get(root, m.url, capsys)
    assert rc == 0, err
    assert m.log == [(NAME, None)] and "already exists" not in out
    assert (root / "mnist" / NAME).read_bytes() == blob and (root / "mnist" / "notes.txt").read_text() == "mine"
