"""Inputs that block (issue 37.3): a FIFO as a data file hung start-up for 600 s, deaf to SIGTERM
(the handler only sets a flag and the blocking open() is retried)."""

import errno
import os
import signal
import subprocess
import sys
import time

from clirun import ROOT, hpcfl, kill_group

from hpcfl import signals
from hpcfl.parallel.exits import EXIT_INPUT, EXIT_RESUMABLE

QUICKSTART = str(ROOT / "jobs" / "quickstart.toml")


def test_a_fifo_as_a_data_file_is_refused_at_once_naming_it(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    os.mkfifo(d / "fifo.npz")
    p = hpcfl("run", QUICKSTART, "--out", str(tmp_path / "out"), "--set", "data.dataset=npz", "--set",
              f"data.root={d}", "--set", "data.npz.file=fifo.npz", timeout=120)
    assert p.returncode == EXIT_INPUT, (p.returncode, p.stderr)
    assert f"cannot read {d / 'fifo.npz'}: not a regular file but a FIFO (named pipe)" in p.stderr
    assert not (tmp_path / "out").exists()                      # refused before anything was written


# The regular-file check now refuses every FIFO among the inputs, so to reach the signal path the
# child below puts back a plain open() for data files: the run blocks reading a FIFO as it did.
BLOCKED_CHILD = """
import sys
from hpcfl import signals
signals.install(startup=True)   # as hpcfl/__main__.py does for run
import hpcfl.data.disk as disk
disk.open_regular = lambda path, *a, **k: open(path, "rb")
from hpcfl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_signal_ends_a_start_up_blocked_in_a_read(tmp_path):
    """The handler only set a flag and the blocked read was retried after it: SIGTERM never
    reached the check after start-up (600 s in the report). Now a stop during start-up ends a
    process whose start-up stands still, exit 75 (nothing written: run it again)."""
    d = tmp_path / "d"
    d.mkdir()
    fifo = d / "fifo.npz"
    os.mkfifo(fifo)
    p = subprocess.Popen([sys.executable, "-c", BLOCKED_CHILD, "run", QUICKSTART, "--out", str(tmp_path / "out"),
                          "--set", "data.dataset=npz", "--set", f"data.root={d}", "--set", "data.npz.file=fifo.npz"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    writer = None
    try:
        deadline = time.monotonic() + 120
        while writer is None:   # a FIFO opens for writing once a reader has it open: the run is there
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as exc:
                assert exc.errno == errno.ENXIO
                time.sleep(0.1)
        time.sleep(1)
        assert p.poll() is None                                 # blocked reading: nothing comes, no end
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=signals.STARTUP_GRACE_S + signals.STARTUP_STILL_S + 60)
        took = time.monotonic() - t
    finally:
        kill_group(p)
        if writer is not None:
            os.close(writer)
    assert p.returncode == EXIT_RESUMABLE, (p.returncode, err)
    assert took < signals.STARTUP_GRACE_S + signals.STARTUP_STILL_S + 20, took   # not the 600 s of the report
    assert "SIGTERM received: stopping at the end of start-up" in err
    assert "start-up is blocked" in err and "without progress after SIGTERM" in err
    assert "Nothing was written" in err and not (tmp_path / "out").exists()


def test_the_start_up_exit_is_the_resumable_code():
    assert signals.STARTUP_EXIT == EXIT_RESUMABLE
