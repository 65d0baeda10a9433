"""No hangs, guarded inputs, bad configs: every failure ends every rank, quickly and clearly."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from clirun import hpcfl

from hpcfl.results import load

TINY = """
[run]
name = "tiny"
seed = 2
rounds = 4
[data]
dataset = "digits"
partition = "iid"
num_clients = 6
[model]
name = "mlp"
[model.mlp]
hidden = [8]
[algorithm]
name = "fedavg"
lr = 0.05
local_steps = 2
[runtime]
threads = 1
[checkpoint]
every = 1
"""


def tiny(tmp_path, text=TINY):
    (tmp_path / "job.toml").write_text(text)
    return str(tmp_path / "job.toml")


# Rank 0, a middle rank and the last rank of 3; exception, exit and SIGKILL; during local
# training, the reduction and the checkpoint. The fault fires in round 1 (after a full round).
# The 9 cases are a Latin square over (rank, kind) with phase = (rank + kind) mod 3: every
# pair of levels of any two factors occurs once (the full 27-case product took 4 minutes
# of the suite's budget and found nothing the pairs do not).
RANKS, KINDS, PHASES = (0, 1, 2), ("raise", "exit", "kill"), ("train", "reduce", "checkpoint")
DEATHS = [(r, k, PHASES[(r + i) % 3]) for r in RANKS for i, k in enumerate(KINDS)]


@pytest.mark.parametrize("rank, kind, phase", DEATHS)
def test_rank_death_ends_all_ranks_nonzero_within_10_s(tmp_path, rank, kind, phase):
    stamp = tmp_path / "fault_time"
    p = hpcfl("run", tiny(tmp_path), "--out", str(tmp_path / "o"), ranks=3, timeout=120,
              env={"HPCFL_FAULT": f"{rank}:{phase}:1:{kind}", "HPCFL_FAULT_STAMP": str(stamp)})
    assert p.returncode != 0
    assert stamp.exists(), p.stdout + p.stderr           # the fault did fire
    assert p.ended - float(stamp.read_text()) < 10, "ranks lingered after the failure"


def test_watchdog_aborts_a_stuck_rank_and_names_it(tmp_path):
    stamp = tmp_path / "fault_time"
    p = hpcfl("run", tiny(tmp_path), "--out", str(tmp_path / "o"), "--set", "watchdog.timeout_s=2", ranks=2,
              timeout=120, env={"HPCFL_FAULT": "1:train:1:hang", "HPCFL_FAULT_STAMP": str(stamp)})
    assert p.returncode != 0
    assert "rank 1 stuck in phase 'train' of round 2" in p.stderr   # HPCFL_FAULT counts from 0
    assert p.ended - float(stamp.read_text()) < 10


def test_nonfinite_updates_are_skipped_and_recorded_never_averaged(tmp_path):
    out = tmp_path / "o"
    p = hpcfl("run", tiny(tmp_path), "--out", str(out), "--set", "algorithm.lr=1e30", "--set", "guard.policy=skip")
    assert p.returncode == 0, p.stderr
    r = load(out)
    assert r.metrics["clients_participating"].tolist() == [0, 0, 0, 0]
    assert set(r.clients["dropped"].tolist()) == {5}
    assert np.isfinite(r.final_params).all()


def test_nonfinite_update_stops_the_run_with_exit_3_and_names_client(tmp_path):
    p = hpcfl("run", tiny(tmp_path), "--out", str(tmp_path / "o"), "--set", "algorithm.lr=1e30", ranks=2)
    assert p.returncode == 3
    assert "round 1" in p.stderr and "client" in p.stderr and "NaN or Inf" in p.stderr
    assert p.stderr.count("stopped by the guard") == 1


def test_norm_bound_skips_large_updates(tmp_path):
    out = tmp_path / "o"
    p = hpcfl("run", tiny(tmp_path), "--out", str(out), "--set", "guard.max_norm=1e-9", "--set", "guard.policy=skip")
    assert p.returncode == 0, p.stderr
    r = load(out)
    assert (r.clients["dropped"] == 5).all() and (r.metrics["clients_participating"] == 0).all()
    first = hpcfl("run", tiny(tmp_path), "--out", str(tmp_path / "r1"), "--set", "run.rounds=1",
                  "--set", "algorithm.lr=1e-12")   # a nearly unchanged model, for reference
    assert first.returncode == 0
    assert np.allclose(r.final_params, load(tmp_path / "r1").final_params, atol=1e-9)


BAD = [
    ("algorithm.lr=-0.1", "algorithm.lr"),
    ("algorithm.lr=0", "algorithm.lr"),
    ("algorithm.momentum=1.5", "algorithm.momentum"),
    ("algorithm.batch_size=0", "algorithm.batch_size"),
    ("algorithm.name=fedsomething", "algorithm.name"),
    ("algorithm.local=adam", "algorithm.local"),
    ("algorithm.clients_per_round=100", "algorithm.clients_per_round"),
    ("algorithm.mu=0.5", "algorithm.mu"),
    ("algorithm.sampling=unbiased", "algorithm.sampling"),
    ("data.num_clients=0", "data.num_clients"),
    ("data.dataset=imagenet", "data.dataset"),
    ("data.partition=random", "data.partition"),
    ("data.root=5", "data.root"),
    ("run.rounds=0", "run.rounds"),
    ("run.seed=-1", "run.seed"),
    ("run.rounds='ten'", "run.rounds"),
    ("runtime.device=tpu", "runtime.device"),
    ("runtime.reduce=approx", "runtime.reduce"),
    ("checkpoint.keep=1", "checkpoint.keep"),
    ("guard.policy=ignore", "guard.policy"),
    ("watchdog.timeout_s=-5", "watchdog.timeout_s"),
    ("model.name=gpt", "model.name"),
    ("system.unavailability=2", "system.unavailability"),
    ("runtime.unknown_key=1", "runtime.unknown_key"),
]


def test_twenty_four_bad_configs_each_exit_2_naming_the_key(tmp_path):
    job = tiny(tmp_path)
    # two at a time (the machine's two cores): each is a whole `hpcfl run`, mostly Python start-up
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda bad: hpcfl("run", job, "--out", str(tmp_path / "o"), "--set", bad[0],
                                                timeout=60), BAD))
    for (override, key), p in zip(BAD, runs):
        assert p.returncode == 2, (override, p.stderr)
        assert key in p.stderr and p.stderr.count("config error") == 1, (override, p.stderr)
        assert "Traceback" not in p.stderr
        assert p.seconds < 30
    assert not (tmp_path / "o" / "results.h5").exists()


def test_all_problems_of_one_job_are_reported_at_once_on_every_rank(tmp_path):
    p = hpcfl("run", tiny(tmp_path), "--out", str(tmp_path / "o"), "--set", "algorithm.lr=-1",
              "--set", "run.rounds=0", "--set", "checkpoint.keep=1", ranks=2, timeout=60)
    assert p.returncode == 2 and "3 problems" in p.stderr
    assert all(k in p.stderr for k in ("algorithm.lr", "run.rounds", "checkpoint.keep"))
