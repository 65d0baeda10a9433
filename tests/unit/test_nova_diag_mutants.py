"""nova_diagnostics beyond plain SGD: hand-computed A, B, C with a_{i,-1} != 1, weights of any scale,
clients with p_i = 0, one client, no positive weight, a zero ||a_i||_1, float32 and column inputs."""

import re
import warnings

import numpy as np
import pytest

from hpcfl.algorithms.nova_diag import nova_diagnostics

# Two clients, p = (1, 3) / 4, tau = (2, 4), ||a||_1 = (2, 4), ||a||_2^2 = (3, 5), a_{-1} = (0.5, 2):
# tau_eff = 0.5 + 3 = 3.5, w = (1, 6) / 7, chi2 = 7 (3/28)^2 (1 + 1/6) = 3/32, slowdown = 3 / 3.5,
# A = 2 * 3.5 * (3/4 / 49 + 36 * 5/16 / 49) = 12/7, B = (2.75 + 6 * 1) / 7 = 1.25, C = max(4 - 1, 16 - 8) = 8.
TAU, A1, A2, LAST = [2.0, 4.0], [2.0, 4.0], [3.0, 5.0], [0.5, 2.0]
EXPECT = {"tau_eff": 3.5, "chi2": 3 / 32, "slowdown": 6 / 7, "A": 12 / 7, "B": 1.25, "C": 8.0}


def check(d, expect=EXPECT, w=(1 / 7, 6 / 7)):
    for name, value in expect.items():
        assert getattr(d, name) == pytest.approx(value, rel=1e-12, abs=1e-15), name
    assert d.w.dtype == np.float64
    np.testing.assert_allclose(d.w, w, rtol=1e-12, atol=0)


@pytest.mark.parametrize("p", [[1.0, 3.0], [0.1, 0.3], [100.0, 300.0]])
def test_hand_computed_round_with_weights_of_any_scale(p):
    check(nova_diagnostics(p, TAU, A1, A2, LAST))


def test_a_client_with_zero_weight_adds_nothing():
    """p_0 = 0: w_0 = 0 and the (0 - 0)^2 / 0 term of chi2 is left out, whatever its a_0."""
    d = nova_diagnostics([0.0, 0.1, 0.3], [7.0] + TAU, [5.0] + A1, [9.0] + A2, [1.0] + LAST)
    assert d.w[0] == 0.0
    assert d.chi2 == pytest.approx(3 / 32, rel=1e-12) and d.tau_eff == pytest.approx(3.5, rel=1e-12)


def test_one_client():
    d = nova_diagnostics([2.0], [3.0], [3.0], [3.0], [1.0])
    check(d, {"tau_eff": 3.0, "chi2": 0.0, "slowdown": 1.0, "A": 1.0, "B": 2.0, "C": 6.0}, w=[1.0])


def test_float32_and_column_inputs_give_the_float64_results():
    ref = nova_diagnostics([1.0, 3.0], TAU, A1, A2, LAST)
    f32 = nova_diagnostics(*(np.array(v, dtype=np.float32) for v in ([1.0, 3.0], TAU, A1, A2, LAST)))
    col = nova_diagnostics(*(np.array(v).reshape(-1, 1) for v in ([1.0, 3.0], TAU, A1, A2, LAST)))
    for d in (f32, col):
        assert d.metrics() == ref.metrics()
        assert d.w.dtype == np.float64 and d.w.tolist() == ref.w.tolist()


@pytest.mark.parametrize("p", [[0.0, 0.0], [1.0, -2.0]])
def test_no_positive_weight_sum_gives_nan_without_dividing(p):
    with np.errstate(all="raise"):
        d = nova_diagnostics(p, TAU, A1, A2, LAST)
    assert d.w.shape == (2,) and d.w.dtype == np.float64 and np.isnan(d.w).all()
    assert all(np.isnan(v) for v in d.metrics().values())


def test_a_zero_anorm_reads_inf_and_nan_without_a_warning():
    """||a_0||_1 = 0 (a proximal solver with lr mu > 1): chi2's (p_0 - 0)^2 / 0 = inf, A's 0 / 0 = NaN."""
    with warnings.catch_warnings(), np.errstate(all="warn"):
        warnings.simplefilter("error")
        d = nova_diagnostics([1.0, 1.0], [1.0, 1.0], [0.0, 2.0], [0.0, 2.0], [0.0, 1.0])
    assert d.tau_eff == 1.0 and d.w.tolist() == [0.0, 1.0]
    assert d.chi2 == np.inf and np.isnan(d.A)
    assert (d.slowdown, d.B, d.C) == (1.0, 1.0, 2.0)


def test_mismatched_sizes_are_refused_with_every_size():
    with pytest.raises(ValueError, match="^" + re.escape(
            "p, tau, anorm, anorm2 and alast need one value per client each; got sizes [2, 1, 2, 2, 2]") + "$"):
        nova_diagnostics([1.0, 1.0], [1.0], A1, A2, LAST)
