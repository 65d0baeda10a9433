"""hpcfl.run (docs/python.md): the same run as `hpcfl run`, bitwise, on 1 and 2 ranks; called twice in
one process; a callback that raises stops the run with results.h5 and a checkpoint intact, and the
run resumes bitwise; the docs' example script runs as written."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from clirun import ROOT, hpcfl

import hpcfl as api
from hpcfl.errors import CallbackError
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.results import load

# SCAFFOLD: per-client rows and server state go through the checkpoint; per-client evaluation is on.
JOB = """
[run]
name = "api"
seed = 4
rounds = 6
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 6
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "scaffold"
clients_per_round = 4
lr = 0.05
local_steps = 4
[runtime]
threads = 1
progress = "none"
"""

# The only arrays allowed to differ: wall-clock times, and where each start ran (ranks, devices, versions).
WALL_CLOCK = re.compile(r"^metrics/time_|^segments/(started|world_size|devices|versions)$")


def arrays(out: Path, resumed: bool = False) -> dict:
    """Every dataset of ``out``/results.h5 as raw bytes with its dtype and shape, wall-clock columns aside
    (``resumed``: and the rounds each start began at)."""
    got = {}
    with h5py.File(out / "results.h5", "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and not WALL_CLOCK.search(name) and \
                    not (resumed and name == "segments/start_round"):
                a = np.asarray(obj[()])
                got[name] = (str(a.dtype), a.shape, repr(a.tolist()) if a.dtype == object else a.tobytes())
        f.visititems(visit)
    return got


def assert_same_arrays(a: Path, b: Path, resumed: bool = False) -> None:
    x, y = arrays(a, resumed), arrays(b, resumed)
    assert sorted(x) == sorted(y)
    different = [k for k in x if x[k] != y[k]]
    assert not different, different


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
    """The job through `hpcfl run`, on 1 rank and on 2 ranks."""
    d = tmp_path_factory.mktemp("cli")
    (d / "job.toml").write_text(JOB)
    for ranks, name in ((0, "one"), (2, "two")):
        p = hpcfl("run", str(d / "job.toml"), "--out", str(d / name), ranks=ranks)
        assert p.returncode == 0, p.stderr
    return d


def test_the_api_and_hpcfl_run_write_the_same_arrays_on_1_and_2_ranks(cli_runs, tmp_path):
    res = api.run(JOB, out=tmp_path / "one")   # TOML text, in this process, one rank
    assert res.outcome == "finished" and res.status == "finished"
    script = tmp_path / "two.py"
    script.write_text(textwrap.dedent(f"""
        import hashlib, pathlib
        from mpi4py import MPI
        import hpcfl
        res = hpcfl.run({str(cli_runs / "job.toml")!r}, out={str(tmp_path / "two")!r})
        said = [res.outcome, res.attrs["world_size"], hashlib.sha256(res.final_params.tobytes()).hexdigest(),
                res.metrics["test_accuracy"].tolist(), res.clients["client"].tolist()]
        pathlib.Path({str(tmp_path)!r}, f"rank{{MPI.COMM_WORLD.rank}}.txt").write_text(repr(said))
    """))
    p = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "mpi4py", str(script)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    said = [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert said[0] == said[1] and said[0].startswith("['finished', 2, ")   # every rank's return is the same
    for out in ("one", "two"):
        assert_same_arrays(cli_runs / "one", tmp_path / out)
    assert_same_arrays(cli_runs / "one", cli_runs / "two")
    # what the call returned is the file: its metrics, final model and (read when first used) client rows
    ref = load(cli_runs / "one")
    assert res.final_params.tobytes() == ref.final_params.tobytes()
    assert set(res.clients) == set(ref.clients) and res.clients.rows == len(ref.clients["client"])
    for name in ref.clients:
        assert np.array_equal(res.clients[name], ref.clients[name], equal_nan=True), name
    for name in ref.client_eval:
        assert np.array_equal(res.client_eval[name], ref.client_eval[name], equal_nan=True), name


def test_twice_in_one_process_and_a_callback_that_raises(cli_runs, tmp_path):
    seen = []
    first = api.run(JOB, out=tmp_path / "a", callbacks=seen.append)
    assert first.outcome == "finished"
    assert [e.kind for e in seen] == ["start"] + ["round", "eval"] * 6 + ["end"]
    assert seen[0].start_round == 0 and seen[0].rounds == 6 and seen[0].world_size == 1 and seen[-1].status == "finished"
    again = api.run(JOB, out=tmp_path / "a", callbacks=seen.append)     # a notebook cell run twice
    assert again.outcome == "already finished" and len(seen) == 14      # nothing ran, no event
    assert_same_arrays(cli_runs / "one", tmp_path / "a")

    def fails_in_round_3(event):
        if event.kind == "round" and event.round == 3:
            raise ValueError("the tracker is down")

    out = tmp_path / "b"
    ends = []
    with pytest.raises(CallbackError) as err:
        api.run(JOB, out=out, callbacks=[fails_in_round_3, lambda e: e.kind == "end" and ends.append(e)])
    e = err.value
    assert "fails_in_round_3" in e.callback and "ValueError: the tracker is down" in str(e)
    assert "stopped after round 3 with a checkpoint" in str(e) and e.exit_code == 1
    assert isinstance(e.__cause__, ValueError)
    assert [x.status for x in ends] == ["stopped"]                     # the other callbacks saw the end
    stopped = load(out)                                                # results.h5 intact, rounds 1-3 in it
    assert stopped.status == "running" and stopped.metrics["round"].tolist() == [1, 2, 3]
    latest = CheckpointStore(out / "checkpoints").load_latest()        # a whole, verified checkpoint of round 3
    assert latest is not None and latest.round == 3
    resumed = api.run(JOB, out=out)
    assert resumed.outcome == "finished" and [g["start_round"] for g in resumed.segments] == [1, 4]
    assert_same_arrays(cli_runs / "one", out, resumed=True)


# ---- the docs' example -----------------------------------------------------------------------------

def example() -> str:
    text = (ROOT / "docs" / "python.md").read_text()
    return text.split("<!-- example: lr_sweep.py -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_docs_example_runs_as_written(tmp_path):
    for d in ("one", "two"):
        (tmp_path / d / "jobs").mkdir(parents=True)
        (tmp_path / d / "jobs" / "quickstart.toml").write_text((ROOT / "jobs" / "quickstart.toml").read_text())
        (tmp_path / d / "lr_sweep.py").write_text(example())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def sweep(where, *launcher):
        p = subprocess.run([*launcher, sys.executable, *(["-m", "mpi4py"] if launcher else []), "lr_sweep.py"], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path / where, env=env)
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout

    out = sweep("one")
    assert len(re.findall(r"^    round +\d+: train loss [\d.]+, test accuracy [\d.]+$", out, re.M)) == 30
    table = out.rsplit("best round", 1)[1].split("\n")[2:5]
    for lr, line in zip((0.02, 0.05, 0.1), table):
        acc = load(tmp_path / "one" / "runs" / "lr_sweep" / f"lr-{lr}").metrics["test_accuracy"]
        assert line.split() == [f"{lr:.2f}", "finished", f"{acc[-1]:.4f}", f"{acc.max():.4f}",
                                str(int(np.argmax(acc)) + 1)]
    again = sweep("one")                              # run again: every run is found finished
    assert again.count("is already finished (10 rounds); nothing to do") == 3 and "    round" not in again
    assert again.rsplit("best round", 1)[1] == out.rsplit("best round", 1)[1]
    ranks2 = sweep("two", "mpiexec", "-n", "2")       # two ranks: the same table, printed once
    assert ranks2.count("best round") == 1 and ranks2.count("2 rank(s)") == 3
    assert ranks2.rsplit("best round", 1)[1] == out.rsplit("best round", 1)[1]


def test_the_readme_python_snippet_runs_as_written(tmp_path):
    code = (ROOT / "README.md").read_text().split("**From Python**", 1)[1].split("```python\n", 1)[1].split("```")[0]
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "quickstart.toml").write_text((ROOT / "jobs" / "quickstart.toml").read_text())
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-3000:]
    res = load(tmp_path / "runs" / "lr01")
    assert res.config["algorithm"]["lr"] == 0.1
    lines = p.stdout.splitlines()
    assert lines[-1] == f"finished {res.metrics['test_accuracy'][-1]}"
    assert [ln.split()[0] for ln in lines if re.fullmatch(r"\d+ [\d.]+", ln)] == [str(r) for r in range(1, 31)]


def test_after_a_failed_write_the_process_refuses_a_new_run(tmp_path):
    """A full disk (a file size limit) in round 1: WriteError; HDF5 is unsafe in that process from then
    on, so a second call is refused with a clear message instead of crashing; a new process resumes."""
    (tmp_path / "job.toml").write_text(JOB)
    code = textwrap.dedent(f"""
        import os, resource, sys
        from mpi4py import MPI
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        import hpcfl
        job, out = {str(tmp_path / "job.toml")!r}, {str(tmp_path / "out")!r}
        try:
            hpcfl.run(job, out=out, overrides={{"results.flush_seconds": 0}})
        except hpcfl.errors.WriteError as e:
            print("@@ first", e.exit_code, flush=True)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        try:
            hpcfl.run(job, out=out)
        except hpcfl.errors.HpcflError as e:
            print("@@ second", type(e).__name__, e, flush=True)
        os._exit(0)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    said = [ln for ln in p.stdout.splitlines() if ln.startswith("@@")]
    assert p.returncode == 0 and said[0] == "@@ first 74", (p.stdout[-2000:], p.stderr[-2000:])
    assert said[1].startswith(f"@@ second HpcflError a write in {tmp_path / 'out'} failed earlier in this process")
    assert "restart the kernel" in said[1]
    again = hpcfl("run", str(tmp_path / "job.toml"), "--out", str(tmp_path / "out"))   # a new process: runs
    assert again.returncode == 0, again.stderr
