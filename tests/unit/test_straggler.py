"""Straggler steps, sampling and partition (spec tests B1-B5); FedLGA in real runs: its reductions to
FedAvg (A2, A6), a diverging run through the CLI (A8), its policy collectives per round (C4); and the
baseline reductions of D4.

"FedAvg" in the comparisons is name = 'fedavg' with weights = 'uniform' and the same straggler steps
policy, so both runs do the same local work from the same keyed randomness; any difference in the
final model then comes from the server rule alone.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import job, run_memory
from test_policy_traffic import calls_of

from hpcfl import cli, config
from hpcfl.engine import simulation
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.algorithms.sampling import Sampler, sample_cohort
from hpcfl.algorithms.straggler import StragglerOptions, StragglerSteps
from hpcfl.client.trainer import Trainer
from hpcfl.data import class_counts, make_partition
from hpcfl.data.partition_labels import LabelKOptions
from hpcfl.errors import ConfigError
from hpcfl.results import load

COMM = MPI.COMM_SELF


def straggler(**overrides):
    """SMALL (digits, 7 clients, 5 a round, 3 rounds) with straggler steps: E = 4 steps (step unit), tau_max 3."""
    return job(**{"algorithm.steps": "straggler", "algorithm.straggler.unit": "step",
                  "algorithm.straggler.tau_max": 3, **overrides})


F64 = {"runtime.dtype": "float64"}   # bitwise comparisons in float64: a float32 model could hide an ulp


def same_run(a, b):
    """Final models and every round's losses bitwise equal."""
    (xa, ma, _), (xb, mb, _) = a, b
    assert np.isfinite(xa).all() and np.array_equal(xa, xb)
    for key in ("train_loss", "test_loss"):
        assert [r[key] for r in ma] == [r[key] for r in mb], key


# ------------------------------------------------------------------------------------ A2
# case -> (overrides of both runs, overrides of the FedLGA run only)
A2_CASES = {
    "rho_0": ({"algorithm.straggler.rho": 0.0}, {}),
    "tau_max_1": ({"algorithm.straggler.tau_max": 1}, {}),
    "lam_0": ({}, {"algorithm.lga.lam": 0.0}),
}


@pytest.mark.parametrize("hessian", ["rank1", "diag"])
@pytest.mark.parametrize("case", list(A2_CASES))
def test_A2_special_cases_are_fedavg_bit_for_bit(case, hessian):
    """rho = 0 (nobody slow), tau_max = 1 (every tau_i = 1: spec cases (b) and (c)) and lam = 0 (the
    correction is D_i + 0): FedLGA with eta_g = 1 equals FedAvg (uniform weights, same steps) bitwise.

    In the lam = 0 case slow clients exist and go through the correction path (lga_corrected > 0), so the
    equality is not the trivial one. Spec (c) 'tau_max = 1 with tau_min = 1' is the same job here: tau_min
    defaults to 1, and the two jobs resolve to the same config digest."""
    extra, lga_only = A2_CASES[case]
    lga = run_memory(straggler(**{"algorithm.name": "fedlga", "algorithm.lga.hessian": hessian, **extra,
                                  **lga_only, **F64}), COMM)
    avg = run_memory(straggler(**{"algorithm.weights": "uniform", **extra, **F64}), COMM)
    same_run(lga, avg)
    corrected = sum(r["lga_corrected"] for r in lga[1])
    slow = sum(r["slow_clients"] for r in lga[1])
    assert (corrected > 0) == (case == "lam_0") and (slow > 0) == (case == "lam_0")
    if case == "tau_max_1":
        explicit = straggler(**{"algorithm.name": "fedlga", "algorithm.straggler.tau_min": 1, **extra})
        assert config.from_dict(explicit).digest() == config.from_dict(straggler(**{
            "algorithm.name": "fedlga", **extra})).digest()


# ------------------------------------------------------------------------------------ A6
@pytest.mark.parametrize("hessian", ["rank1", "diag"])
def test_A6_no_complete_client_is_a_fedavg_round(hessian):
    """rho = 1, tau_min = 2: every cohort member is truncated, so w^_E is undefined and each round falls back
    to plain averaging: the final model equals FedAvg's (uniform, same steps) bitwise, nothing is NaN,
    lga_no_full is 1 every round and lga_no_full_rounds counts 1, 2, 3."""
    extra = {"algorithm.straggler.rho": 1.0, "algorithm.straggler.tau_min": 2}
    lga = run_memory(straggler(**{"algorithm.name": "fedlga", "algorithm.lga.hessian": hessian, **extra, **F64}),
                     COMM)
    avg = run_memory(straggler(**{"algorithm.weights": "uniform", **extra, **F64}), COMM)
    same_run(lga, avg)
    _, metrics, clients = lga
    assert all((c["het_tau"] > 1).all() and np.isnan(c["lga_alpha"]).all() for c in clients)
    assert [r["lga_no_full"] for r in metrics] == [1, 1, 1]
    assert [r["lga_no_full_rounds"] for r in metrics] == [1, 2, 3]
    assert [r["lga_corrected"] for r in metrics] == [0, 0, 0]


