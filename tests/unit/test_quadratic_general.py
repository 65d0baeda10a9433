"""Quadratic objectives beyond FedNova's: diagonal curvatures, gradient noise, a starting point.

The ``quadratic`` dataset and model (hpcfl/data/quadratic.py, hpcfl/models/quadratic.py) give
F_i(x) = 1/2 sum_j h_ij (x_j - c_ij)^2 with noisy gradients h_i (x - c_i) + n, for GIFT's Fig. 1
toy (Chen et al. 2023; check C1) and its noisy heterogeneous quadratics (D1-D4: test_gift_quadratics.py), while
FedNova's plain form 1/2 ||x - e_i||^2 stays as it was. Every expected value is a hand
computation or a closed form written here; engine runs go through prepare/run in float64 on
one rank (tests/runner.run_memory).
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import run_memory

from hpcfl.config import options
from hpcfl.data.quadratic import QuadraticOptions, load_quadratic
from hpcfl.errors import ConfigError
from hpcfl.models import build_model
from hpcfl.models.quadratic import Quadratic, QuadraticModelOptions

D = torch.float64


def quad_job(quadratic, num_clients, tau, lr, rounds, init=0.0, vectorize="off", eval_every=0):
    """FedAvg (uniform weights, fixed tau, batch 1, full participation) on a quadratic dataset."""
    return {
        "run": {"seed": 0, "rounds": rounds, "eval_every": eval_every},
        "data": {"dataset": "quadratic", "partition": "natural", "num_clients": num_clients,
                 "quadratic": quadratic},
        "model": {"name": "quadratic", "quadratic": {"init": init}},
        "algorithm": {"name": "fedavg", "weights": "uniform", "steps": "fixed", "local_steps": tau, "lr": lr,
                      "batch_size": 1},
        "runtime": {"dtype": "float64", "threads": 1, "progress": "none", "vectorize": vectorize},
    }


def test_plain_form_unchanged():
    """FedNova's form keeps its layout and values: rows e_i of shape (dim,), x starting at 0.

    Centres 1 and 3, tau = 2, lr = 0.1, one round by hand: client 1 goes 0 -> 0.1 -> 0.19, client 2
    0 -> 0.3 -> 0.57 (x <- x - 0.1 (x - e)), so x = (0.19 + 0.57) / 2 = 0.38, and the test loss is
    mean_i 1/2 (0.38 - e_i)^2 = (0.1922 + 3.4322) / 2 = 1.8122.
    """
    ds = load_quadratic(QuadraticOptions(dim=1, centers=(1.0, 3.0)), None, 0)
    assert ds.input_shape == (1,) and ds.x_train.tolist() == [[1.0], [3.0]]
    assert [c.tolist() for c in ds.natural_clients] == [[0], [1]]
    x, metrics, _ = run_memory(quad_job({"dim": 1, "centers": [1.0, 3.0]}, 2, 2, 0.1, 1, eval_every=1),
                               MPI.COMM_SELF)
    assert x[0] == pytest.approx(0.38, abs=1e-15)
    assert metrics[-1]["test_loss"] == pytest.approx(1.8122, abs=1e-14)


def test_unit_curvature_general_form_equals_plain_form():
    """With h = 1 and no noise the general form's objective is the plain one, so the same job gives
    the same model to the last bit (h (x - c) with h = 1.0 and n = 0 change no float), in the
    sequential loop and in vectorised blocks."""
    plain = {"dim": 2, "centers": [1.0, -2.0, 0.5, 4.0, -3.0, 1.5]}
    unit = dict(plain, curvatures=[1.0] * 6)
    for vec in ("off", "on"):
        a, _, _ = run_memory(quad_job(plain, 3, 5, 0.1, 3, init=0.25, vectorize=vec), MPI.COMM_SELF)
        b, _, _ = run_memory(quad_job(unit, 3, 5, 0.1, 3, init=0.25, vectorize=vec), MPI.COMM_SELF)
        assert np.array_equal(a, b) and a[0] != 0.25


def test_general_loss_and_gradient_by_hand():
    """Loss and gradient of the general form against hand numbers.

    x = [1, -2]. Row 1: c = [3, 1], h = [2, 0.5], n = [0.25, -1]: loss 1/2 (2 * 4 + 0.5 * 9) + (0.25 + 2)
    = 8.5, gradient [2 * (-2) + 0.25, 0.5 * (-3) - 1] = [-3.75, -2.5]. Row 2: c = 0, h = 1,
    n = [-0.25, 1]: loss 1/2 (1 + 4) + (-0.25 - 2) = 0.25, gradient [0.75, -1]. The batch of both:
    loss 4.375, gradient [-1.5, -1.75]. ``batched_loss_grad`` with weights 1/2 gives the same, and a
    second client at x = [0, 0] holding row 2 plus a padded row (weight 0): loss 1/2 (0 + 0) + n . 0 = 0,
    gradient h (0 - 0) + n = [-0.25, 1]. The plain form: x = [1, -2], e = [3, 1]: loss 1/2 (4 + 9) = 6.5,
    gradient x - e = [-2, -3].
    """
    model = build_model("quadratic", QuadraticModelOptions(init=-100.0), (3, 2), 1).to(D)
    assert model.x.tolist() == [-100.0, -100.0]
    rows = torch.tensor([[[3.0, 1.0], [2.0, 0.5], [0.25, -1.0]],
                         [[0.0, 0.0], [1.0, 1.0], [-0.25, 1.0]]], dtype=D)
    y = torch.zeros(2, dtype=torch.int64)
    with torch.no_grad():
        model.x.copy_(torch.tensor([1.0, -2.0]))
    for batch, loss, grad in ((rows[:1], 8.5, [-3.75, -2.5]), (rows[1:], 0.25, [0.75, -1.0]),
                              (rows, 4.375, [-1.5, -1.75])):
        value = model.loss(model(batch), y[: len(batch)])
        (g,) = torch.autograd.grad(value, model.x)
        assert float(value.detach()) == pytest.approx(loss, abs=1e-14)
        assert g.tolist() == pytest.approx(grad, abs=1e-14)
    w = torch.tensor([[1.0, -2.0], [0.0, 0.0]], dtype=D)
    targets = torch.stack([rows, torch.stack([rows[1], rows[0]])])      # (G=2, B=2, 3, dim=2)
    weight = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=D)
    loss, grad = Quadratic.batched_loss_grad(w, targets, y, weight)
    assert loss.tolist() == pytest.approx([4.375, 0.0], abs=1e-14)
    assert grad.numpy() == pytest.approx(np.array([[-1.5, -1.75], [-0.25, 1.0]]), abs=1e-14)
    # the plain form through the same function: 1/2 ||x - e||^2, gradient x - e
    loss, grad = Quadratic.batched_loss_grad(w[:1], torch.tensor([[[3.0, 1.0]]], dtype=D), y, weight[1:, :1])
    assert loss.tolist() == [0.5 * (4.0 + 9.0)] and grad.tolist() == [[-2.0, -3.0]]
    assert build_model("quadratic", QuadraticModelOptions(), (5,), 1).x.tolist() == [0.0] * 5
    with pytest.raises(ConfigError, match="does not fit input shape"):
        build_model("quadratic", QuadraticModelOptions(), (4, 2), 1)


def test_noise_pool_is_centred_with_the_requested_std():
    """The general dataset's layout, its draws and its noise pool.

    - Draw order: the centres are the seed's first normal draws, exactly as in the plain form,
      and the curvatures the next uniform draws of the same generator (numpy's generator replayed
      here). Each client holds ``samples`` rows [c_i; h_i; n_s]; the test set is one row per client
      with n = 0.
    - The noise pool is centred per client (mean 0 up to rounding, < 1e-12) and its std is
      sigma sqrt((S - 1) / S) = 0.5 sqrt(499/500) = 0.4995 for a centred pool of S = 500; with 100,000
      values the sample std is within 0.01 of it (its own std is about 0.0011).
    """
    q = QuadraticOptions(num_clients=4, dim=50, std=5.0, seed=7, curvature_low=0.1, curvature_high=2.0,
                         noise=0.5, samples=500)
    ds = load_quadratic(q, None, 0)
    gen = np.random.default_rng(7)
    c = gen.normal(0.0, 5.0, size=(4, 50))
    h = gen.uniform(0.1, 2.0, size=(4, 50))
    assert np.array_equal(load_quadratic(QuadraticOptions(num_clients=4, dim=50, std=5.0, seed=7), None, 0).x_train, c)
    assert ds.input_shape == (3, 50) and ds.x_train.shape == (2000, 3, 50) and ds.y_train.shape == (2000,)
    assert [a.tolist() for a in ds.natural_clients] == [list(range(i * 500, (i + 1) * 500)) for i in range(4)]
    rows = ds.x_train.reshape(4, 500, 3, 50)
    assert np.array_equal(rows[:, :, 0], np.broadcast_to(c[:, None], (4, 500, 50)))
    assert np.array_equal(rows[:, :, 1], np.broadcast_to(h[:, None], (4, 500, 50)))
    assert np.array_equal(ds.x_test, np.stack([c, h, np.zeros_like(c)], axis=1))
    n = rows[:, :, 2]
    assert np.abs(n.mean(axis=1)).max() < 1e-12
    assert n.std() == pytest.approx(0.5 * np.sqrt(499 / 500), abs=0.01)


def test_noise_enters_the_local_gradient():
    """One client, dim 3, h = [1, 2, 0.5], c = [1, -1, 2], pool of S = 2 rows with n_2 = -n_1, tau = 2,
    lr 0.1, batch 1: the two steps use n_1 and n_2 in some order, and two steps of
    x <- x - eta (h (x - c) + n) from x_0 give x = c + (1 - eta h)^2 (x_0 - c) +- eta^2 h n_1 (the
    noise of step 1 is damped by (1 - eta h), that of step 2 is not: -eta n_a (1 - eta h) - eta n_b
    with n_b = -n_a). The same sign holds in every coordinate (one row per step); vectorised blocks agree.
    """
    q = {"dim": 3, "centers": [1.0, -1.0, 2.0], "curvatures": [1.0, 2.0, 0.5], "noise": 0.5, "samples": 2,
         "seed": 3}
    n1 = load_quadratic(options.build(QuadraticOptions, q, "data.quadratic"), None, 0).x_train[0, 2]
    c, h, x0, eta = np.array([1.0, -1.0, 2.0]), np.array([1.0, 2.0, 0.5]), 0.5, 0.1
    det = c + (1 - eta * h) ** 2 * (x0 - c)
    got = [run_memory(quad_job(q, 1, 2, eta, 1, init=x0, vectorize=v), MPI.COMM_SELF)[0] for v in ("off", "on")]
    sign = np.sign((got[0] - det)[0] / n1[0])
    assert sign in (-1.0, 1.0)   # 0 would mean the noise never reached the gradient
    assert got[0] == pytest.approx(det + sign * eta**2 * h * n1, abs=1e-13)
    assert got[1] == pytest.approx(got[0], abs=1e-13)


def test_bad_options_name_the_fix():
    """Noise without a pool, curvature rows that do not match the clients, half a range: each is a
    ConfigError that names the key and what to set."""
    cases = [({"noise": 0.5}, "needs samples > 1"),
             ({"dim": 2, "centers": [0.0, 1.0, 2.0, 3.0], "curvatures": [1.0, 1.0]}, "give one row of dim values"),
             ({"curvature_low": 0.1}, "set both curvature_low and curvature_high"),
             ({"curvature_low": 2.0, "curvature_high": 0.1}, "swap them"),
             ({"dim": 1, "num_clients": 1, "curvatures": [1.0], "curvature_low": 0.1, "curvature_high": 1.0},
              "not both"),
             ({"curvatures": [0.0]}, "must be greater than 0")]
    for table, words in cases:
        with pytest.raises(ConfigError, match=words):
            options.build(QuadraticOptions, table, "data.quadratic")


# GIFT's Fig. 1: L1 = (w + 2)^2 = 1/2 * 2 (w + 2)^2 and L2 = (w - 10)^2 / 5 = 1/2 * 0.4 (w - 10)^2.
TOY = {"dim": 1, "centers": [-2.0, 10.0], "curvatures": [2.0, 0.4]}


@pytest.mark.parametrize("tau,table_value,rounds", [(1, 0.0, 150), (10, 0.631261, 40), (64, 3.049131, 12)])
def test_C1_toy_fixed_point(tau, table_value, rounds):
    """FedAvg with fixed tau on GIFT's toy from w_0 = -100, eta = 0.05, full-batch GD.

    Local GD on client i maps w to c_i + (1 - eta h_i)^tau (w - c_i), so a round is the affine map
    w <- w_bar + r (w - w_bar) with a = (1 - 2 eta)^tau, b = (1 - 0.4 eta)^tau, r = (a + b) / 2 and the
    fixed point w_bar = 2 (4 + a - 5 b) / (2 - a - b) (spec C1 table: 0, 0.631261, 3.049131, rounded to
    6 decimals). After R rounds w_R = w_bar + r^R (w_0 - w_bar) exactly. For tau = 10 and 64 the
    transient is below 1e-8 after 40 and 12 rounds (r = 0.58, 0.14), so w_R is the fixed point; for
    tau = 1 (r = 0.94) convergence to 1e-6 would take ~340 rounds, so the run stops at 150 and the
    check includes the transient (-100 * 0.94^150 = -0.0094). Vectorised blocks give the same w to 1e-12.
    """
    eta = 0.05
    a, b = (1 - 2 * eta) ** tau, (1 - 0.4 * eta) ** tau
    w_bar = 2 * (4 + a - 5 * b) / (2 - a - b)
    assert w_bar == pytest.approx(table_value, abs=1e-6)
    expected = table_value + ((a + b) / 2) ** rounds * (-100.0 - table_value)
    seq, _, _ = run_memory(quad_job(TOY, 2, tau, eta, rounds, init=-100.0), MPI.COMM_SELF)
    vec, _, _ = run_memory(quad_job(TOY, 2, tau, eta, rounds, init=-100.0, vectorize="on"), MPI.COMM_SELF)
    assert seq[0] == pytest.approx(expected, abs=1e-6)
    assert abs(vec[0] - seq[0]) < 1e-12
