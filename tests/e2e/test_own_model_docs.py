"""docs/own-model-and-data.md, run as written: its files are written from the page's code blocks
(each names its file on its first line), its commands run in order from a fresh folder, and what the
page says of them is checked: a model of the user's own on a LEAF file, 2 ranks bitwise the 1-rank
run, and the fairness report's figures equal to the clients' own-row accuracies in results.h5."""

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcfl.results import load

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "own-model-and-data.md"


def blocks():
    """(language, code) of every fenced block of the page, in order."""
    return re.findall(r"```(\w*)\n(.*?)```", PAGE.read_text(), re.S)


def files_and_commands():
    files, commands = {}, []
    for lang, code in blocks():
        named = re.match(r"# ([\w.-]+\.(?:py|toml))\b", code)
        if named:
            files[named.group(1)] = code
        elif lang == "":
            commands += [line for line in code.splitlines() if line.startswith(("python ", "mpiexec "))]
    return files, commands


def test_the_page_names_its_files_and_commands():
    files, commands = files_and_commands()
    assert sorted(files) == ["femnist.toml", "make_femnist.py", "nets.py", "same_bits.py"]
    assert commands == [
        "python make_femnist.py",
        "python -m hpcfl run femnist.toml --out runs/femnist-1",
        "mpiexec -n 2 python -m mpi4py -m hpcfl run femnist.toml --out runs/femnist-2",
        "python same_bits.py",
        "python -m hpcfl report runs/femnist-1",
    ]


@pytest.mark.timeout(900)
def test_the_page_runs_as_written(tmp_path):
    files, commands = files_and_commands()
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = {}
    for command in commands:
        argv = [sys.executable if word == "python" else word for word in command.split()]
        p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"{command}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        out[command] = p.stdout + p.stderr
    assert "40 writers: 1280 training rows, 320 test rows" in out[commands[0]]
    one, two = load(tmp_path / "runs" / "femnist-1"), load(tmp_path / "runs" / "femnist-2")
    # the model is the user's, with its option, and the natural split is the writers'
    assert one.config["model"]["name"] == "nets:SmallCNN" and one.config["model"]["SmallCNN"] == {"width": 8}
    assert one.class_counts.shape == (40, 62) and one.class_counts.sum() == 1280
    assert two.segments[0]["world_size"] == 2
    assert "1 rank and 2 ranks: the same bits" in out[commands[3]]
    assert one.final_params.tobytes() == two.final_params.tobytes()
    # the report's fairness columns are the last evaluation's own-row accuracies, by hand
    ev = one.client_eval
    last = ev["round"] == ev["round"].max()
    acc = np.sort(ev["accuracy"][last])
    assert acc.size == 40 and ev["samples"][last].sum() == 320      # every writer's 8 own test rows
    worst = acc[: max(1, int(np.ceil(0.1 * acc.size)))].mean()
    jain = acc.sum() ** 2 / (acc.size * (acc ** 2).sum())
    row = next(line for line in out[commands[4]].splitlines() if line.startswith("all "))
    cells = row.split()
    assert [float(c) for c in cells[6:10]] == pytest.approx(
        [acc.mean(), worst, acc.std(ddof=0), jain], abs=6e-5), row
    assert one.metrics["test_accuracy"][-1] > 0.3       # it learns: 62 classes, chance is 0.016
