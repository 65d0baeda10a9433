"""The command line end to end: results schema, input errors on every rank, safety."""

import json
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from hpcfl import config
from hpcfl.results import load

# runtime.device = "auto": the node's first GPU where there is one (every rank of a one-GPU node shares it)
DEVICE = "cuda:0" if torch.cuda.is_available() else "cpu"

ROOT = Path(__file__).resolve().parents[2]
SMALL_JOB = """
[run]
name = "e2e"
seed = 5
rounds = 4
eval_every = 2
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 6
[data.dirichlet]
alpha = 0.5
[model]
name = "mlp"
[model.mlp]
hidden = [8]
[algorithm]
name = "scaffold"
clients_per_round = 4
lr = 0.1
local_steps = 3
[runtime]
threads = 1
"""


def hpcfl(*args, ranks=0, timeout=120):
    cmd = [sys.executable, "-m", "mpi4py", "-m", "hpcfl", *args]
    if ranks:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    p.seconds = time.perf_counter() - t
    return p


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    d = tmp_path_factory.mktemp("run")
    job = d / "job.toml"
    job.write_text(SMALL_JOB)
    p = hpcfl("run", str(job), "--out", str(d / "out"), "--set", "algorithm.lr=0.05")
    assert p.returncode == 0, p.stderr
    return d, p


def test_results_schema(finished):
    d, p = finished
    path = d / "out" / "results.h5"
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == b"finished"   # fixed-size bytes (schema 3)
        cfg = json.loads(f.attrs["config"])
        assert cfg["algorithm"]["lr"] == 0.05 and cfg["algorithm"]["local"] == "scaffold"
        assert config.from_dict(cfg).digest() == f.attrs["config_sha256"]
        versions = json.loads(f.attrs["versions"])
        assert {"hpcfl", "torch", "numpy", "h5py", "mpi4py", "mpi"} <= set(versions)
        assert f.attrs["world_size"] == 1 and json.loads(f.attrs["devices"]) == [DEVICE] and f.attrs["seed"] == 5
        m = f["metrics"]
        expected = {"round", "train_loss", "test_accuracy", "test_loss", "clients_participating",
                    "global_train_loss", "global_train_accuracy", "lr", "tau_eff", "sim_time", "sim_time_round",
                    "time_decide", "time_train", "time_reduce", "time_server", "time_eval", "time_round",
                    "nova_tau_eff", "nova_chi2", "nova_slowdown", "nova_A", "nova_B", "nova_C"}
        assert set(m) == expected
        for name in expected:
            assert m[name].shape == (4,) and m[name].maxshape == (None,)
            assert m[name].attrs["unit"] and len(m[name].attrs["description"]) > 10   # self-describing
        assert m["round"].dtype == np.int64 and m["round"][()].tolist() == [1, 2, 3, 4]
        acc = m["test_accuracy"][()]
        assert np.isnan(acc[0]) and np.isnan(acc[2]) and 0 < acc[1] <= 1 and 0 < acc[3] <= 1
        assert m["clients_participating"][()].tolist() == [4, 4, 4, 4]
        assert m["lr"][()].tolist() == [0.05] * 4
        assert m["tau_eff"][()].tolist() == [3.0] * 4      # implicit sum p ||a||_1 of 3 plain SGD steps
        assert m["sim_time"][()].tolist() == [0.0] * 4     # no [system] clock
        assert np.isnan(m["global_train_loss"][()]).all()  # run.eval_train is off
        c = f["clients"]
        assert set(c) == {"round", "client", "steps", "weight", "train_loss", "anorm", "anorm2", "alast", "sim_time",
                          "dropped"}
        assert c["sim_time"].attrs["unit"] == "s" and c["steps"].attrs["unit"] == "steps"
        assert c["round"].shape == (16,) and c["steps"][()].tolist() == [3] * 16
        assert c["anorm"][()].tolist() == [3.0] * 16 and c["dropped"][()].tolist() == [0] * 16
        assert c["round"][()].tolist() == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
        for r in range(1, 5):
            w = c["weight"][()][c["round"][()] == r]
            assert abs(w.sum() - 1) < 1e-12
        counts = f["partition/class_counts"][()]
        # digits: 1797 images, 25% held out for the test set -> 1347 training samples.
        assert counts.shape == (6, 10) and counts.dtype == np.int64 and counts.sum() == 1347
        names = [n.decode() for n in f["final/param_names"][()]]
        assert names == ["param:body.1.weight", "param:body.1.bias", "param:fc.weight", "param:fc.bias"]
        shapes = json.loads(f["final"].attrs["shapes"])
        assert shapes == [[8, 64], [8], [10, 8], [10]]
        assert f["final/params"].dtype == np.float32 and f["final/params"].shape == (8 * 64 + 8 + 10 * 8 + 10,)
        assert json.loads(f["final"].attrs["input_shape"]) == [1, 8, 8] and f["final"].attrs["num_classes"] == 10
        assert f.attrs["schema_version"] == 3
        assert f["segments/start_round"][()].tolist() == [1] and f["segments/world_size"][()].tolist() == [1]


