"""FedLGA's server correction, pinned value by value: tests written from the mutation pass (issue 48).

:func:`hpcfl.algorithms.fedlga.correct` on 2-3 dimensional vectors whose every intermediate is a
short dyadic fraction (so float64 is exact and each expected value is a hand-computed closed form),
``LgaOptions.validate``'s messages word for word, and ``LgaRule``'s hooks driven by hand with a small
context: ``release`` (Dbar from the complete clients' rows, the slow clients corrected, the counts it
passes to the collectives), ``_fused_correction``, ``pack``, ``round_records``, ``server_update``,
``state`` and ``transfer``, each compared with exact dicts and arrays.

Notation as in hpcfl/algorithms/fedlga.py: D~_i = D_i + lam G_i (beta Dbar + sigma D_i), (beta, sigma)
= (-1, +1) for C_pseudo, (+1, -1) for B_alg1, (+1, +1) for A_table1.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl.algorithms import fedlga
from hpcfl.algorithms.fedlga import LgaOptions, LgaRule, correct
from hpcfl.client.trainer import ClientResult
from hpcfl.parallel.comm import Collectives

DIAG_CLIP = "clip alpha_i of hessian = 'rank1'; with 'diag' use corr_clip_ratio"


# ---------------------------------------------------------------------------------- validate
@pytest.mark.parametrize("kwargs,expected", [
    ({}, []),
    ({"hessian": "diag", "alpha_min": 0.0}, [f"alpha_min {DIAG_CLIP}"]),
    ({"hessian": "diag", "alpha_max_extrapolate": True}, [f"alpha_max_extrapolate {DIAG_CLIP}"]),
    ({"hessian": "diag", "alpha_min": 0.0, "alpha_max": 2.0, "alpha_max_extrapolate": True},
     [f"alpha_min, alpha_max, alpha_max_extrapolate {DIAG_CLIP}"]),
    ({"hessian": "diag", "corr_clip_ratio": 0.5}, []),
    ({"corr_clip_ratio": 0.5}, ["corr_clip_ratio is for hessian = 'diag'; with 'rank1' clip alpha_min / alpha_max"]),
    ({"alpha_min": 2.0, "alpha_max": 1.0}, ["alpha_min = 2.0 exceeds alpha_max = 1.0"]),
    ({"alpha_min": 1.0, "alpha_max": 1.0}, []),
    ({"alpha_max": 1.0}, []),
    ({"alpha_min": 1.0}, []),
])
def test_validate_lists_each_problem_word_for_word(kwargs, expected):
    """validate names the rank1-only clips set under diag (in field order), a clip ratio under rank1, and
    alpha_min above alpha_max (equal bounds and a single bound are fine): the messages are the user's fix."""
    assert LgaOptions(**kwargs).validate() == expected


# ---------------------------------------------------------------------------------- correct
def test_correct_needs_the_gradient_for_full_grad():
    """grad_proxy = full_grad without a gradient is refused with a message naming the proxy."""
    with pytest.raises(ValueError, match=r"^grad_proxy = 'full_grad' needs the gradient at the client's last "
                                         r"iterate$"):
        correct(np.ones(2), 1, 2, np.zeros(2), 0.5, LgaOptions(grad_proxy="full_grad"))


@pytest.mark.parametrize("variant", ["C_pseudo", "B_alg1", "A_table1"])
def test_correct_zero_update_has_alpha_one(variant):
    """A slow client that did not move (D = 0, ||D||^2 = 0) keeps D~ = 0 and alpha = 1, not a 0/0."""
    new, alpha = correct(np.zeros(3), 2, 4, np.array([1.0, -2.0, 0.5]), 0.5, LgaOptions(variant=variant))
    assert np.array_equal(new, np.zeros(3)) and alpha == 1.0


# A_table1 rank1 on the spec's A1 client 2: D = [-1, 1, 0], S = 2, lr = 0.5, Dbar = [-2, 1, 0.5]: g = D,
# v = Dbar + D = [-3, 2, 0.5], g . v = 5, D~ = 6 D, alpha 6.
D2, DBAR = np.array([-1.0, 1.0, 0.0]), np.array([-2.0, 1.0, 0.5])


