"""FedDisco end to end on scikit-learn's digits (E2E-1, E2E-2, E2E-4 of the FedDisco checks):
no worse than FedAvg under full participation, ahead of it under partial participation.

Recipe: 50 test images per class held out (1297 train), pixels / 16, MLP 64-32-10, SGD
lr 0.1, batch 16, E = 2 local epochs, 30 rounds; score = mean test accuracy of the last
5 rounds; Disco = KL to uniform, normalised, a = 0.5, b = 0.1; FedAvg = size weights.
The same seed drives data, init and batches for both (paired comparison).
"""

import numpy as np
import pytest
from mpi4py import MPI
from runner import run_memory

BASE = {
    "run": {"name": "disco", "rounds": 30, "eval_every": 1},
    "data": {"dataset": "digits", "digits": {"test_per_class": 50, "normalize": False},
             "partition": "biased_unbiased"},
    "model": {"name": "mlp", "mlp": {"hidden": [32], "init": "he_normal"}},
    "algorithm": {"name": "fedavg", "lr": 0.1, "batch_size": 16, "local_epochs": 2},
    "runtime": {"threads": 1, "progress": "none"},
}
# digits' classes hold 124-133 training images, so NIID-2's shard is set to fit the smallest
FULL = {"num_clients": 6, "biased_unbiased": {"num_unbiased": 1, "shard": 20}, "per_round": 0}  # 6 x 200
PARTIAL = {"num_clients": 30, "biased_unbiased": {"num_unbiased": 5}, "per_round": 10}          # 30 x 40


def table(setting, seed, weights, **disco):
    t = {k: dict(v) for k, v in BASE.items()}
    t["run"]["seed"] = seed
    t["data"].update(num_clients=setting["num_clients"], biased_unbiased=setting["biased_unbiased"])
    t["algorithm"].update(weights=weights, clients_per_round=setting["per_round"])
    if disco:
        t["algorithm"]["disco"] = disco
    return t


def curve(t):
    _, metrics, clients = run_memory(t, MPI.COMM_SELF)
    return np.array([m["test_accuracy"] for m in metrics]), clients


def paired(setting, seeds=range(5)):
    rows = []
    for seed in seeds:
        avg, _ = curve(table(setting, seed, "size"))
        disco, _ = curve(table(setting, seed, "disco"))
        rows.append((avg, disco))
    return rows


@pytest.mark.slow
@pytest.mark.timeout(900)   # ten runs; minutes on a shared 2-core machine
def test_e2e1_niid2_full_participation_disco_is_no_worse_than_fedavg():
    """Non-inferiority under full participation. With all six clients every round FedDisco changes one
    thing: the unbiased client's weight goes from 1/6 to 8/33 (1.45x; the biased ones from 1/6 to 5/33), so
    the expected effect is a few tenths of a point either way. The FedDisco checks' numpy prototype
    reported +0.61 points on 10 of 10 seeds; here seeds 0-4 gave +0.40, -0.40, -0.28, -0.08, +0.28 (mean
    -0.02), held-out seeds 10-12 +0.40, +0.04, +0.56 (python bench/fidelity_figures.py disco) and a
    review's held-out seeds -0.12, -0.20, -1.00: the gain is not reliably there at this scale, so this
    checks the direction that holds, no loss beyond a margin.
    Margin: 0.5 points on the 5-seed mean (2.5 of the 500 test images) and 1.5 points on any one seed."""
    rows = paired(FULL)
    gains = [100 * (d[-5:].mean() - a[-5:].mean()) for a, d in rows]
    print("E2E-1 gains (pt):", [round(float(g), 2) for g in gains])
    assert np.mean(gains) >= -0.5, gains
    assert min(gains) >= -1.5, gains


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_e2e2_niid2_partial_participation_disco_gains_and_is_steadier():
    """Superiority under partial participation (10 of 30 clients a round, 5 unbiased): FedDisco is ahead on
    every seed and by at least 0.5 points on the mean over seeds 0-4, and its accuracy varies less over the
    last 10 rounds. Measured: +1.16, +1.52, +2.52, +2.88, +1.20 (mean +1.86); held-out seeds 10-12 (python
    bench/fidelity_figures.py disco) +1.08, +1.20, +0.60 (mean +0.96)."""
    rows = paired(PARTIAL)
    gains = [100 * (d[-5:].mean() - a[-5:].mean()) for a, d in rows]
    std_avg = np.mean([a[-10:].std() for a, _ in rows])
    std_disco = np.mean([d[-10:].std() for _, d in rows])
    print("E2E-2 gains (pt):", [round(float(g), 2) for g in gains], "std last 10:", std_avg, std_disco)
    assert np.mean(gains) >= 0.5, gains
    assert min(gains) > 0, gains
    assert std_disco <= std_avg


