"""FedNova's diagnostics (Wang et al. 2020, Sec. 4, Theorems 1-2; docs/algorithms/fednova.md):
||a||_2^2 and a_{-1} of the local solver, the per-round metrics nova_* through the real engine
(T8), the paper's FedAvg forms (Eq. 11), the two-client lower bound (Lemma 4, T5), and a
resumed results file written before these fields existed.

Expected values are written out: hand arithmetic, the paper's closed forms, or the T8 table
(computed independently in float64 numpy), never the code under test.
"""

import copy

import h5py
import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import run_memory

from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.algorithms.nova_diag import nova_diagnostics
from hpcfl.io.results import CLIENT_FIELDS, METRICS, ResultsWriter, load

D = torch.float64
NOVA = ("nova_tau_eff", "nova_chi2", "nova_slowdown", "nova_A", "nova_B", "nova_C")


def solve(spec: SolverSpec, tau: int) -> LocalSolver:
    """A solver after ``tau`` steps; the tracked coefficients do not depend on the gradients."""
    solver = LocalSolver(spec)
    solver.begin(torch.zeros(1, dtype=D))
    for _ in range(tau):
        solver.step(torch.zeros(1, dtype=D), torch.zeros(1, dtype=D), None)
    return solver


def coefficients(spec: SolverSpec, tau: int) -> np.ndarray:
    """The solver's explicit a-vector: step k gets the gradient e_k in R^tau (whatever x is), so
    x_tau - x0 = -lr sum_k a_k e_k and a = -(x_tau - x0) / lr, read off the real update of x."""
    solver = LocalSolver(spec)
    x0 = torch.zeros(tau, dtype=D)
    x = x0.clone()
    solver.begin(x0.clone())
    for k in range(tau):
        g = torch.zeros(tau, dtype=D)
        g[k] = 1.0
        solver.step(x, g, None)
    return -(x - x0).numpy() / spec.lr


# ---------------------------------------------------------------- ||a||_2^2 and a_{-1}
@pytest.mark.parametrize("tau,anorm,anorm2", [
    (2, 2.9, 4.61),                     # a = [1 + rho, 1] = [1.9, 1]: 3.61 + 1
    (3, 2.71 + 1.9 + 1.0, 11.9541),     # a = [2.71, 1.9, 1]: 7.3441 + 3.61 + 1
    (8, 28.7420489, None),
    (17, None, 614.6480076756094),
])
def test_momentum_coefficients_closed_forms_T2_T7(tau, anorm, anorm2):
    """Momentum rho = 0.9 (App. B.2): a_k = (1 - rho^(tau-k)) / (1 - rho), the first gradient the largest,
    ||a||_1 = [tau - rho (1 - rho^tau)/(1 - rho)] / (1 - rho) and
    ||a||_2^2 = [tau - 2 rho (1 - rho^tau)/(1 - rho) + rho^2 (1 - rho^(2 tau))/(1 - rho^2)] / (1 - rho)^2
    (expand the square of 1 - rho^(tau-k) and sum the geometric series); a_{-1} = 1 - rho over 1 - rho = 1.
    The literal values (T2/T7: 2.9, 28.7420489; 11.9541, 614.6480076756094) pin the closed forms too."""
    rho = 0.9
    s = solve(SolverSpec(0.1, momentum=rho), tau)
    l1 = (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)
    l2 = (tau - 2 * rho * (1 - rho**tau) / (1 - rho) + rho**2 * (1 - rho ** (2 * tau)) / (1 - rho**2)) / (1 - rho) ** 2
    if anorm is not None:
        assert l1 == pytest.approx(anorm, rel=1e-12)
    if anorm2 is not None:
        assert l2 == pytest.approx(anorm2, rel=1e-12)
    assert s.anorm() == pytest.approx(l1, rel=1e-13)
    assert s.anorm2() == pytest.approx(l2, rel=1e-13)
    assert s.alast() == 1.0


@pytest.mark.parametrize("alpha,tau", [(0.05, 30), (0.2, 7), (1.0, 5)])
def test_prox_coefficients_closed_forms(alpha, tau):
    """FedProx, alpha = lr mu (Eq. 7): a_k = (1 - alpha)^(tau-1-k), so ||a||_1 = (1 - (1-alpha)^tau) / alpha,
    ||a||_2^2 = (1 - (1-alpha)^(2 tau)) / (1 - (1-alpha)^2) and a_{-1} = 1; alpha = 1 leaves a = [0, .., 0, 1]."""
    s = solve(SolverSpec(0.5, mu=2 * alpha), tau)   # lr 0.5, mu 2 alpha: lr mu = alpha exactly
    q = 1 - alpha
    assert s.anorm() == pytest.approx((1 - q**tau) / alpha, rel=1e-13)
    assert s.anorm2() == pytest.approx((1 - q ** (2 * tau)) / (1 - q**2), rel=1e-13)
    assert s.alast() == 1.0