@pytest.mark.parametrize("kwargs,alpha", [
    ({}, 6.0),                                   # no clip
    ({"alpha_max": 3.0}, 3.0),                   # alpha_max binds
    ({"alpha_max": 7.0}, 6.0),                   # alpha_max above alpha
    ({"alpha_max_extrapolate": True}, 2.5),      # full_steps / S = 5 / 2
    ({"alpha_max_extrapolate": True, "alpha_max": 2.0}, 2.0),    # the lower of the two
    ({"alpha_min": 8.0}, 8.0),                   # alpha_min binds
])
def test_correct_rank1_clips_alpha(kwargs, alpha):
    """rank1 + avg_update: D~ = alpha D with alpha = 1 + lam g.v ||g||^2 / ... = 6, clipped into
    [alpha_min, min(alpha_max, full_steps / S)] and the update rescaled exactly to the clipped alpha."""
    new, a = correct(D2, 2, 5, DBAR, 0.5, LgaOptions(variant="A_table1", **kwargs))
    assert a == alpha and np.array_equal(new, alpha * D2)


def test_correct_gradient_proxy_clip_keeps_the_gradient_direction():
    """full_grad: corr = lam (g . v) g; a binding clip shrinks corr by (clipped - 1) / (alpha - 1), keeping
    g's direction (D = [1, 0], Dbar = 0, g = [2, 1]: g.v = 2, corr = [4, 2], alpha 5; at alpha_max 2 the
    factor is 1/4: D~ = [2, 0.5])."""
    opts = LgaOptions(grad_proxy="full_grad", alpha_max=2.0)
    new, a = correct(np.array([1.0, 0.0]), 2, 5, np.zeros(2), 0.5, opts, grad=np.array([2.0, 1.0]))
    assert a == 2.0 and np.array_equal(new, [2.0, 0.5])
    new, a = correct(np.array([1.0, 0.0]), 2, 5, np.zeros(2), 0.5, LgaOptions(grad_proxy="last_grad"),
                     grad=np.array([2.0, 1.0]))
    assert a == 5.0 and np.array_equal(new, [5.0, 2.0])


@pytest.mark.parametrize("bound", [{"alpha_min": 1.0}, {"alpha_max": 1.0}])
def test_correct_gradient_proxy_alpha_on_the_bound_is_not_clipped(bound):
    """last_grad with corr orthogonal to D (D = [1, 0], Dbar = [0, -1], g = [0, 1]: v = [1, 1], g . v = 1,
    corr = [0, 1]) has alpha exactly 1; a bound at 1 leaves it alone (clipping would scale corr by 0 / 0)."""
    opts = LgaOptions(grad_proxy="last_grad", **bound)
    new, a = correct(np.array([1.0, 0.0]), 2, 5, np.array([0.0, -1.0]), 0.5, opts, grad=np.array([0.0, 1.0]))
    assert a == 1.0 and np.array_equal(new, [1.0, 1.0])


def test_correct_diag_clip_of_a_zero_update():
    """diag + corr_clip_ratio on D = 0: correction 0 of norm 0 at a cap of 0 is left alone (no 0 / 0)."""
    opts = LgaOptions(hessian="diag", corr_clip_ratio=0.5)
    new, a = correct(np.zeros(3), 2, 5, np.array([1.0, 2.0, 3.0]), 0.5, opts)
    assert np.array_equal(new, np.zeros(3)) and math.isnan(a)


@pytest.mark.parametrize("ratio,expected", [(0.5, [3.0, 0.0, 0.0]), (4.0, [10.0, 0.0, 0.0]),
                                            (0.25, [2.5, 0.0, 0.0])])
def test_correct_diag_clip_ratio(ratio, expected):
    """diag + raw_update, C_pseudo: D = [2, 0, 0], Dbar = 0: corr = g*g*(D - Dbar) = [8, 0, 0], ||corr|| 8;
    corr_clip_ratio r caps it at r ||D|| = 2 r (r = 0.5: [1, 0, 0]; r = 4: cap 8 = norm, unchanged)."""
    opts = LgaOptions(hessian="diag", grad_proxy="raw_update", corr_clip_ratio=ratio)
    new, a = correct(np.array([2.0, 0.0, 0.0]), 1, 4, np.zeros(3), 0.5, opts)
    assert np.array_equal(new, expected) and math.isnan(a)


def test_correct_diag_two_coordinates():
    """diag, avg_update, B_alg1, lam 0.5: g = D / (lr S) = [1, -2], v = Dbar - D = [0, 3],
    D~ = D + 0.5 g*g*v = [1, -2] + [0, 6] = [1, 4]; alpha is NaN for diag."""
    opts = LgaOptions(variant="B_alg1", hessian="diag", lam=0.5)
    new, a = correct(np.array([1.0, -2.0]), 2, 4, np.array([1.0, 1.0]), 0.5, opts)
    assert np.array_equal(new, [1.0, 4.0]) and math.isnan(a)