# ------------------------------------------------------------------------------------ B1
@pytest.mark.parametrize("unit", ["epoch", "step"])
def test_B1_thousand_rounds_of_tau_and_steps(unit):
    """K = 10 of N = 50, rho = 0.5, E = 5, B = 10, 1000 rounds, through StragglerSteps.steps.

    tau_min = 2: exactly round(0.5 * 10) = 5 slow clients (tau > 1) every round, tau in {2..4}. tau_min = 1
    (literal): the 5 slow positions may draw tau = 1, so at most 5 have tau > 1, on average 5 * 3/4 = 3.75
    (per-round sd 0.97, so the 1000-round mean lies within 0.15 = 5 sd of it). Always E_i = E - tau_i + 1,
    steps = E_i ceil(n_i / B) (epoch unit) or E_i (step unit), full_steps the same with E."""
    E, B = 5, 10
    sizes = np.random.default_rng(5).integers(15, 130, size=50)
    per_epoch = np.ones(50, dtype=np.int64) if unit == "step" else -(-sizes // B)
    policies = {t: StragglerSteps(StragglerOptions(0.5, 4, t, unit), E, B, 3, 50) for t in (2, 1)}
    slow = {t: [] for t in policies}
    for rnd in range(1000):
        cohort = sample_cohort(3, rnd, 50, 10)
        for tau_min, policy in policies.items():
            ctx = SimpleNamespace(rnd=rnd, cohort=cohort, sizes=sizes[cohort], full_steps=None)
            steps = policy.steps(ctx)
            tau = policy.client_records(ctx)["het_tau"]
            assert tau.min() >= 1 and tau.max() <= 4 and ((tau == 1) | (tau >= tau_min)).all()
            assert np.array_equal(steps, (E - tau + 1) * per_epoch[cohort])
            assert np.array_equal(ctx.full_steps, E * per_epoch[cohort])
            slow[tau_min].append(int(np.count_nonzero(tau > 1)))
            assert policy.round_records(ctx)["slow_clients"] == slow[tau_min][-1]
    assert set(slow[2]) == {5}
    assert max(slow[1]) == 5 and abs(np.mean(slow[1]) - 3.75) <= 0.15


@pytest.mark.parametrize("unit", ["epoch", "step"])
def test_B1_executed_sgd_steps_counted_in_a_real_run(unit, monkeypatch):
    """A real FedLGA run with LocalSolver.step counted per trained client: each client ran exactly
    E_i ceil(n_i / B) (epoch) or E_i (step) SGD steps, E_i = E - het_tau + 1, as its 'steps' record says."""
    calls = []                                # per trained client, in training order: [n_i, steps run]
    train, step = Trainer.train, LocalSolver.step

    def counting_train(self, x0, indices, *args, **kw):
        calls.append([int(indices.numel()), 0])
        return train(self, x0, indices, *args, **kw)

    def counting_step(self, *args):
        calls[-1][1] += 1
        return step(self, *args)

    monkeypatch.setattr(Trainer, "train", counting_train)
    monkeypatch.setattr(LocalSolver, "step", counting_step)
    E = 3 if unit == "epoch" else 4
    table = straggler(**{"algorithm.name": "fedlga", "algorithm.straggler.unit": unit, "run.rounds": 2,
                         **({"algorithm.local_steps": 0, "algorithm.local_epochs": E} if unit == "epoch" else {})})
    _, _, clients = run_memory(table, COMM)
    tau = np.concatenate([c["het_tau"] for c in clients])    # cohort order = training order on one rank
    n, ran = np.array(calls).T
    per_epoch = -(-n // 16) if unit == "epoch" else 1
    assert len(ran) == 10 and (tau > 1).any() and (tau == 1).any()
    assert np.array_equal(ran, (E - tau + 1) * per_epoch)
    assert np.array_equal(ran, np.concatenate([c["steps"] for c in clients]))


# ------------------------------------------------------------------------------------ B2
def test_B2_tau_is_uniform_chi_square():
    """rho = 1 makes every cohort position a slow draw: 1000 rounds x K = 10 = 10^4 draws of tau from
    U{1..4}. Pearson's chi-square against 2500 per value, df = 3, stays below 11.345, the 1% critical
    value (a missing or doubled value would give a statistic in the thousands)."""
    policy = StragglerSteps(StragglerOptions(rho=1.0, tau_max=4), 5, 10, 11, 50)
    draws = np.concatenate([policy.taus(rnd, np.arange(10)) for rnd in range(1000)])
    counts = np.bincount(draws, minlength=5)[1:]
    assert draws.size == 10**4 and counts.sum() == 10**4 and draws.min() == 1 and draws.max() == 4
    chi2 = float(((counts - 2500.0) ** 2 / 2500.0).sum())
    assert chi2 < 11.345, (counts, chi2)


# ------------------------------------------------------------------------------------ B3
def test_B3_selection_frequency_and_duplicates():
    """K = 10 of N = 50. Without replacement, 5000 rounds: 10 distinct clients a round, each client chosen
    Binomial(5000, 0.2) times: 1000 +- 4 sqrt(5000 * 0.2 * 0.8). with_replacement, 1000 rounds: 10^4
    draws with p = 1/50, each client 200 +- 4 sqrt(10^4 * 0.02 * 0.98), and a round repeats a client with
    probability 1 - prod_{i<10}(1 - i/50) = 0.6063, so 606 +- 4 sd of the rounds have duplicates."""
    K, N = 10, 50
    plain = Sampler("uniform", K, 8, np.ones(N))
    seen = np.zeros(N)
    for rnd in range(5000):
        cohort, mult = plain.cohort(rnd)
        assert mult is None and len(cohort) == K and len(np.unique(cohort)) == K
        seen[cohort] += 1
    assert np.abs(seen - 1000).max() <= 4 * math.sqrt(5000 * 0.2 * 0.8)
    draws, seen, repeats = Sampler("with_replacement", K, 8, np.ones(N)), np.zeros(N), 0
    for rnd in range(1000):
        cohort, _ = draws.cohort(rnd)
        assert len(cohort) == K and np.all(np.diff(cohort) >= 0)
        np.add.at(seen, cohort, 1)
        repeats += len(np.unique(cohort)) < K
    assert np.abs(seen - 200).max() <= 4 * math.sqrt(10**4 * 0.02 * 0.98)
    p = 1 - math.prod(1 - i / N for i in range(K))
    assert abs(repeats - 1000 * p) <= 4 * math.sqrt(1000 * p * (1 - p))


def test_B3_a_client_drawn_twice_trains_twice():
    """with_replacement (7 clients, 5 draws a round, 3 rounds): some round lists a client twice. Both
    draws train (5 participants, weight 1/5 each) with the same steps but their own randomness, keyed by
    the draw: their mean mini-batch losses differ, so they are two different updates."""
    _, metrics, clients = run_memory(job(**{"algorithm.sampling": "with_replacement"}), COMM)
    twice = 0
    for m, c in zip(metrics, clients):
        assert m["clients_participating"] == 5 and np.allclose(c["weight"], 0.2)
        ids, counts = np.unique(c["client"], return_counts=True)
        for cid in ids[counts > 1]:
            loss = c["train_loss"][c["client"] == cid]
            assert np.all(c["steps"][c["client"] == cid] == 4) and len(set(loss.tolist())) == len(loss)
            twice += 1
    assert twice > 0


# ------------------------------------------------------------------------------------ B4
@pytest.mark.parametrize("seed", [0, 1])
def test_B4_label_k_random_partition_fmnist_shape(seed):
    """60000 labels (6000 per class), N = 50, P = 2 random slots: each client holds exactly 2 labels, the
    index sets are disjoint and cover the train set, and each has 1200 samples: 50 * 2 = 100 slots over 10
    classes give each class 10 holders of 6000 / 10 = 600 samples."""
    y = np.random.default_rng(seed).permutation(np.repeat(np.arange(10), 6000))
    parts = make_partition("label_k", y, 50, LabelKOptions(2, "random"), seed, None)
    everything = np.concatenate(parts)
    assert len(parts) == 50 and np.array_equal(np.sort(everything), np.arange(60000))   # disjoint + union
    counts = class_counts(y, parts, 10)
    assert ((counts > 0).sum(axis=1) == 2).all() and {len(p) for p in parts} == {1200}
    assert set(counts[counts > 0].tolist()) == {600} and ((counts > 0).sum(axis=0) == 10).all()


# ------------------------------------------------------------------------------------ B5
B5 = {
    "fedavg": {"algorithm.name": "fedavg"},
    "fedprox": {"algorithm.name": "fedprox", "algorithm.mu": 1.0},
    "fednova": {"algorithm.name": "fednova"},
    "scaffold": {"algorithm.name": "scaffold"},
    "feddyn": {"algorithm.name": "feddyn"},
    "fedlga": {"algorithm.name": "fedlga"},
}


def test_B5_every_algorithm_sees_the_same_cohorts_and_taus():
    """FedAvg, FedProx (mu = 1), FedNova, SCAFFOLD, FedDyn and FedLGA, same seed and straggler steps, 4
    rounds: identical per-client (cohort, het_tau, steps) records. The cohort and tau streams are keyed by
    (seed, round) only, so the algorithm cannot change them."""
    schedules = {}
    for name, extra in B5.items():
        _, _, clients = run_memory(straggler(**{"run.rounds": 4, **extra}), COMM)   # E = 4 steps
        schedules[name] = [(c["client"].tolist(), c["het_tau"].tolist(), c["steps"].tolist()) for c in clients]
    ref = schedules["fedavg"]
    assert all(s == ref for s in schedules.values())
    assert len({tuple(r[0]) for r in ref}) > 1 and any(max(r[1]) > 1 for r in ref)   # a schedule that varies


# ----------------------------------------------------------------------------------- A8
A8_JOB = """
run = {name = "a8", seed = 24, rounds = 5}
data = {dataset = "digits", partition = "dirichlet", num_clients = 7, dirichlet = {alpha = 0.5}}
model = {mlp = {hidden = [16]}}
runtime = {threads = 1, progress = "none"}
[algorithm]
name = "fedlga"
clients_per_round = 5
lr = 0.1
batch_size = 16
local_steps = 4
steps = "straggler"
straggler = {rho = 0.2, tau_max = 2, unit = "step"}
"""


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_A8_overflowing_correction_ends_the_run_as_diverged(tmp_path, capsys, monkeypatch):
    """A correction scaled by 1e60 (no job may set lam that high: options stop at 1e30) makes the first
    corrected slow update astronomically large: finite in float64, but far beyond float32's 3.4e38, so the
    server's new float32 model is Inf while every client update (trained from a sane model) is finite and
    passes the update guard (else the exit would be 3).
    With seed 24, rho = 0.2 (one slow position of 5) and tau in {1, 2}, rounds 1 and 2 have no truncated
    client (no correction) and round 3 has one.

    Expected: exit 4, status 'diverged', diverged True, diverged_round 3, rounds 1-2 written, no traceback;
    running the command again says it ended diverged and exits 0 without training."""
    policy = StragglerSteps(StragglerOptions(rho=0.2, tau_max=2, unit="step"), 4, 16, 24, 7)
    assert [int(policy.taus(r, np.arange(5)).max()) for r in range(3)] == [1, 1, 2]
    from hpcfl.algorithms import fedlga

    real = fedlga.correct

    def huge(*args, **kwargs):
        new, alpha = real(*args, **kwargs)
        return new * 1e60, alpha

    monkeypatch.setattr(fedlga, "correct", huge)
    (tmp_path / "job.toml").write_text(A8_JOB)
    argv = ["run", str(tmp_path / "job.toml"), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 4
    first = capsys.readouterr()
    assert "Traceback" not in first.err and "diverged" in first.err
    res = load(tmp_path / "out")
    assert res.attrs["status"] == "diverged" and bool(res.attrs["diverged"]) is True
    assert int(res.attrs["diverged_round"]) == 3
    assert res.metrics["round"].tolist() == [1, 2]
    assert np.isfinite(res.metrics["train_loss"]).all() and res.clients["het_tau"].tolist() == [1] * 10
    stamp = (tmp_path / "out" / "results.h5").stat().st_mtime_ns
    assert cli.main(argv) == 0
    again = capsys.readouterr()
    assert "ended diverged in round 3; nothing to do" in again.out
    assert "startup" not in again.out and "Traceback" not in again.err     # no new run started
    assert (tmp_path / "out" / "results.h5").stat().st_mtime_ns == stamp


# ----------------------------------------------------------------------------------- C4
def test_C4_policy_collectives_per_round(monkeypatch):
    """Counted policy collectives (the training reduction itself is not a policy collective): FedAvg none;
    FedLGA rank1 ['lga_full' (the Dbar reduction), 'lga_alpha' (the alpha records)] each of 3 rounds; FedLGA
    diag fused none (its sums ride in the one training reduction); diag with a clip one 'lga_full' a round."""
    assert calls_of(straggler(**{"algorithm.weights": "uniform"}), monkeypatch) == []
    assert calls_of(straggler(**{"algorithm.name": "fedlga"}), monkeypatch) == ["lga_full", "lga_alpha"] * 3
    assert calls_of(straggler(**{"algorithm.name": "fedlga", "algorithm.lga.hessian": "diag"}),
                    monkeypatch) == []
    clip = straggler(**{"algorithm.name": "fedlga", "algorithm.lga.hessian": "diag",
                        "algorithm.lga.corr_clip_ratio": 2.0})
    assert calls_of(clip, monkeypatch) == ["lga_full"] * 3


# ------------------------------------------------------------------------------------ D4
def test_D4_fednova_with_equal_steps_is_fedavg():
    """Every client runs S = 4 steps: FedNova's 4 * sum p D / 4 / sum p is FedAvg's sum p D / sum p. Bitwise in
    float64, because 4 is a power of two: dividing and multiplying by it is exact, and the exact sum quantises
    D / 4 on a grid 4x finer, to the same integers. (With S = 3 the two differ by an ulp in float64, which
    a float32 model would round away.)"""
    same_run(run_memory(job(**{"algorithm.name": "fednova", **F64}), COMM), run_memory(job(**F64), COMM))


def test_D4_scaffold_round_one_with_zero_variates_is_fedavg():
    """SCAFFOLD's first round adds c - c_i = 0 to every gradient and averages like FedAvg (size weights), so
    after one round the models are bitwise equal (its variates only change later rounds)."""
    same_run(run_memory(job(**{"algorithm.name": "scaffold", "run.rounds": 1, **F64}), COMM),
             run_memory(job(**{"run.rounds": 1, **F64}), COMM))


def test_D4_prox_solver_with_mu_zero_is_plain_sgd():
    """'FedProx with mu = 0 == FedAvg': the config refuses local = 'prox' with mu = 0, so the reduction is
    checked where it lives, in LocalSolver: with mu = 0, five steps are bitwise plain SGD as torch.optim.SGD
    takes it (x.add_(g, alpha=-lr), one rounding; building the optimizer itself costs seconds of imports),
    and ||a||_1 = 5. A positive mu adds mu (x - x0) once x has left x0, so mu = 0.1 must differ (the last
    line: the comparison can fail)."""
    with pytest.raises(ConfigError, match="needs algorithm.mu > 0"):
        config.from_dict(job(**{"algorithm.name": "fedprox", "algorithm.mu": 0.0}))
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(50, generator=gen, dtype=torch.float64)
    grads = [torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(5)]
    runs = {}
    for mu in (0.0, 0.1):
        solver, x = LocalSolver(SolverSpec(lr=0.1, mu=mu)), x0.clone()
        solver.begin(x0)
        for g in grads:
            solver.step(x, g, None)
        runs[mu] = (x, solver.anorm())
    sgd = x0.clone()
    for g in grads:
        sgd.add_(g, alpha=-0.1)
    assert torch.equal(runs[0.0][0], sgd) and runs[0.0][1] == 5.0
    assert not torch.allclose(runs[0.1][0], sgd)


@pytest.mark.parametrize("truncate", ["step", "epoch"])
def test_deadline_truncation_keeps_whole_epochs_when_asked(truncate):
    """system.truncate = 'epoch' hands the system model each client's steps per epoch, ceil(n_i / B), as the
    granularity of a deadline cut: every truncated client then runs a whole number of epochs. The deadline
    (0.45 s of 0.1 s steps: 4 steps) cuts 3 epochs of 2-3 steps each, so with 'step' the cut clients keep 4
    steps, which is no whole number of 3-step epochs."""
    table = job(**{"algorithm.local_steps": 0, "algorithm.local_epochs": 3, "algorithm.batch_size": 64,
                   "system.enabled": True, "system.compute_s": 0.1, "system.uplink_mbps": 1e9,
                   "system.deadline_s": 0.45, "system.truncate": truncate})
    s = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    rows = []
    simulation.run(s, on_round=lambda m, c: rows.append(c))
    per_epoch = -(-s.sizes // 64)
    cut = [(int(c), int(k)) for r in rows for c, k in zip(r["client"], r["steps"]) if k < 3 * per_epoch[c]]
    assert cut, "the deadline cut nobody"
    whole = [k % per_epoch[c] == 0 for c, k in cut]
    assert all(whole) if truncate == "epoch" else not all(whole), (cut, per_epoch)
