"""GIFT through the real CLI: the results file's records (spec G4), when a decided tau is used (B4),
and a run killed and resumed on another rank count (B5, G4's resume clause).

One job: 10 clients on the 8x8 digits with a small MLP; the simulated clock keeps the 4 earliest
reports of each round (exponential delays), so reporters change between rounds; patience and
warm-up 2 with an absolute threshold alone (eps_abs 0.05, eps_rel 0) make GIFT's stagnation rule
halve tau twice within 12 rounds (C falls by less than 0.05 per round after the first few), at
rounds the kill-and-resume test relies on. The uninterrupted run and the resume
go through ``cli.main`` in this process (``hpcfl run``'s own entry point; torch is already imported,
which saves a start-up per run); the killed run is a 2-rank subprocess, as SIGKILL needs.
"""

import json

import h5py
import numpy as np
import pytest
from clirun import assert_same_run, hpcfl
from conftest import restore_stop_signals

from hpcfl import cli
from hpcfl.results import load

ROUNDS, TAU0, EVAL_EVERY, REPORTERS = 12, 8, 3, 4
JOB = f"""
[run]
name = "gift_results"
seed = 2
rounds = {ROUNDS}
eval_every = {EVAL_EVERY}
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 10
[data.dirichlet]
alpha = 0.5
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "gift"
lr = 0.1
batch_size = 16
local_steps = {TAU0}
[algorithm.gift]
patience = 2
warmup = 2
eps_abs = 0.05
eps_rel = 0.0
[system]
enabled = true
compute_s = 0.01
delay_dist = "exponential"
delay_s = 1.0
earliest_fraction = 0.4
[runtime]
threads = 1
progress = "none"
[checkpoint]
every = 2
"""
METRICS = ("round", "tau_used", "tau_next", "gift_C", "clients_participating", "sim_time_round", "sim_time",
           "local_iters_cum", "test_accuracy", "test_loss")


def run_here(job, out):
    """``hpcfl run job --out out`` as one process, in this one; returns the exit code."""
    try:
        return cli.main(["run", str(job), "--out", str(out)])
    finally:
        restore_stop_signals()   # hpcfl run leaves its signal handlers installed: put pytest's back


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    d = tmp_path_factory.mktemp("gift_ref")
    (d / "job.toml").write_text(JOB)
    assert run_here(d / "job.toml", d / "out") == 0
    return d / "out"


def test_G4_schema_events_and_config(ref):
    """Spec G4: every per-round record GIFT promises exists, one row per round, with a unit and a
    description; test accuracy and loss are NaN except on evaluation rounds (3, 6, 9, 12 for
    eval_every = 3 and the last round); /controller_events lists exactly the rounds where
    tau_used != tau_next, as (round, old, new, "stagnation") with new = ceil(old / 2) (gamma 2, the
    only rule that can fire with relaxation off); C lies in [0, 1]; the job's settings are in the
    root attribute ``config``. tau must change at least twice, or the table says little."""
    with h5py.File(ref / "results.h5", "r") as f:
        for name in METRICS:
            ds = f[f"metrics/{name}"]
            assert ds.shape == (ROUNDS,), name
            assert ds.attrs["unit"] and ds.attrs["description"], name
        m = {k: f[f"metrics/{k}"][()] for k in METRICS}
        events = f["controller_events"][()]
        assert f["controller_events"].attrs["description"]
        cfg = json.loads(f.attrs["config"])
    assert m["round"].tolist() == list(range(1, ROUNDS + 1))
    evaluated = m["round"] % EVAL_EVERY == 0
    for k in ("test_accuracy", "test_loss"):
        assert np.isnan(m[k][~evaluated]).all() and np.isfinite(m[k][evaluated]).all(), k
    assert ((m["gift_C"] >= 0) & (m["gift_C"] <= 1)).all()
    changed = m["tau_used"] != m["tau_next"]
    assert changed.sum() >= 2, m["tau_used"]
    assert events["round"].tolist() == m["round"][changed].tolist()
    assert events["old_tau"].tolist() == m["tau_used"][changed].tolist()
    assert events["new_tau"].tolist() == m["tau_next"][changed].tolist()
    assert [(-(-old // 2)) for old in events["old_tau"]] == events["new_tau"].tolist()
    assert set(events["reason"].tolist()) == {b"stagnation"}
    assert cfg["algorithm"]["name"] == "gift" and cfg["algorithm"]["local_steps"] == TAU0
    assert cfg["algorithm"]["gift"]["patience"] == 2 and cfg["algorithm"]["gift"]["eps_abs"] == 0.05
    assert cfg["system"]["earliest_fraction"] == 0.4 and cfg["run"]["eval_every"] == EVAL_EVERY


def test_B4_decided_tau_is_used_by_every_participant_next_round(ref):
    """Spec B4: the tau decided at the end of round r (tau_next[r]) is tau_used[r + 1] and the
    /clients/steps of every reporter of round r + 1; round 1 runs tau0. Every round has exactly
    ceil(0.4 * 10) = 4 reporters, the clients_participating record, and they differ between rounds."""
    res = load(ref)
    m, c = res.metrics, res.clients
    assert m["tau_used"][0] == TAU0
    assert m["tau_used"][1:].tolist() == m["tau_next"][:-1].tolist()
    reporters = []
    for r in range(1, ROUNDS + 1):
        mine = (c["round"] == r) & (c["dropped"] == 0)
        assert mine.sum() == REPORTERS == m["clients_participating"][r - 1]
        assert (c["steps"][mine] == m["tau_used"][r - 1]).all(), r
        reporters.append(tuple(c["client"][mine].tolist()))
    assert len(set(reporters)) > 1


def test_cumulative_records_are_running_sums(ref):
    """local_iters_cum is the running sum of tau_used (local iterations per client so far), and
    sim_time the running sum of sim_time_round: the loop adds each round's duration to the total in
    order, which is what cumsum does, so the equality is exact. Simulated rounds take time."""
    m = load(ref).metrics
    assert m["local_iters_cum"].tolist() == np.cumsum(m["tau_used"]).tolist()
    assert np.array_equal(m["sim_time"], np.cumsum(m["sim_time_round"]))
    assert (m["sim_time_round"] > 0).all()


def test_G4_B5_killed_on_two_ranks_resumed_on_one_is_bitwise(ref, tmp_path, capsys):
    """Spec B5 / G4: killed on 2 ranks in the server phase of round 11 (loop index 10), where the second
    change of tau is decided, and resumed as one process from the checkpoint after round 10 (every 2
    rounds): tau is already halved there, and the decision of round 11 needs the checkpointed EMA
    pools, C history and minimum trackers. The run ends bitwise equal to the uninterrupted one: final
    model, every metric (tau trajectory and C included), every client record, and the same
    /controller_events table."""
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    p = hpcfl("run", str(job), "--out", str(tmp_path / "out"), ranks=2, env={"HPCFL_FAULT": "0:server:10:kill"})
    assert p.returncode != 0
    capsys.readouterr()
    assert run_here(job, tmp_path / "out") == 0
    assert "resuming from ckpt" in capsys.readouterr().out
    assert_same_run(ref, tmp_path / "out")
    a, b = load(ref), load(tmp_path / "out")
    assert a.events is not None and a.events.tobytes() == b.events.tobytes()
    # what the resume had to carry: tau changed before round 11 and again at its end
    assert a.metrics["tau_used"][10] != TAU0 and a.metrics["tau_next"][10] != a.metrics["tau_used"][10]