def test_e2e4_a_zero_is_fedavg_bitwise_in_niid2():
    # NIID-2 clients all hold 200 samples: with a = 0 the weights are uniform, i.e. FedAvg's
    avg, _ = curve(table(FULL, 0, "size"))
    zero, clients = curve(table(FULL, 0, "disco", a=0.0))
    assert avg.tobytes() == zero.tobytes()
    assert np.allclose(clients[0]["weight"], 1 / 6, rtol=0, atol=1e-15)


def test_disco_weights_recorded_and_biased_clients_down_weighted():
    _, clients = curve(table(FULL, 0, "disco"))
    c = clients[0]
    # normalised KL: 5 biased clients ln 5 each, the unbiased 0 -> d = [0.2]*5 + [0]; p = [5/33]*5 + [8/33]
    assert np.allclose(c["disco_d"], [0.2] * 5 + [0.0], atol=1e-12)
    assert np.allclose(c["weight"], [5 / 33] * 5 + [8 / 33], atol=1e-12)
    assert np.allclose(c["disco_d_raw"][:5], np.log(5), atol=1e-12)


def test_cli_run_writes_disco_records_with_units_and_logs_the_fallback(tmp_path):
    import h5py
    from clirun import hpcfl

    # the fallback case: two Dirichlet clients of unequal size; a = 50, b = 0 makes q = n - 50 d~ < 0 for
    # both (each d~ is above n / 50, checked below), and the weights fall back to the size weights n, which
    # differ from equal weights here
    job = tmp_path / "disco.toml"
    job.write_text('[run]\nname = "d"\nrounds = 2\n[data]\ndataset = "digits"\npartition = "dirichlet"\n'
                   'num_clients = 2\n[data.dirichlet]\nalpha = 0.5\n'
                   '[model]\nname = "logreg"\n[algorithm]\nname = "feddisco"\nlocal_steps = 2\n'
                   '[algorithm.disco]\na = 50.0\nb = 0.0\n[runtime]\nthreads = 1\nprogress = "none"\n')
    p = hpcfl("run", str(job), "--out", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert "round 1: FedDisco: every ReLU(n - a d + b) term is 0" in p.stdout
    with h5py.File(tmp_path / "out" / "results.h5", "r") as f:
        sizes = f["partition/class_counts"][()].sum(1)
        assert sizes[0] != sizes[1]
        assert f["metrics/disco_fallback"][()].tolist() == [1, 1]
        assert f["clients/client"][()].tolist() == [0, 1, 0, 1]
        d = f["clients/disco_d"][()]
        np.testing.assert_allclose(d[:2].sum(), 1.0, rtol=1e-12)
        assert (50 * d[:2] > sizes / sizes.sum()).all()                   # every q clipped to 0
        np.testing.assert_array_equal(f["clients/weight"][()], np.tile(sizes / sizes.sum(), 2))   # size weights n
        for name in ("clients/disco_d", "clients/disco_d_raw", "metrics/disco_fallback"):
            assert f[name].attrs["unit"] and "FedDisco" in f[name].attrs["description"]
