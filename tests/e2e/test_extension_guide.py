"""The extension guide's example runs as written: the code block of docs/architecture.md
("A complete example: loss-tilted weights") is saved as a module, registered the way the guide
says (``HPCFL_ALGORITHMS``), and run through the real CLI on 1 and 2 ranks.

Checked: the two runs are bitwise equal; the recorded weights are n_i F_i^q / sum_j n_j F_j^q
of the recorded losses, and with q = 0 exactly the hand-computed n_i / (n_1 + n_2) of the
2-client split; the legend calls the run "FedTilt". ~15 s on 2 cores.
"""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from clirun import ROOT, assert_same_run, hpcfl

from hpcfl import data
from hpcfl.results import load

JOB = """
[run]
name = "tilt"
seed = 3
rounds = 3
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 2
[data.dirichlet]
alpha = 0.5
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "fedtilt"
lr = 0.05
local_steps = 3
[runtime]
threads = 1
"""


def example_block() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- example: tilt\.py -->\n```python\n(.*?)```", text, re.S)
    assert found, "docs/architecture.md lost its worked example (<!-- example: tilt.py --> then a python block)"
    return found.group(1)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    d = tmp_path_factory.mktemp("plugin")
    (d / "tilt.py").write_text(example_block())
    return {"HPCFL_ALGORITHMS": "tilt", "PYTHONPATH": f"{d}:{ROOT}"}


def run(tmp_path, env, ranks, *sets):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    out = tmp_path / f"out{ranks}{len(sets)}"
    args = ["run", str(job), "--out", str(out)] + [a for s in sets for a in ("--set", s)]
    p = hpcfl(*args, ranks=ranks, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    return out


def sizes() -> np.ndarray:
    """The 2-client split's sizes, as the run's partition draws them (digits, Dirichlet 0.5, seed 3)."""
    ds = data.load_labels("digits", None, None, 3)
    opts = data.partition_options("dirichlet")(alpha=0.5)
    return np.array([len(p) for p in data.make_partition("dirichlet", ds.y_train, 2, opts, 3, ds)])


def test_the_guide_example_runs_bitwise_on_1_and_2_ranks(tmp_path, plugin):
    one, two = run(tmp_path, plugin, 0), run(tmp_path, plugin, 2)
    assert_same_run(one, two)
    r = load(one)
    # /clients is one row per (round, cohort client), the cohort sorted: here [0, 1] every round
    assert np.array_equal(np.asarray(r.clients["client"]), [0, 1] * 3)
    loss = np.asarray(r.clients["start_loss"], dtype=np.float64).reshape(3, 2)
    w = np.asarray(r.clients["weight"]).reshape(3, 2)
    assert np.all(loss > 0)
    n = sizes()
    expect = n * loss / (n * loss).sum(axis=1, keepdims=True)          # q = 1, the default
    np.testing.assert_allclose(w, expect, rtol=1e-12)
    assert not np.allclose(w, n / n.sum())                              # the tilt moved the weights


def test_q_zero_is_fedavgs_size_weights(tmp_path, plugin):
    out = run(tmp_path, plugin, 0, "algorithm.tilt.q=0")
    w = np.asarray(load(out).clients["weight"]).reshape(3, 2)
    n = sizes()
    assert n.sum() == 1347                        # 1797 digits less 450 held out
    np.testing.assert_allclose(w, np.tile(n / n.sum(), (3, 1)), rtol=1e-15)


def test_a_bad_option_is_refused_by_name(tmp_path, plugin):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    p = hpcfl("run", str(job), "--set", "algorithm.tilt.q=-1", "--out", str(tmp_path / "o"), env=plugin)
    assert p.returncode == 2 and "algorithm.tilt.q" in p.stderr


def test_legend_words_come_from_the_registration(plugin):
    code = ("from hpcfl.analysis import words; "
            "print(words.group_words(['algorithm.name', 'algorithm.weights'], "
            "{'algorithm.name': 'fedtilt', 'algorithm.weights': 'tilt'})); "
            "print(words.group_words(['algorithm.name', 'algorithm.tilt.q'], "
            "{'algorithm.name': 'fedavg', 'algorithm.weights': 'size'}))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**os.environ, **plugin}, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["FedTilt, loss-tilted weights", "FedAvg"]
