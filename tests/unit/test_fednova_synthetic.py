"""FedNova on Synthetic(1,1) (check T10; Wang et al. 2020, Fig. 5) through the real engine, and the
paper job files.

T10 in one setting, the rightmost of Fig. 5: 30 natural clients, logistic regression,
B = 20, lr 0.02, C = 0.3 (9 clients per round, Alg. 1 sampling), E_i(t) ~ U{1..5},
30 rounds, same seed for both algorithms (same data, init, cohorts and E draws). FedNova's
p-weighted training loss F(x) = sum_i p_i F_i(x) of the final global model must be at most
0.9 x FedAvg's. It is the cheapest of the three settings (about 3x fewer local steps than
full participation with E = 5) and shows the effect with a wide margin at seed 0 (about
0.26 vs 0.44, ratio ~0.6; an independent numpy run: 0.269 vs 0.458). The two runs take about
25 s on one core (up to ~50 s on a loaded 2-core machine), so all 30 rounds are kept.

The seed is pinned on purpose: the synthetic data, the init, the cohorts and the E draws
all follow run.seed, and with 9 of 30 power-law-sized clients per round the curves are
not monotone (a cohort can raise F(x) for a few rounds; FedNova's renormalised tau_eff
follows the largest sampled client, so its steps jump from round to round). Measured
final-round ratios FedNova/FedAvg in this setting: seeds 0-3 -> 0.59, 0.72, 0.54, 1.17;
in the full-participation E = 5 setting the ratio falls steadily for seeds 0-3, but that
costs ~4x more (seed 0 has 20,101 samples: 5,095 local steps per round). So this is an
engine regression guard at 30 rounds, not a seed-robust statistic.

The bench bench/fednova_synthetic.py runs all three settings.
"""

from pathlib import Path

import pytest
from mpi4py import MPI
from runner import run_memory

from hpcfl import config

PAPERS = Path(__file__).resolve().parents[2] / "jobs" / "papers"


def synthetic_job(algorithm: str) -> dict:
    """The shipped job (jobs/papers/fednova_synthetic.toml, the C = 0.3, E ~ U{1..5} setting)."""
    table = config.read_job(PAPERS / "fednova_synthetic.toml")
    return config.apply_overrides(table, [
        f"algorithm.name='{algorithm}'", "run.seed=0", "run.rounds=30", "run.eval_every=0",
        "run.eval_train=true", "runtime.threads=1", "runtime.progress='none'",
    ])


def final_train_loss(algorithm: str) -> float:
    table = synthetic_job(algorithm)
    cfg = config.from_dict(table)
    a = cfg.algorithm
    # the setting T10 is about, whatever the job file's comments suggest editing
    assert (cfg.data.dataset, cfg.data.partition, cfg.data.num_clients) == ("synthetic", "natural", 30)
    assert (cfg.dataset_options.alpha, cfg.dataset_options.beta) == (1.0, 1.0)
    assert (cfg.model.name, a.lr, a.batch_size, a.clients_per_round, a.steps) == (
        "logreg", 0.02, 20, 9, "random_epochs")
    assert (cfg.policy_options["steps"].low, cfg.policy_options["steps"].high) == (1, 5)
    _, metrics, _ = run_memory(table, MPI.COMM_SELF)
    assert len(metrics) == 30
    return metrics[-1]["global_train_loss"]


def test_fednova_beats_fedavg_on_synthetic_T10():
    fedavg = final_train_loss("fedavg")
    fednova = final_train_loss("fednova")
    assert 0 < fednova <= 0.9 * fedavg, (fedavg, fednova)


@pytest.mark.parametrize("name", ["fednova_quadratic", "fednova_synthetic", "fednova_cifar10_vgg11"])
def test_paper_jobs_parse(name):
    cfg = config.load(PAPERS / f"{name}.toml")   # validates every key; loads no data
    assert cfg.run.name == name
