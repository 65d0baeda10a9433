"""A FedGSNR run (with SCAFFOLD's per-client state and FedDisco weights) killed and resumed
on another rank count ends bitwise equal to the uninterrupted run; its records carry units."""


import h5py
import numpy as np
import pytest
from clirun import assert_same_run, hpcfl, reference_run

JOB = """
[run]
name = "gsnr_resume"
seed = 2
rounds = 8
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 7
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "scaffold"
steps = "gsnr"
weights = "disco"
clients_per_round = 5
lr = 0.05
local_steps = 6
server_momentum = 0.5
[runtime]
threads = 1
[checkpoint]
every = 2
"""


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(tmp_path_factory, JOB, "gsnr_ref") / "out"


@pytest.mark.parametrize("phase,rnd,ranks,resume_ranks", [("decide", 5, 0, 2), ("train", 3, 2, 3)])
def test_killed_in_a_phase_resumes_bitwise_on_another_rank_count(ref, tmp_path, phase, rnd, ranks, resume_ranks):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    p = hpcfl("run", str(job), "--out", str(tmp_path / "out"), ranks=ranks,
              env={"HPCFL_FAULT": f"0:{phase}:{rnd}:kill"})
    assert p.returncode != 0
    p = hpcfl("run", str(job), "--out", str(tmp_path / "out"), ranks=resume_ranks, timeout=180)
    assert p.returncode == 0, p.stderr
    assert "resuming from ckpt" in p.stdout
    assert_same_run(ref, tmp_path / "out")
    with h5py.File(ref / "results.h5", "r") as a, h5py.File(tmp_path / "out" / "results.h5", "r") as b:
        assert a["clients_summary/gsnr_median"][()].tobytes() == b["clients_summary/gsnr_median"][()].tobytes()


def test_gsnr_records_and_contribution_score(ref):
    with h5py.File(ref / "results.h5", "r") as f:
        for name in ("clients/gsnr", "clients/gsnr_nopt", "clients/gsnr_M", "clients/gsnr_N", "metrics/gsnr_L",
                     "metrics/gsnr_entropy", "metrics/gsnr_sum_steps", "clients/disco_d"):
            assert f[name].attrs["unit"] and f[name].attrs["description"]
        assert f["metrics/gsnr_sum_steps"][()].tolist() == [5 * 6] * 8
        ids, g = f["clients/client"][()], f["clients/gsnr"][()]
        med = f["clients_summary/gsnr_median"][()]
        for c in range(7):   # the median over the rounds the client took part in
            assert med[c] == np.median(g[ids == c]) if (ids == c).any() else np.isnan(med[c])
