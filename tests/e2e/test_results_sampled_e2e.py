"""results.clients = "sampled" in real runs: the file's /clients rows are exactly the rows an "all" run
of the same job writes for the panel's clients, bitwise, round by round; a run stopped after a
checkpoint resumes to the same file; a resume cannot change the panel (tests/unit/test_results_sampled.py
covers the panel and the writer)."""

import h5py
import numpy as np
import pytest

import hpcfl
from hpcfl.errors import CallbackError, HpcflError
from hpcfl.io.panel import client_panel
from hpcfl.results import load

JOB = {"run": {"name": "sampled", "seed": 4, "rounds": 4, "eval_every": 2},
       "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 300,
                "quadratic": {"num_clients": 300, "dim": 2, "std": 0.1}},
       "model": {"name": "quadratic"},
       "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 1, "clients_per_round": 60},
       "runtime": {"dtype": "float64", "threads": 1, "progress": "none", "vectorize": "on"},
       "checkpoint": {"every": 1}}
SAMPLED = {"results.clients": "sampled", "results.client_sample": 0.05}   # a panel of 15 of the 300


def columns(res) -> dict:
    return {k: np.asarray(v) for k, v in res.clients.items()}


def test_the_rows_are_the_all_runs_rows_of_the_panel_and_a_stopped_run_resumes_to_them(tmp_path):
    every = hpcfl.run(JOB, out=tmp_path / "all")
    sampled = hpcfl.run(JOB, out=tmp_path / "sampled", overrides=SAMPLED)
    panel = client_panel(4, 300, 0.05)
    assert len(panel) == 15 and sampled.panel.tolist() == panel.tolist()
    a, s = columns(every), columns(sampled)
    assert len(a["round"]) == 4 * 60
    rows = 0
    for r in (1, 2, 3, 4):   # each round: the cohort's members that are in the panel, in the cohort's order
        cohort = a["client"][a["round"] == r]
        mine = s["client"][s["round"] == r]
        assert mine.tolist() == [c for c in cohort.tolist() if c in set(panel.tolist())], r
        rows += len(mine)
    assert 0 < rows < 4 * 60   # some panel clients in some rounds (4 rounds of 60 of 300: 12 expected)
    keep = np.isin(a["client"], panel)
    assert set(s) == set(a)
    for name in a:
        assert s[name].tobytes() == a[name][keep].tobytes(), name   # bitwise the all run's rows
    for name in every.metrics:   # the run itself is the same: only the file's rows differ
        if not name.startswith("time_"):
            assert np.array_equal(sampled.metrics[name], every.metrics[name], equal_nan=True), name
    assert sampled.final_params.tobytes() == every.final_params.tobytes()

    def stop_after_round_2(event):
        if event.kind == "round" and event.round == 2:
            raise RuntimeError("stop here")

    with pytest.raises(CallbackError, match="stopped after round 2"):
        hpcfl.run(JOB, out=tmp_path / "stopped", overrides=SAMPLED, callbacks=[stop_after_round_2])
    with pytest.raises(HpcflError, match='differs in results.client_sample 0.05 -> 0.1'):
        hpcfl.run(JOB, out=tmp_path / "stopped", overrides={**SAMPLED, "results.client_sample": 0.1})
    with pytest.raises(HpcflError, match='differs in results.client_sample 0.05 -> null, '
                                         'results.clients "sampled" -> "all"'):
        hpcfl.run(JOB, out=tmp_path / "stopped")
    resumed = hpcfl.run(JOB, out=tmp_path / "stopped", overrides=SAMPLED)
    assert resumed.segments[-1]["start_round"] == 3
    again = load(tmp_path / "stopped")
    assert again.panel.tolist() == panel.tolist()
    for name in s:
        assert np.asarray(again.clients[name]).tobytes() == s[name].tobytes(), name


def test_every_client_each_round_writes_the_panels_rows_chunked_by_round(tmp_path):
    """Full participation: every round holds the panel's 15 rows, a chunk of 15 rows (not compressed
    under 1,024 rows a round, as a cohort of 15 would not be)."""
    job = {**JOB, "algorithm": {**JOB["algorithm"], "clients_per_round": 0}, "run": {**JOB["run"], "rounds": 2}}
    res = hpcfl.run(job, out=tmp_path / "full", overrides=SAMPLED)
    panel = client_panel(4, 300, 0.05)
    assert np.asarray(res.clients["client"]).tolist() == panel.tolist() * 2
    assert np.asarray(res.clients["round"]).tolist() == [1] * 15 + [2] * 15
    with h5py.File(tmp_path / "full" / "results.h5", "r") as f:
        assert f.attrs["clients_recorded"] == "sampled" and f["clients_panel"][()].tolist() == panel.tolist()
        assert f["clients/steps"].chunks == (1024,)


KILLED_JOB = """
[run]
name = "sampled_kill"
seed = 4
rounds = 4
[data]
dataset = "quadratic"
partition = "natural"
num_clients = 300
[data.quadratic]
num_clients = 300
dim = 2
std = 0.1
[model]
name = "quadratic"
[algorithm]
name = "fedavg"
lr = 0.05
batch_size = 1
clients_per_round = 60
[runtime]
dtype = "float64"
threads = 1
progress = "none"
[checkpoint]
every = 2
[results]
clients = "sampled"
client_sample = 0.05
flush_seconds = 1000
"""


def test_a_killed_sampled_run_resumes_to_the_run_never_stopped(tmp_path):
    """SIGKILL at the start of round 4 (round 3's rows buffered, never written; ckpt-2 on disk): the
    resume keeps rounds 1-2 of the panel's rows and writes 3-4 again, bitwise the uninterrupted run."""
    from clirun import assert_same_run, hpcfl as cli_run

    jobfile = tmp_path / "job.toml"
    jobfile.write_text(KILLED_JOB)
    out, ref = tmp_path / "out", tmp_path / "ref"
    p = cli_run("run", str(jobfile), "--out", str(out), env={"HPCFL_FAULT": "0:decide:3:kill"}, timeout=600)
    assert p.returncode == -9, p.stderr
    assert load(out).metrics["round"].tolist() == [1, 2]   # what ckpt-2 holds; round 3 was in the buffer
    p = cli_run("run", str(jobfile), "--out", str(out), timeout=600)
    assert p.returncode == 0 and "resuming from ckpt-00000002.h5" in p.stdout, p.stderr
    assert cli_run("run", str(jobfile), "--out", str(ref), timeout=600).returncode == 0
    assert_same_run(ref, out)
    a, b = load(ref), load(out)
    assert a.panel.tolist() == b.panel.tolist() == client_panel(4, 300, 0.05).tolist()
    assert b.segments[-1]["start_round"] == 3 and len(b.clients["round"]) == len(a.clients["round"]) > 0
