"""FedLGA's g over the whole local objective (``grad_proxy = "full_grad"``, the paper's G, Eq. 6).

The gradient of F_i, the mean loss over all of the client's training samples, without weight decay,
at the client's last iterate x^t + D_i, checked against numpy's closed form for multinomial logistic
regression; and its cost on the simulated clock: a slow client's pass of ceil(n_i / B) steps.
"""

import types

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.algorithms.fedlga import GRADIENTS
from hpcfl.algorithms.fedlga_grad import FULL_GRAD_CHUNK
from hpcfl.client.trainer import LocalClients
from hpcfl.engine import simulation

WD, BATCH = 0.01, 16
# digits (64 features, 10 classes) on 7 clients, logistic regression in float64, weight decay on: the
# objective the local solver follows has the L2 term, the paper's F_i does not
LOGREG = {"model.name": "logreg", "runtime.dtype": "float64", "algorithm.weight_decay": WD,
          "algorithm.batch_size": BATCH}


def numpy_full_gradient(X: np.ndarray, y: np.ndarray, w: np.ndarray, classes: int) -> np.ndarray:
    """grad of (1/n) sum_k CE(W x_k + b, y_k) in the flat layout [W (C, F) | b (C,)]: with softmax p,
    dl/dz = p - onehot(y), so grad W = (p - Y)^T X / n and grad b = sum_k (p - Y)_k / n."""
    F = X.shape[1]
    W, b = w[: classes * F].reshape(classes, F), w[classes * F:]
    z = X @ W.T + b
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(len(y)), y] -= 1.0
    return np.concatenate([(p.T @ X).ravel(), p.sum(axis=0)]) / len(y)


def test_full_gradient_is_the_gradient_of_the_whole_local_objective():
    """The gradient LgaRule computes for full_grad (GRADIENTS["full_grad"], full_gradient) equals numpy's full-batch gradient of the mean cross-entropy over all n_i of the
    client's samples at x^t + D_i, to 1e-12 relative: not one batch of B = 16 (batch noise), not with the
    job's weight decay 0.01, and summed over more than one chunk of FULL_GRAD_CHUNK samples."""
    s = simulation.prepare(config.from_dict(job(**LOGREG)), MPI.COMM_SELF)
    cohort = np.arange(len(s.sizes))
    clients = LocalClients(s, 0, cohort)
    assert clients.weight_decay == WD          # the job's local objective has the L2 term
    clients.x0 = torch.from_numpy(np.asarray(s.model.numpy(), dtype=np.float64))
    P = s.model.num_params
    j = int(np.argmax(s.sizes))
    n = int(s.sizes[j])
    assert n > FULL_GRAD_CHUNK > BATCH, n      # several chunks, many batches
    rng = np.random.default_rng(0)
    delta = 0.3 * rng.standard_normal(P)
    ctx = types.SimpleNamespace(clients=clients, sizes=s.sizes[cohort])
    g = GRADIENTS["full_grad"](ctx, j, types.SimpleNamespace(delta=torch.from_numpy(delta)), P)

    idx = s.parts[j]                           # the partition's indices of client j (cohort = ids here)
    X, y = s.dataset.x_train[idx].reshape(n, -1).astype(np.float64), s.dataset.y_train[idx]
    want = numpy_full_gradient(X, y, clients.x0.numpy() + delta, s.dataset.num_classes)
    assert g.shape == (P,) and g.dtype == np.float64
    np.testing.assert_allclose(g, want, rtol=0, atol=1e-12 * np.abs(want).max())
    # the model goes back to x^t only when the caller says so (LgaRule.release: load_x0)
    np.testing.assert_array_equal(s.model.numpy(), clients.x0.numpy() + delta)


@pytest.mark.parametrize("proxy", ["full_grad", "last_grad"])
def test_the_clock_charges_a_slow_clients_full_pass(proxy):
    """With full_grad a slow client (tau_i = 2: one epoch of two) computes ceil(n_i / B) more steps'
    worth after training, so its arrival is (S_i + ceil(n_i / B)) c; a complete client's is S_i c
    (c = 0.01 s a step, transfers free). last_grad's one forward-backward is not charged."""
    table = job(**{**LOGREG, "algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 2,
                   "algorithm.local_steps": 0, "algorithm.local_epochs": 2, "algorithm.straggler.tau_max": 2,
                   "algorithm.lga.grad_proxy": proxy, "system.enabled": True, "system.compute_s": 0.01,
                   "system.uplink_mbps": 1e12, "system.downlink_mbps": 1e12})
    s = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    rows = []
    simulation.run(s, on_round=lambda m, c: rows.append(c))
    slow = 0
    for c in rows:
        n = s.sizes[c["client"]]
        passes = -(-n // BATCH)
        full = 2 * passes
        short = c["steps"] < full
        slow += int(short.sum())
        extra = np.where(short, passes, 0) if proxy == "full_grad" else 0
        np.testing.assert_allclose(c["sim_time"], (c["steps"] + extra) * 0.01, rtol=1e-6)
    assert slow > 0, "no slow client: the test would prove nothing"


@pytest.mark.parametrize("key", ["variant", "grad_proxy"])
def test_the_labels_say_the_same_in_the_help_the_defaults_and_the_docs(key, capsys):
    """The option help of ``variant`` and ``grad_proxy`` is what ``hpcfl config --defaults algorithm.lga``
    prints and, without its backticks, the meaning column of docs/algorithms/fedlga.md's table; and it
    says what the docs say: B_alg1's guard is not the paper's, full_grad is the paper's G, last_grad a
    one-mini-batch estimate with weight decay."""
    import dataclasses
    from pathlib import Path

    from hpcfl import cli
    from hpcfl.algorithms.fedlga import LgaOptions

    help_ = next(f for f in dataclasses.fields(LgaOptions) if f.name == key).metadata["help"]
    assert cli.main(["config", "--defaults", "algorithm.lga"]) == 0
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert help_ in printed
    doc = (Path(__file__).resolve().parents[2] / "docs" / "algorithms" / "fedlga.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith(f"| `{key}` |"))
    assert row.split(" | ")[2].removesuffix(" |").replace("`", "") == help_.removesuffix("; docs/algorithms/fedlga.md")
    want = {"variant": ["guard the paper does not have", "alpha_min = 0", "the proof's Delta"],
            "grad_proxy": ["full_grad = the paper's G", "no weight decay", "last_grad = a cheaper estimate",
                           "one mini-batch plus weight decay"]}[key]
    assert all(w in help_ for w in want), help_