def test_reader_and_state_dict_load_the_model(finished):
    import torch

    from hpcfl import models

    d, _ = finished
    res = load(d / "out")
    assert res.metrics["round"].tolist() == [1, 2, 3, 4]
    cfg = config.from_dict(res.config)
    net = models.build_model("mlp", cfg.model_options, (1, 8, 8), 10)
    missing = net.load_state_dict(res.state_dict(), strict=True)
    assert not missing.missing_keys
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    assert flat.tobytes() == res.final_params.tobytes()


def test_results_model_evaluates_to_the_recorded_final_accuracy(finished):
    import torch

    from hpcfl import data

    d, _ = finished
    res = load(d / "out")
    net = res.model()
    assert not net.training
    cfg = config.from_dict(res.config)
    ds = data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed)
    with torch.no_grad():
        pred = net(torch.from_numpy(ds.x_test).float()).argmax(1).numpy()
    correct = int((pred == ds.y_test).sum())
    assert correct / len(ds.y_test) == res.metrics["test_accuracy"][-1]     # exact: a count over the same set


def test_one_round_convention_in_file_console_and_checkpoint_names(finished):
    d, p = finished
    res = load(d / "out")
    acc = res.metrics["test_accuracy"]
    rows = dict(zip(res.metrics["round"].tolist(), acc.tolist()))
    # the console's "round 2/4 ... test_acc A" is the file's row round == 2 (evaluated every 2 rounds)
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("round 2/4"))
    assert f"test_acc {rows[2]:.4f}" in line and np.isnan(rows[1])
    best = int(res.metrics["round"][np.nanargmax(acc)])
    assert f"(round {best})" in p.stdout                    # the summary's best round, same numbering
    # the checkpoint written after the last round is named by the rounds done: the file's last row
    assert sorted(x.name for x in (d / "out" / "checkpoints").glob("ckpt-*.h5"))[-1] == "ckpt-00000004.h5"
    assert res.metrics["round"][-1] == 4


def test_progress_and_summary_are_printed(finished):
    _, p = finished
    assert p.stdout.count("round ") >= 4 and "final test accuracy" in p.stdout and "wall time" in p.stdout


def test_existing_results_are_never_overwritten_without_force(finished):
    d, _ = finished
    before = (d / "out" / "results.h5").read_bytes()
    p = hpcfl("run", str(d / "job.toml"), "--out", str(d / "out"))
    assert p.returncode == 2 and "--force" in p.stderr
    assert (d / "out" / "results.h5").read_bytes() == before


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize(
    "override,key",
    [("algorithm.lr=-1", "algorithm.lr"), ("data.num_clients=0", "data.num_clients"),
     ("algorithm.name=fedmagic", "algorithm.name"), ("algorithm.clients_per_round=7", "algorithm.clients_per_round"),
     ("run.bogus=1", "run.bogus")],
)
def test_config_error_exits_2_on_every_rank_printed_once(tmp_path, ranks, override, key):
    job = tmp_path / "job.toml"
    job.write_text(SMALL_JOB)
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"), "--set", override, ranks=ranks, timeout=60)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.count("config error") == 1 and key in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and "Abort" not in p.stderr
    assert p.seconds < 30
    assert not (tmp_path / "o" / "results.h5").exists()


def test_more_ranks_than_clients_is_a_clear_error(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(SMALL_JOB)
    p = hpcfl("run", str(job), "--out", str(tmp_path / "o"), "--set", "data.num_clients=2",
              "--set", "algorithm.clients_per_round=0", ranks=3, timeout=60)
    assert p.returncode == 2 and "3 MPI ranks" in p.stderr and "start at most 2 ranks" in p.stderr
    assert p.stderr.count("config error") == 1


def test_info_lists_ranks_devices_and_versions():
    p = hpcfl("info", ranks=2, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "ranks: 2" in p.stdout and "rank 1:" in p.stdout and f"device {DEVICE}," in p.stdout
    assert "mpi: MPICH" in p.stdout and "torch:" in p.stdout
    assert "cpu pooling kernels: C, " in p.stdout and "/kernels/pool-" in p.stdout   # this machine has gcc
    assert "cpu group kernels (vectorised logreg, quadratic): C, " in p.stdout and "/kernels/fused-" in p.stdout


NO_TORCH = """
import runpy, sys
sys.argv = ["hpcfl", *sys.argv[1:]]
try:
    runpy.run_module("hpcfl", run_name="__main__")
except SystemExit as exc:
    code = exc.code
print(f"@@ exit {code} torch {'torch' in sys.modules}", file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["sweep", "--help"], ["--version"],
                                  ["config", "jobs/quickstart.toml", "--set", "algorithm.name=afl"],
                                  ["config", "--defaults", "model.vgg11"], ["report", "{out}"]])
def test_help_config_and_report_do_not_import_torch(finished, args):
    """Importing torch takes 1-2 s of an idle core (6-8 s on a busy one): answering --help,
    printing a job or reading results needs none of it (checked in a fresh interpreter)."""
    d, _ = finished
    args = [a.replace("{out}", str(d / "out")) for a in args]
    p = subprocess.run([sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "@@ exit 0 torch False" in p.stderr, (p.stdout, p.stderr)


def test_version():
    from hpcfl import __version__

    p = hpcfl("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"hpcfl {__version__}"