# ---------------------------------------------------------------------------------- the rule's hooks
class RecordingCollectives(Collectives):
    """The real single-rank collectives, recording each sum's (name, length, total)."""

    def __init__(self):
        super().__init__(MPI.COMM_SELF)
        self.sums = []

    def sum(self, name, rows, length, total):
        self.sums.append((name, length, total))
        return super().sum(name, rows, length, total)


def make_ctx(steps, full_steps, lr=0.5):
    """A one-rank round context holding every cohort position (steps, full_steps, lr, collectives, log)."""
    k = len(steps)
    logs, loads = [], []
    return SimpleNamespace(steps=np.asarray(steps, dtype=np.int64), full_steps=np.asarray(full_steps, dtype=np.int64),
                           lr=lr, mine=np.arange(k), cohort=np.arange(k), sizes=np.full(k, 10, dtype=np.int64),
                           collective=RecordingCollectives(), log=logs.append, logs=logs,
                           clients=SimpleNamespace(load_x0=lambda: loads.append(1)), loads=loads)


def result(d, steps):
    """A client's result: a float64 update D (plus nothing else) after ``steps`` SGD steps."""
    return ClientResult(torch.tensor(d, dtype=torch.float64), int(steps), float(steps), 0.0, 0)


# The spec's A1 clients 0-3 (D, S, full 5), plus: 4 did not report (S 0, full 5), 5 complete after one step
# with D = Dbar (so Dbar stays [-2, 1, 0.5]), 6 slow after one step with D = 0 (alpha 1), 7 S 0 of full 0.
A1_D = np.array([[-1.0, 0.0, 0.5], [-3.0, 2.0, 0.5], [-1.0, 1.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0],
                 [-2.0, 1.0, 0.5], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
A1_S, A1_FULL = [5, 5, 2, 4, 0, 1, 1, 0], [5, 5, 5, 5, 5, 1, 5, 0]


def run_release(opts, weight=0.25, steps=A1_S, full=A1_FULL, deltas=A1_D, P=3):
    """Pack the complete clients (weight each), hold the slow ones, release: (rule, ctx, held results)."""
    rule, ctx = LgaRule(opts, P), make_ctx(steps, full)
    held = []
    for j, (d, s) in enumerate(zip(deltas, steps)):
        if s == 0:
            continue                 # did not report
        res = result(d, s)
        if rule.hold(ctx, j):
            held.append((j, j, res))
        else:
            assert rule.pack(ctx, j, j, res, weight) == {}
    rule.release(ctx, held)
    return rule, ctx, {j: res for j, _, res in held}


def test_release_corrects_the_slow_clients_with_dbar():
    """rank1 C_pseudo: Dbar from the complete rows (weights 0.25, sum 0.75 < 1), D~_2 = 0 (alpha 0),
    D~_3 = [0, 3, 0] (alpha 1.5), D~_6 = 0 (alpha 1); one sum of length P + 1 over the 3 complete rows."""
    rule, ctx, held = run_release(LgaOptions())
    assert ctx.collective.sums == [("lga_full", 4, 3)]
    assert np.array_equal(held[2].adjusted, [0.0, 0.0, 0.0])
    assert np.array_equal(held[3].adjusted, [0.0, 3.0, 0.0])
    assert np.array_equal(held[6].adjusted, [0.0, 0.0, 0.0])
    assert np.array_equal(held[3].host(), A1_D[3])          # the real update is left as it was
    alpha = rule.client_records(ctx)["lga_alpha"]
    assert np.array_equal(alpha, [np.nan, np.nan, 0.0, 1.5, np.nan, np.nan, 1.0, np.nan], equal_nan=True)
    rec = rule.round_records(ctx)
    assert 0.0 < rec.pop("time_lga") < 1.0
    assert rec == {"lga_no_full": 0, "lga_no_full_rounds": 0, "lga_corrected": 3}
    assert ctx.logs == [] and ctx.loads == []


def test_release_extrapolate_clip_reads_each_clients_full_steps():
    """A_table1 + alpha_max_extrapolate: alpha_2 = 6 clipped at 5 / 2, alpha_3 = 2.5 at 5 / 4."""
    rule, ctx, held = run_release(LgaOptions(variant="A_table1", alpha_max_extrapolate=True))
    assert np.array_equal(held[2].adjusted, [-2.5, 2.5, 0.0])
    assert np.array_equal(held[3].adjusted, [0.0, 2.5, 0.0])
    assert np.array_equal(rule.client_records(ctx)["lga_alpha"][[2, 3]], [2.5, 1.25])


def test_release_without_a_complete_client_is_a_fedavg_round():
    """No complete client: nothing corrected, the round flagged and logged; the sum still runs over one row's
    grid; server_update counts each such round once."""
    rule, ctx, held = run_release(LgaOptions(), steps=[2, 1], full=[5, 5], deltas=A1_D[2:4])
    assert ctx.collective.sums == [("lga_full", 4, 1)]
    assert held[0].adjusted is None and held[1].adjusted is None
    assert ctx.logs == [("FedLGA: none of the 2 reporting clients finished its local work; "
                         "this round averages the updates as FedAvg")]
    assert np.isnan(rule.client_records(ctx)["lga_alpha"]).all()
    rec = rule.round_records(ctx)
    assert 0.0 <= rec.pop("time_lga") < 1.0
    assert rec == {"lga_no_full": 1, "lga_no_full_rounds": 0, "lga_corrected": 0}
    rule.server_update(ctx, None, None)
    rule.release(ctx, [])                   # a second such round
    rule.server_update(ctx, None, None)
    assert rule.round_records(ctx)["lga_no_full_rounds"] == 2 and rule.no_full_rounds == 2


def test_release_gradient_proxy_gets_the_client_and_p(monkeypatch):
    """full_grad: the gradient function is called with (ctx, j, res, P), its vector enters correct, and the
    clients' start model is reloaded afterwards (D_2 = [-1, 1, 0], g = [1, 0, 0], v = D_2 - Dbar =
    [1, 0, -0.5]: g . v = 1, D~_2 = [0, 1, 0])."""
    calls = []

    def fake(ctx, j, res, P):
        calls.append((j, P))
        return np.array([1.0, 0.0, 0.0])

    monkeypatch.setitem(fedlga.GRADIENTS, "full_grad", fake)
    steps, full = [5, 5, 2], [5, 5, 5]
    rule, ctx, held = run_release(LgaOptions(grad_proxy="full_grad"), steps=steps, full=full, deltas=A1_D[:3])
    assert calls == [(2, 3)] and ctx.loads == [1]
    assert np.array_equal(held[2].adjusted, [0.0, 1.0, 0.0])
    assert rule.client_records(ctx)["lga_alpha"][2] == 0.5     # 1 + corr . D / ||D||^2 = 1 - 1 / 2


def test_fresh_rule_records_and_state():
    """Before any round: zero counts, no correction time, NaN alphas (even with slow clients in the ctx);
    normalize on and batch size 1 by default."""
    ctx = make_ctx([1, 5], [5, 5])
    rule = LgaRule(LgaOptions(grad_proxy="full_grad"), 3)
    assert rule.round_records(ctx) == {"lga_no_full": 0, "lga_no_full_rounds": 0, "lga_corrected": 0,
                                       "time_lga": 0.0}
    assert np.isnan(rule.client_records(ctx)["lga_alpha"]).all()
    assert rule.normalize is True and LgaRule(LgaOptions(), 3, normalize=False).normalize is False
    assert np.array_equal(rule.finish_steps(SimpleNamespace(sizes=np.array([3, 5]))), [3, 5])


def test_state_saves_and_restores_the_no_full_count():
    """One server array, lga_no_full_rounds, rank 0 only (not broadcast), an int64 [count], set from a saved
    array of any shape."""
    rule = LgaRule(LgaOptions(), 3)
    (arr,) = rule.state()
    assert arr.name == "lga_no_full_rounds" and arr.broadcast is False
    rule.no_full_rounds = 3
    got = arr.get()
    assert got.dtype == np.int64 and np.array_equal(got, [3])
    arr.set(np.array([[7]]))
    assert rule.no_full_rounds == 7 and type(rule.no_full_rounds) is int


@pytest.mark.parametrize("proxy,expected", [("avg_update", (0, 0)), ("raw_update", (0, 0)),
                                            ("full_grad", (3, 0)), ("last_grad", (3, 0))])
def test_transfer_counts_the_gradient_upload(proxy, expected):
    """full_grad and last_grad upload one more P-vector per client; the update-based proxies nothing."""
    assert LgaRule(LgaOptions(grad_proxy=proxy), 3).transfer() == expected


# ---------------------------------------------------------------------------------- the fused diag path
@pytest.mark.parametrize("proxy,gg,ggd", [("raw_update", [2.0, 0.5], [4.0, 0.5]),
                                          ("avg_update", [8.0, 2.0], [16.0, 2.0])])
def test_fused_pack_rows(proxy, gg, ggd):
    """diag fused: a complete client packs [p D | p]; a slow one [p g*g | p] and p g*g*D, with g = D
    (raw_update) or D / (lr S) (avg_update; lr 0.5, S 1); the buffer entry (9) is never packed."""
    rule, ctx = LgaRule(LgaOptions(hessian="diag", grad_proxy=proxy), 2), make_ctx([3, 1], [3, 4])
    assert not rule.hold(ctx, 0) and not rule.hold(ctx, 1)
    full = rule.pack(ctx, 0, 0, result([1.0, -2.0, 9.0], 3), 2.0)
    assert list(full) == ["lga_full"] and full["lga_full"].tolist() == [2.0, -4.0, 2.0]
    slow = rule.pack(ctx, 1, 1, result([2.0, 1.0, 9.0], 1), 0.5)
    assert slow["lga_gg"].tolist() == gg + [0.5] and slow["lga_ggd"].tolist() == ggd


# five clients: one slow that ran (1 of 5), one that did not report (0 of 5), three complete
FUSED_S, FUSED_FULL = [5, 1, 0, 3, 1], [5, 5, 5, 3, 1]
SEG = {"lga_full": np.array([1.0, 2.0, 0.5]), "lga_gg": np.array([3.0, 1.0, 0.5]), "lga_ggd": np.array([1.0, 2.0])}


@pytest.mark.parametrize("normalize,expected", [(True, [-4.0, 0.0, 3.0]), (False, [-8.0, 0.0, 6.0])])
def test_fused_correction_from_the_segments(normalize, expected):
    """C_pseudo, lam 2: Dbar = [1, 2] / 0.5 = [2, 4], correction lam (-gg * Dbar + ggd) = 2 ([-6, -4] +
    [1, 2]) = [-10, -4], divided by the weight sum 2 when normalizing, added to FedAvg's mean of
    delta_sum = [2, 4, 6] (the buffer entry is not corrected); one slow client counted as corrected."""
    rule, ctx = LgaRule(LgaOptions(hessian="diag", lam=2.0), 2, normalize=normalize), make_ctx(FUSED_S, FUSED_FULL)
    rule.release(ctx, [])
    assert rule.round_records(ctx)["time_lga"] == 0.0 and ctx.collective.sums == []
    out = rule.aggregate(np.array([2.0, 4.0, 6.0]), {"weight": 2.0}, SEG)
    assert np.array_equal(out, expected)
    rec = rule.round_records(ctx)
    assert 0.0 < rec.pop("time_lga") < 1.0
    assert rec == {"lga_no_full": 0, "lga_no_full_rounds": 0, "lga_corrected": 1}
    rule.server_update(ctx, None, None)
    assert rule.no_full_rounds == 0


def test_fused_round_without_a_complete_client():
    """Slow clients reported (gg weight 0.5) but no complete one: no correction, the round flagged,
    nothing counted as corrected, and server_update counts it."""
    rule, ctx = LgaRule(LgaOptions(hessian="diag"), 2), make_ctx(FUSED_S, FUSED_FULL)
    rule.release(ctx, [])
    seg = dict(SEG, lga_full=np.zeros(3))
    assert np.array_equal(rule.aggregate(np.array([2.0, 4.0, 6.0]), {"weight": 2.0}, seg), [1.0, 2.0, 3.0])
    rec = rule.round_records(ctx)
    assert 0.0 <= rec.pop("time_lga") < 1.0
    assert rec == {"lga_no_full": 1, "lga_no_full_rounds": 0, "lga_corrected": 0}
    rule.server_update(ctx, None, None)
    assert rule.round_records(ctx)["lga_no_full_rounds"] == 1


def test_fused_round_without_clients_is_not_flagged():
    """Neither complete nor slow rows (both weights 0): a zero correction and no 'no complete client' flag."""
    rule, ctx = LgaRule(LgaOptions(hessian="diag"), 2), make_ctx([5], [5])
    rule.release(ctx, [])
    seg = {"lga_full": np.zeros(3), "lga_gg": np.zeros(3), "lga_ggd": np.zeros(2)}
    assert np.array_equal(rule.aggregate(np.array([2.0, 4.0, 6.0]), {"weight": 2.0}, seg), [1.0, 2.0, 3.0])
    assert rule.round_records(ctx)["lga_no_full"] == 0
