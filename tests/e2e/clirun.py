"""Run the real CLI in subprocesses, and compare results files bitwise."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from hpcfl.results import load

ROOT = Path(__file__).resolve().parents[2]


def command(*args, ranks=0):
    cmd = [sys.executable, "-m", "mpi4py", "-m", "hpcfl", *args]
    return ["mpiexec", "-n", str(ranks), *cmd] if ranks else cmd


def hpcfl(*args, ranks=0, timeout=120, env=None):
    """Run to completion; the result has .returncode, .stdout, .stderr, .seconds, .ended (wall time)."""
    t = time.perf_counter()
    p = subprocess.run(command(*args, ranks=ranks), capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                       env={**os.environ, **(env or {})})
    p.seconds, p.ended = time.perf_counter() - t, time.time()
    return p


def start(*args, ranks=0, env=None):
    """Start in the background (own process group, so a test can signal it)."""
    return subprocess.Popen(command(*args, ranks=ranks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, **(env or {})}, start_new_session=True)


def kill_group(p, sig=signal.SIGKILL):
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass


def assert_same_run(a_dir, b_dir):
    """Final model, every metric but timings, every client record: bitwise equal."""
    a, b = load(a_dir), load(b_dir)
    assert a.attrs["status"] == b.attrs["status"] == "finished"
    assert a.final_params.tobytes() == b.final_params.tobytes(), "final model differs"
    assert set(a.metrics) == set(b.metrics)
    for k in a.metrics:
        if not k.startswith("time_"):
            assert np.array_equal(a.metrics[k], b.metrics[k], equal_nan=True), f"metrics/{k} differs"
    for k in a.clients:
        assert np.array_equal(a.clients[k], b.clients[k], equal_nan=True), f"clients/{k} differs"


def reference_run(tmp_path_factory, job_text: str, name: str = "ref"):
    """Run ``job_text`` once, uninterrupted, into ``<tmp>/out``; returns the tmp folder."""
    d = tmp_path_factory.mktemp(name)
    (d / "job.toml").write_text(job_text)
    p = hpcfl("run", str(d / "job.toml"), "--out", str(d / "out"))
    assert p.returncode == 0, p.stderr
    return d


def digits_job(name: str, seed: int, rounds: int, extra: str = "") -> str:
    """A small FedAvg job on the embedded digits (6 Dirichlet clients, MLP 16, 4 per round, one
    thread, progress lines) as TOML text, ``extra`` appended: the run the safety and hostile-input
    tests start, stop and edit."""
    return f"""
[run]
name = "{name}"
seed = {seed}
rounds = {rounds}
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 6
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "fedavg"
clients_per_round = 4
lr = 0.05
local_steps = 4
[runtime]
threads = 1
progress = "line"
""" + extra
