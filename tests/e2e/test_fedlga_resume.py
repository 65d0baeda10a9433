"""FedDyn and FedLGA runs killed and resumed on another rank count end bitwise equal to an
uninterrupted run: final model, every metric but timings, every client record, and the
algorithm's own state in the final checkpoint.

The state that must survive: FedDyn's per-client gradient table (``clients.feddyn_grad``,
rows scattered to the new owners) and the server's h (``server.feddyn_h``); FedLGA's
counter of rounds without a complete client (``server.lga_no_full_rounds``, rank 0 only).
The uninterrupted reference and one side of each resume run in this process through
``cli.main`` (torch is already imported here, which saves a start-up per run); the killed
runs are subprocesses, as they must be for SIGKILL.
"""

import numpy as np
import pytest
from clirun import assert_same_run, hpcfl
from conftest import restore_stop_signals

from hpcfl import cli
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.results import load

COMMON = """
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 7
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[runtime]
threads = 1
progress = "none"
[checkpoint]
every = 2
"""

# FedDyn with slow clients: per_round, 3 of the 5 a round draw tau in 1..3 and run 4 - tau + 1 of 4 steps.
FEDDYN = """
[run]
name = "feddyn_resume"
seed = 4
rounds = 6
[algorithm]
name = "feddyn"
clients_per_round = 5
lr = 0.05
local_steps = 4
steps = "straggler"
[algorithm.straggler]
unit = "step"
tau_max = 3
[algorithm.dyn]
alpha = 0.1
""" + COMMON

# FedLGA rank1 with 5 of the 7 clients slow for the whole run (fixed, tau >= 2) and 3 clients a
# round: at seed 2, rounds 3 and 5 draw only slow clients (no complete client: FedAvg rounds, counted),
# the other rounds are corrected. So the checkpoint after round 4 holds lga_no_full_rounds = 1, and
# round 5, redone after the resume, must count on from it to 2.
FEDLGA = """
[run]
name = "fedlga_resume"
seed = 2
rounds = 6
[algorithm]
name = "fedlga"
clients_per_round = 3
lr = 0.05
local_steps = 4
steps = "straggler"
[algorithm.straggler]
unit = "step"
assignment = "fixed"
rho = 0.7
tau_min = 2
tau_max = 3
""" + COMMON


def in_process(job, out):
    """``hpcfl run job --out out`` on this process's one rank; returns its exit code."""
    try:
        return cli.main(["run", str(job), "--out", str(out)])
    finally:
        restore_stop_signals()   # a module fixture runs this: put pytest's handlers back at once


def final_state(out):
    """The arrays of the run's newest checkpoint (the one written after its last round)."""
    loaded = CheckpointStore(out / "checkpoints").load_latest()
    assert loaded.round == 6
    return loaded.arrays


def reference(tmp_path_factory, name, text):
    """The uninterrupted run of the job ``text``: its --out directory."""
    d = tmp_path_factory.mktemp(f"{name}_ref")
    (d / "job.toml").write_text(text)
    assert in_process(d / "job.toml", d / "out") == 0
    return d / "out"


@pytest.fixture(scope="module")
def feddyn_ref(tmp_path_factory):
    return reference(tmp_path_factory, "feddyn", FEDDYN)


@pytest.fixture(scope="module")
def fedlga_ref(tmp_path_factory):
    return reference(tmp_path_factory, "fedlga", FEDLGA)


def test_feddyn_killed_on_one_rank_resumes_bitwise_on_two(feddyn_ref, tmp_path):
    """Killed (SIGKILL) in the server phase of round 4 on one rank, the run restarts from the
    checkpoint of round 2 on two ranks: rank 1 now owns clients whose grad_i rows were written
    by rank 0. h and the grad_i rows are already non-zero there, so a state lost or misplaced
    on resume would change rounds 3-6; the end must equal the uninterrupted run bit for bit."""
    job, out = tmp_path / "job.toml", tmp_path / "out"
    job.write_text(FEDDYN)
    p = hpcfl("run", str(job), "--out", str(out), env={"HPCFL_FAULT": "0:server:3:kill"})
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-3000:]   # the kill, not an error
    saved = CheckpointStore(out / "checkpoints").load_latest()
    assert saved.round == 2
    assert np.abs(saved.arrays["server.feddyn_h"]).max() > 0
    assert np.count_nonzero(np.abs(saved.arrays["clients.feddyn_grad"]).max(axis=1)) >= 5
    p = hpcfl("run", str(job), "--out", str(out), ranks=2, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "resuming from ckpt" in p.stdout
    assert_same_run(feddyn_ref, out)
    a, b = final_state(feddyn_ref), final_state(out)
    for name in ("server.feddyn_h", "clients.feddyn_grad", "model"):
        assert a[name].tobytes() == b[name].tobytes(), f"{name} differs"


def test_fedlga_killed_on_two_ranks_resumes_bitwise_on_one(fedlga_ref, tmp_path, capsys):
    """Killed (SIGKILL of rank 0) while training round 5 on two ranks, the run restarts from the
    checkpoint of round 4 on one rank. lga_no_full_rounds = 1 there (round 3 had no complete
    client); round 5 has none either, so the resumed counter must read 2 in /metrics and in the
    final checkpoint, as in the uninterrupted run, and every corrected round must match."""
    job, out = tmp_path / "job.toml", tmp_path / "out"
    job.write_text(FEDLGA)
    p = hpcfl("run", str(job), "--out", str(out), ranks=2, env={"HPCFL_FAULT": "0:train:4:kill"})
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-3000:]   # the kill, not an error
    saved = CheckpointStore(out / "checkpoints").load_latest()
    assert saved.round == 4 and saved.arrays["server.lga_no_full_rounds"].tolist() == [1]
    capsys.readouterr()
    assert in_process(job, out) == 0
    assert "resuming from ckpt" in capsys.readouterr().out
    assert_same_run(fedlga_ref, out)
    a, b = final_state(fedlga_ref), final_state(out)
    assert a["server.lga_no_full_rounds"].tolist() == b["server.lga_no_full_rounds"].tolist() == [2]
    metrics = load(out).metrics
    assert metrics["lga_no_full_rounds"].tolist() == [0, 0, 1, 1, 2, 2]
    assert metrics["lga_corrected"].tolist()[3] > 0          # round 4 was corrected (alpha_i on record)