def test_decayed_lr_coefficients_closed_forms():
    """In-round decay gamma (Sec. 4.1): a_k = gamma^k, ||a||_2^2 = (1 - gamma^(2 tau)) / (1 - gamma^2) and
    a_{-1} = gamma^(tau-1): here 0.9^7 = 0.4782969 after 8 steps."""
    g, tau = 0.9, 8
    s = solve(SolverSpec(0.1, decay=g), tau)
    assert s.anorm2() == pytest.approx((1 - g ** (2 * tau)) / (1 - g**2), rel=1e-13)
    assert s.alast() == pytest.approx(0.4782969, rel=1e-13)


@pytest.mark.parametrize("spec", [
    SolverSpec(0.1),
    SolverSpec(0.1, momentum=0.9),
    SolverSpec(0.05, mu=3.0),
    SolverSpec(0.1, decay=0.93),
    SolverSpec(0.03, momentum=0.7, mu=2.0, decay=0.95),   # every term at once: no closed form in the paper
], ids=["sgd", "momentum", "prox", "decay", "all"])
def test_recurrence_equals_explicit_coefficient_vector(spec):
    """The O(1) recurrence (a 2x2 Gram matrix per step) against the a-vector read off the solver's real
    update of x: ||a||_1 = sum a, ||a||_2^2 = sum a^2, a_{-1} = a[-1], to rounding, after 23 steps."""
    tau = 23
    a = coefficients(spec, tau)
    s = solve(spec, tau)
    assert s.anorm() == pytest.approx(a.sum(), rel=1e-12)
    assert s.anorm2() == pytest.approx((a**2).sum(), rel=1e-12)
    assert s.alast() == pytest.approx(a[-1], rel=1e-12)


def test_weight_decay_is_not_part_of_a():
    """Weight decay adds wd x to the gradient: part of the objective, not of a (the authors' code folds it
    into g). The tracked values are bitwise those of the same solver without it."""
    plain = solve(SolverSpec(0.05, momentum=0.5, mu=1.0), 9)
    wd = solve(SolverSpec(0.05, momentum=0.5, mu=1.0, weight_decay=0.1), 9)
    assert (wd.anorm(), wd.anorm2(), wd.alast()) == (plain.anorm(), plain.anorm2(), plain.alast())


# ---------------------------------------------------------------- the formulas against the paper's FedAvg forms
def test_fedavg_forms_with_unequal_weights_eq11():
    """Plain SGD (a_i = 1), p = (0.1, 0.2, 0.3, 0.4) given as sizes 1:2:3:4, tau = (1, 2, 3, 4). By hand:
    E_p[tau] = 3, w = (1, 4, 9, 16)/30, chi2 = sum (p - w)^2 / w = 4/30 + 1/30 + 0 + 1/30 = 0.2;
    Eq. 11: A = m sum p^2 tau / E_p[tau] = 4 * 1.0 / 3, B = E_p[tau] - 1 + var_p[tau] / E_p[tau] = 2 + 1/3,
    C = tau_max (tau_max - 1) = 12; slowdown = tau_bar / tau_eff with Theorem 1's tau_bar = (1/m) sum tau
    = 2.5 (unweighted), so 2.5 / 3."""
    tau = np.array([1.0, 2.0, 3.0, 4.0])
    d = nova_diagnostics([10, 20, 30, 40], tau, tau, tau, np.ones(4))
    assert d.w == pytest.approx(np.array([1, 4, 9, 16]) / 30, rel=1e-14)
    assert d.tau_eff == pytest.approx(3.0, rel=1e-14)
    assert d.chi2 == pytest.approx(0.2, rel=1e-13)
    assert d.A == pytest.approx(4 / 3, rel=1e-13)
    assert d.B == pytest.approx(7 / 3, rel=1e-13)
    assert d.C == 12.0
    assert d.slowdown == pytest.approx(2.5 / 3, rel=1e-14)


def test_no_client_reported_gives_nan():
    """A round in which nobody reported has no local work to describe: every value is NaN."""
    d = nova_diagnostics([], [], [], [], [])
    assert all(np.isnan(v) for v in d.metrics().values())


