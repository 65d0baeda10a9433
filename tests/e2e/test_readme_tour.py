"""README.md's tour runs as written, in order, after `make quickstart` (issue: a tour that breaks
on its first line).

The test reads the tour's code block out of README.md (so the README cannot drift from the
code), and runs every line in a copy of the jobs folder whose quickstart jobs train 3 rounds
instead of 30. Only the ``sbatch`` line is left out: it needs a Slurm cluster
(tests/e2e/test_slurm_cluster.py submits the templates to one).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from hpcfl.results import load

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 3


def tour_lines() -> list[str]:
    """The commands of README.md's "A tour" block, comments stripped."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## A tour\n", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S).group(1)
    lines = []
    for line in block.splitlines():
        tokens = shlex.split(line, comments=True)   # `# ...` to the end of the line is the README's comment
        if tokens:
            lines.append(shlex.join(tokens))
    return lines


def quickstart_command() -> str:
    """The command `make quickstart` runs after installing (the Makefile's recipe)."""
    recipe = re.search(r"^quickstart:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    return recipe.replace("$(PY)", "python")


def test_tour_block_is_read():
    lines = tour_lines()
    assert len(lines) >= 8
    assert lines[0].startswith("python -m hpcfl run jobs/quickstart.toml --set algorithm.name=fednova")
    assert any(line.startswith("sbatch ") for line in lines)


def test_readme_tour_runs_as_written(tmp_path):
    shutil.copytree(ROOT / "jobs", tmp_path / "jobs")
    for name in ("quickstart.toml", "sweep_quickstart.toml"):
        job = tmp_path / "jobs" / name
        text, n = re.subn(r"(?m)^rounds = \d+$", f"rounds = {ROUNDS}", job.read_text())
        assert n == 1, f"{name}: no `rounds = N` line to shorten"
        job.write_text(text)
    # `python` and `hpcfl` as a user's shell finds them, both running this checkout.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    shim = bin_dir / "hpcfl"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hpcfl \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "80"}

    def sh(line: str) -> subprocess.CompletedProcess:
        p = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"`{line}` exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p

    sh(quickstart_command())
    ran = []
    for line in tour_lines():
        if line.startswith("sbatch "):
            continue
        ran.append((line, sh(line)))
    assert len(ran) >= 9

    # The first line kept the FedAvg quickstart run that later lines plot and report.
    assert load(tmp_path / "runs" / "quickstart").config["algorithm"]["name"] == "fedavg"
    assert load(tmp_path / "runs" / "fednova").config["algorithm"]["name"] == "fednova"
    assert load(tmp_path / "runs" / "q4").final_params.tobytes() == load(tmp_path / "runs" / "quickstart") \
        .final_params.tobytes(), "4 ranks and 1 rank differ"
    for name in ("part.png", "curves.pdf", "steps.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    assert len(list((tmp_path / "runs" / "sweep_quickstart").glob("*/results.h5"))) == 6
    printed = ran[-1][1].stdout
    assert "quickstart" in printed and "rounds" in printed
