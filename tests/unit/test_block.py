"""Vectorised client blocks (hpcfl.client.block) against the sequential trainer.

The sequential :class:`Trainer` is the reference: a block must give every client the same
batches, the same normaliser ||a||_1 (bitwise), and the same update within float rounding;
and a client's result must not depend on which clients share its group.
"""

import numpy as np
import pytest
import torch

from hpcfl import rng
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.client.block import BlockTrainer, unsupported
from hpcfl.client.trainer import Trainer
from hpcfl.models.quadratic import Quadratic
from hpcfl.models.simple import LogReg
from hpcfl.params import FlatModel

D = torch.float64
SPECS = {
    "sgd": SolverSpec(lr=0.1),
    "all": SolverSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, mu=0.3, decay=0.97),
}


def setup(model_cls, n_total=300, dim=12, classes=5):
    torch.manual_seed(0)
    module = model_cls(dim, classes) if model_cls is LogReg else model_cls(dim)
    model = FlatModel(module, torch.device("cpu"), D)
    x = torch.randn(n_total, dim, dtype=D)
    y = torch.randint(0, classes, (n_total,))
    with torch.no_grad():
        model.flat.copy_(torch.randn(model.length, dtype=D) * 0.1)
    return model, x, y


def clients(n_clients=7, seed=0):
    """(indices, steps) of clients with unequal sizes (partial last batches) and steps."""
    g = np.random.default_rng(seed)
    sizes = g.integers(3, 40, n_clients)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    steps = g.integers(1, 12, n_clients)
    return [(torch.arange(s, s + k), int(t)) for s, k, t in zip(starts, sizes, steps)]


def run_sequential(model, x, y, spec, cl, corrs):
    tr = Trainer(model, x, y, batch_size=8)
    x0 = model.flat.detach().clone()
    out = []
    for c, ((idx, steps), corr) in enumerate(zip(cl, corrs)):
        gen = rng.torch_generator(torch.device("cpu"), 0, rng.CLIENT_TRAIN, 0, c)
        out.append(tr.train(x0, idx, steps, LocalSolver(spec), gen, corr, spec.lr))
    model.load(x0)
    return x0, out


def run_block(model, x, y, spec, cl, corrs, group_size=64):
    bt = BlockTrainer(model, x, y, batch_size=8, group_size=group_size)
    x0 = model.flat.detach().clone()
    jobs = [(idx, steps, rng.torch_generator(torch.device("cpu"), 0, rng.CLIENT_TRAIN, 0, c))
            for c, (idx, steps) in enumerate(cl)]
    return bt.train(x0, jobs, spec, spec.lr, corrs)


@pytest.mark.parametrize("model_cls", [LogReg, Quadratic])
@pytest.mark.parametrize("kind", ["sgd", "all"])
def test_block_equals_sequential_within_rounding(model_cls, kind):
    """Same batches, same solver: updates agree to 1e-12 relative, ||a||_1 and samples exactly."""
    model, x, y = setup(model_cls)
    cl = clients()
    spec = SPECS[kind]
    P = model.num_params
    corrs = [None] * len(cl)
    if kind == "all":   # a SCAFFOLD-like correction on some clients
        corrs = [torch.randn(P, dtype=D) * 0.01 if c % 2 else None for c in range(len(cl))]
    _, seq = run_sequential(model, x, y, spec, cl, corrs)
    blk = run_block(model, x, y, spec, cl, corrs)
    for a, b in zip(seq, blk):
        assert (a.steps, a.samples) == (b.steps, b.samples)
        assert (a.anorm, a.anorm2, a.alast) == (b.anorm, b.anorm2, b.alast)
        scale = float(a.delta.abs().max())
        assert float((a.delta - b.delta).abs().max()) <= 1e-12 * scale
        assert b.loss == pytest.approx(a.loss, rel=1e-12)


def test_a_client_result_does_not_depend_on_its_group():
    """Group sizes 1, 3 and 64 give bitwise the same rows (what makes rank counts irrelevant)."""
    model, x, y = setup(LogReg)
    cl = clients(11, seed=3)
    spec = SPECS["all"]
    ref = run_block(model, x, y, spec, cl, None, group_size=64)
    for gs in (1, 3):
        got = run_block(model, x, y, spec, cl, None, group_size=gs)
        for a, b in zip(ref, got):
            assert torch.equal(a.delta, b.delta) and a.loss == b.loss


def test_models_the_block_cannot_take_say_why():
    bn = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.device("cpu"), D)
    assert "buffers" in unsupported(bn, None, SPECS["sgd"])
    drop = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)), torch.device("cpu"), D)
    assert "dropout" in unsupported(drop, None, SPECS["sgd"])
    lin = FlatModel(LogReg(4, 3), torch.device("cpu"), D)
    assert "augmentation" in unsupported(lin, lambda xb, g: xb, SPECS["sgd"])
    assert unsupported(lin, None, SPECS["sgd"]) is None