# ---------------------------------------------------------------- T8 through the engine
FOUR = {
    "run": {"seed": 0, "rounds": 2, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 4,
             "quadratic": {"dim": 1, "centers": [1.0, -1.0, 0.5, -0.5]}},   # one sample each: p uniform
    "model": {"name": "quadratic"},
    "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 1, "steps": "client_steps",
                  "client_steps": {"steps": [5, 10, 20, 40]}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}
# alpha: (tau_eff, w, chi2, slowdown, A, B, C), the T8 table (6 significant digits)
T8 = {
    0.0: (18.75, [0.066667, 0.133333, 0.266667, 0.533333], 0.757813, 1.0, 1.0, 27.333333, 1560),
    0.05: (10.702420, [0.105686, 0.187464, 0.299705, 0.407145], 0.286819, 1.751940, 0.694247, 7.454143, 286.366668),
    0.2: (4.441605, [0.189211, 0.251212, 0.278185, 0.281392], 0.025894, 4.221447, 0.606788, 1.713196, 19.994019),
    1.0: (1.0, [0.25, 0.25, 0.25, 0.25], 0.0, 18.75, 1.0, 0.0, 0.0),
}
# alpha -> (rule, lr, mu): alpha = lr mu exactly in float64; alpha = 0 is plain SGD
JOBS = {0.0: ("fedavg", 0.05, 0.0), 0.05: ("fedavg", 0.05, 1.0), 0.2: ("fedavg", 0.2, 1.0), 1.0: ("fedavg", 0.5, 2.0),
        "nova": ("fednova", 0.2, 1.0)}


@pytest.fixture(scope="module")
def t8_runs():
    out = {}
    for key, (name, lr, mu) in JOBS.items():
        t = copy.deepcopy(FOUR)
        t["algorithm"].update(name=name, lr=lr)
        if mu:
            t["algorithm"].update(local="prox", mu=mu)
        _, metrics, clients = run_memory(t, MPI.COMM_SELF)
        out[key] = metrics, clients
    return out


