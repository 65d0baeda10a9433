"""srun starting N separate 1-rank worlds: recognised from Slurm's environment, every task exits 2
before --out is touched; the legitimate launches are left alone. (Under a real Slurm:
tests/e2e/test_slurm_cluster.py.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcfl.parallel import launch

ROOT = Path(__file__).resolve().parents[2]

# What Slurm 22.05 puts in each process's environment (seen on the test cluster; see
# slurm/README.md): the batch shell of an --ntasks=2 job, a task of `srun -n 2`, a task of
# `srun -n 1` in that allocation, and a rank that mpiexec started inside it (hydra launches its
# proxies with a 1-task srun step).
BATCH_SHELL = {"SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_PROCID": "0"}
SRUN_2 = {"SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "SLURM_STEP_ID": "0"}
SRUN_1 = {"SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "SLURM_STEP_ID": "1"}
MPIEXEC_IN_ALLOC = {"SLURM_NTASKS": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0", "PMI_RANK": "1"}


@pytest.mark.parametrize("env, world, fires", [
    ({}, 1, False),                         # no Slurm at all
    (BATCH_SHELL, 1, False),                # hpcfl run straight in the batch script: one process
    (SRUN_1, 1, False),                     # srun -n 1 inside a larger allocation
    (MPIEXEC_IN_ALLOC, 2, False),           # mpiexec -n 2 inside the allocation: one world of 2
    (SRUN_2, 2, False),                     # srun --mpi=pmi2 -n 2: one world of 2
    (SRUN_2, 1, True),                      # srun -n 2 without PMI: two worlds of 1
    ({**SRUN_2, "SLURM_STEP_NUM_TASKS": "16"}, 1, True),
    ({**SRUN_2, "HPCFL_INDEPENDENT_TASKS": "1"}, 1, False),   # meant as separate runs
    ({**SRUN_2, "HPCFL_INDEPENDENT_TASKS": "0"}, 1, True),
    ({**SRUN_2, "SLURM_PTY_PORT": "41027"}, 1, False),       # a shell from srun -n 2 --pty bash
    ({"SLURM_STEP_NUM_TASKS": "x"}, 1, False),                # not Slurm's: ignored
    ({"SLURM_STEP_NUM_TASKS": ""}, 1, False),
])
def test_split_world_only_for_n_tasks_each_alone(env, world, fires):
    msg = launch.split_world(world, env)
    assert (msg is not None) == fires
    if fires:
        n = env["SLURM_STEP_NUM_TASKS"]
        assert f"Slurm started {n} tasks" in msg and f"SLURM_STEP_NUM_TASKS={n}" in msg
        assert "--mpi=pmi2" in msg and "--mpi=pmix" in msg and "HPCFL_MPI" in msg
        assert "mpiexec -n $SLURM_NTASKS" in msg and "HPCFL_INDEPENDENT_TASKS=1" in msg


def test_step_tasks():
    assert launch.step_tasks({}) is None
    assert launch.step_tasks({"SLURM_STEP_NUM_TASKS": "3"}) == 3
    assert launch.step_tasks({"SLURM_STEP_NUM_TASKS": "0"}) is None
    assert launch.step_tasks(BATCH_SHELL) is None


def test_first_task():
    assert launch.first_task({}) and launch.first_task(SRUN_1)
    assert not launch.first_task(SRUN_2)


def _hpcfl(args, env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMI_", "HPCFL_INDEPENDENT"))}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "mpi4py", "-m", "hpcfl", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("cmd, procid", [("run", "0"), ("run", "1"), ("sweep", "0")])
def test_run_and_sweep_stop_with_exit_2_before_touching_out(tmp_path, cmd, procid):
    """What each task of `srun -n 2` without PMI gets: exit 2; only task 0 says why; no --out."""
    job = ROOT / "jobs" / ("quickstart.toml" if cmd == "run" else "sweep_quickstart.toml")
    p = _hpcfl([cmd, str(job), "--out", str(tmp_path / "out")], {**SRUN_2, "SLURM_PROCID": procid}, tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert ("Slurm started 2 tasks" in p.stderr) == (procid == "0"), p.stderr
    if procid == "0":
        assert "Stopped before touching --out." in p.stderr
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "runs").exists()


def test_info_warns_and_reports(tmp_path):
    p = _hpcfl(["info"], {**SRUN_2, "SLURM_PROCID": "0"}, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "ranks: 1" in p.stdout and "Slurm started 2 tasks" in p.stderr


def test_independent_tasks_run(tmp_path):
    """The opt-out: the task runs its job (checked up to the config error it then meets)."""
    bad = tmp_path / "job.toml"
    bad.write_text((ROOT / "jobs" / "quickstart.toml").read_text().replace("rounds = 30", "rounds = -1"))
    env = {**SRUN_2, "SLURM_PROCID": "0", "HPCFL_INDEPENDENT_TASKS": "1"}
    p = _hpcfl(["run", str(bad), "--out", str(tmp_path / "out")], env, tmp_path)
    assert p.returncode == 2 and "Slurm started" not in p.stderr and "run.rounds" in p.stderr, p.stderr
