"""On an 80-column terminal no line of a run's console output is wider than the terminal:
a wider bar wraps, and ``\\r`` returns only over the wrapped part, so old bars pile up."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def run_on_terminal(args, columns, cwd):
    """Run ``python -m hpcfl ARGS`` with stdout and stderr on a pseudo-terminal of ``columns``."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("COLUMNS", None)   # the width must come from the terminal itself
    p = subprocess.Popen([sys.executable, "-m", "hpcfl", *args], stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, cwd=cwd, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:   # EIO: every writer closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert p.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")[-3000:]
    return b"".join(chunks).decode()


def test_no_line_is_wider_than_an_80_column_terminal(tmp_path):
    job = tmp_path / "quickstart.toml"
    job.write_text(re.sub(r"(?m)^rounds = \d+$", "rounds = 4", (ROOT / "jobs" / "quickstart.toml").read_text()))
    out = run_on_terminal(["run", str(job), "--out", str(tmp_path / "run"), "--set", "algorithm.name=gift"],
                          80, tmp_path)
    pieces = [ANSI.sub("", piece) for piece in re.split(r"[\r\n]", out)]
    bars = [piece for piece in pieces if piece.startswith("[")]
    assert len(bars) == 4 and bars[-1].startswith("[" + "#" * 20 + "] round 4/4"), bars
    assert "test_acc" in bars[-1]
    assert any(piece.startswith("wall time") for piece in pieces), out
    wide = [piece for piece in pieces if len(piece) > 79]
    assert not wide, f"{len(wide)} lines wider than 79 columns, e.g. {wide[0]!r}"