def close(got, want):
    return got == pytest.approx(want, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("alpha", sorted(T8))
def test_T8_diagnostics_table(t8_runs, alpha):
    """T8: tau = (5, 10, 20, 40), p = 1/4, FedProx a_i (alpha = lr mu), two rounds of the real engine. Each
    round's nova_* metrics equal the table to its 6 digits (rel 1e-5 or abs 1e-6), and the implicit weights
    w_i = p_i ||a_i||_1 / tau_eff follow from the recorded /clients/anorm. Hand check of alpha = 0:
    ||a_i||_1 = ||a_i||_2^2 = tau_i, a_{-1} = 1, tau_eff = 75/4, w = tau/75, A = 4 (75/4) sum tau/75^2 = 1,
    B = sum tau (tau - 1) / 75 = 2050/75, C = 40 * 39 = 1560; alpha = 1: a_i = [0, .., 0, 1], w = p, A = 1."""
    metrics, clients = t8_runs[alpha]
    tau_eff, w, chi2, slowdown, A, B, C = T8[alpha]
    for m, c in zip(metrics, clients):
        assert close(m["nova_tau_eff"], tau_eff) and close(m["nova_chi2"], chi2)
        assert close(m["nova_slowdown"], slowdown)
        assert close(m["nova_A"], A) and close(m["nova_B"], B) and close(m["nova_C"], C)
        assert close(c["anorm"] / c["anorm"].sum(), w)          # p uniform: w_i = ||a_i||_1 / sum_j ||a_j||_1
        assert c["alast"].tolist() == [1.0] * 4                 # prox and SGD: the last gradient counts once
        q = 1 - alpha                                           # ||a_i||_2^2, closed form (prox; alpha = 0: tau)
        want = [t if alpha == 0 else (1 - q ** (2 * t)) / (1 - q**2) for t in (5, 10, 20, 40)]
        assert c["anorm2"] == pytest.approx(want, rel=1e-12)


def test_T8_monotone_in_alpha(t8_runs):
    """Fig. 4's trend: as alpha grows the weights approach p (chi2 falls) and tau_eff shrinks (slowdown rises)."""
    rows = [t8_runs[a][0][0] for a in sorted(T8)]
    chi2 = [r["nova_chi2"] for r in rows]
    slow = [r["nova_slowdown"] for r in rows]
    assert all(x > y for x, y in zip(chi2, chi2[1:]))
    assert all(x < y for x, y in zip(slow, slow[1:]))


def test_diagnostics_describe_the_local_work_whatever_the_rule(t8_runs):
    """FedNova-Prox (alpha = 0.2) runs the same steps with the same solver as FedProx at alpha = 0.2, and the
    a_i depend on neither the model nor the data, so its nova_* metrics are the same: they describe what
    averaging weighs, while /metrics/tau_eff is the rule's own value, sum p tau = 18.75 (auto with prox)."""
    nova, prox = t8_runs["nova"][0][0], t8_runs[0.2][0][0]
    assert [nova[k] for k in NOVA] == [prox[k] for k in NOVA]
    assert nova["tau_eff"] == 18.75 and close(prox["tau_eff"], 4.441605)


# ---------------------------------------------------------------- Lemma 4 (T5)
def test_lemma4_chi2_kappa_T5():
    """Lemma 4: F_1 = 1/2 (x - a)^2, F_2 = 1/2 (x + a)^2, a = 1, p = (1/2, 1/2), tau = (2, 8), FedAvg. Its
    eta -> 0 limit x = (tau_1 - tau_2) a / (tau_1 + tau_2) = -0.6 minimises sum w F with w = tau / 10 =
    (0.2, 0.8) (the lr does not matter: under SGD w_i = p_i tau_i / sum p tau), and ||grad F(x)||^2 = x^2 = 0.36.
    By hand, chi2 = sum (p - w)^2 / w = 0.09/0.2 + 0.09/0.8 = 0.5625 = (tau_2 - tau_1)^2 / (4 tau_1 tau_2), and
    kappa^2 = sum_i w_i (grad F_i - grad F~)^2 = 0.2 * 1.6^2 + 0.8 * 0.4^2 = 0.64 = 4 w_1 w_2 a^2; the product
    is 0.36, the bound being tight. The paper's proof (App. D.1, Eqs. 116 and 120) writes 2 w_1 w_2 a^2 = 0.32
    and (tau_2 - tau_1)^2 / (2 tau_1 tau_2) = 1.125: each off by a factor 2, in opposite directions, so that
    the product 0.36 is right; chi2 here is the paper's own definition (Theorem 2), as in the T8 table."""
    t = {**copy.deepcopy(FOUR), "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2,
                                         "quadratic": {"dim": 1, "centers": [1.0, -1.0]}}}
    t["algorithm"]["client_steps"] = {"steps": [2, 8]}
    t["run"]["rounds"] = 1
    _, metrics, _ = run_memory(t, MPI.COMM_SELF)
    chi2 = metrics[0]["nova_chi2"]
    assert chi2 == pytest.approx(0.5625, rel=1e-14)
    w, x = np.array([0.2, 0.8]), -0.6
    grads = np.array([x - 1.0, x + 1.0])
    kappa2 = float(w @ (grads - w @ grads) ** 2)
    assert kappa2 == pytest.approx(0.64, rel=1e-14)
    assert chi2 * kappa2 == pytest.approx(x**2, rel=1e-13)
    assert metrics[0]["nova_A"] == pytest.approx(1.0, rel=1e-14)   # Eq. 11: 2 (2/4 + 8/4) / 5
    assert metrics[0]["nova_B"] == pytest.approx(5.8, rel=1e-14)   # 5 - 1 + 9/5
    assert metrics[0]["nova_C"] == 56.0                            # 8 * 7


# ---------------------------------------------------------------- results file
def test_resume_into_a_file_written_without_the_new_fields(tmp_path):
    """A run started by a version without /metrics/nova_chi2 and /clients/anorm2 resumes: the kept rows read
    NaN (unknown), the resumed rounds their values, and the datasets carry unit and description."""
    attrs = {"config": {}, "config_sha256": "x", "versions": {}, "world_size": 1, "devices": ["cpu"], "seed": 0}

    def row(r):
        return ({k: float(r) for k in METRICS} | {"round": r},
                {k: np.full(2, r) for k in CLIENT_FIELDS} | {"client": np.array([0, 1])})

    w = ResultsWriter(tmp_path / "results.h5", attrs, np.ones((2, 1), dtype=np.int64))
    for r in (1, 2):
        w.append_round(*row(r))
    w.close()
    with h5py.File(tmp_path / "results.h5", "r+") as f:
        del f["metrics/nova_chi2"], f["clients/anorm2"]
    w = ResultsWriter(tmp_path / "results.h5", attrs, None, resume_at=1)
    w.append_round(*row(2))
    w.close()
    res = load(tmp_path)
    assert np.isnan(res.metrics["nova_chi2"][0]) and res.metrics["nova_chi2"][1:].tolist() == [2.0]
    assert np.isnan(res.clients["anorm2"][:2]).all() and res.clients["anorm2"][2:].tolist() == [2.0, 2.0]
    assert res.units["metrics"]["nova_chi2"] == "1" and res.units["clients"]["anorm2"] == "steps"
