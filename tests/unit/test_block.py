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
from hpcfl.client.fused import kernel
from hpcfl.client.trainer import Trainer
from hpcfl.models.quadratic import Quadratic
from hpcfl.models.simple import LogReg
from hpcfl.params import FlatModel

D = torch.float64
HAVE_NUMBA = kernel() is not None
# (model, fused): each model through its compiled kernel and through the batched torch step
PATHS = [(LogReg, True), (LogReg, False), (Quadratic, True), (Quadratic, False)]
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


def run_block(model, x, y, spec, cl, corrs, group_size=64, fused=True, cohort=None):
    bt = BlockTrainer(model, x, y, batch_size=8, group_size=group_size, fused=fused)
    # logreg and the quadratic on CPU take a compiled kernel (C, else numba) whenever one is there: tests below test it
    assert (bt.fused is not None) == (fused and HAVE_NUMBA)
    x0 = model.flat.detach().clone()
    jobs = [(idx, steps, rng.torch_generator(torch.device("cpu"), 0, rng.CLIENT_TRAIN, 0, c))
            for c, (idx, steps) in enumerate(cl)]
    return bt.train(x0, jobs, spec, spec.lr, corrs, cohort=cohort)


@pytest.mark.parametrize("model_cls,fused", PATHS)
@pytest.mark.parametrize("kind", ["sgd", "all"])
def test_block_equals_sequential_within_rounding(model_cls, fused, kind):
    """Same batches, same solver: updates agree to 1e-12 relative, ||a||_1 and samples exactly."""
    model, x, y = setup(model_cls)
    cl = clients()
    spec = SPECS[kind]
    P = model.num_params
    corrs = [None] * len(cl)
    if kind == "all":   # a SCAFFOLD-like correction on some clients
        corrs = [torch.randn(P, dtype=D) * 0.01 if c % 2 else None for c in range(len(cl))]
    _, seq = run_sequential(model, x, y, spec, cl, corrs)
    blk = run_block(model, x, y, spec, cl, corrs, fused=fused)
    for a, b in zip(seq, blk):
        assert (a.steps, a.samples) == (b.steps, b.samples)
        assert (a.anorm, a.anorm2, a.alast) == (b.anorm, b.anorm2, b.alast)
        scale = float(a.delta.abs().max())
        assert float((a.delta - b.delta).abs().max()) <= 1e-12 * scale
        assert b.loss == pytest.approx(a.loss, rel=1e-12)


@pytest.mark.parametrize("fused", [True, False])
def test_a_client_result_does_not_depend_on_its_group(fused):
    """Group sizes 1, 3 and 64 give bitwise the same rows (what makes rank counts irrelevant)."""
    model, x, y = setup(LogReg)
    cl = clients(11, seed=3)
    spec = SPECS["all"]
    ref = run_block(model, x, y, spec, cl, None, group_size=64, fused=fused)
    for gs in (1, 3):
        got = run_block(model, x, y, spec, cl, None, group_size=gs, fused=fused)
        for a, b in zip(ref, got):
            assert torch.equal(a.delta, b.delta) and a.loss == b.loss


def lenet_data():
    from hpcfl.models.cnn import LeNet5

    torch.manual_seed(0)
    model = FlatModel(LeNet5((1, 16, 16), 5), torch.device("cpu"), D)
    g = torch.Generator().manual_seed(1)
    return model, torch.randn(300, 1, 16, 16, dtype=D, generator=g), torch.randint(0, 5, (300,), generator=g)


@pytest.mark.parametrize("model", ["logreg", "quadratic", "lenet5"])
def test_padding_and_finished_rows_leave_a_clients_result_bitwise_unchanged(model):
    """The torch paths run groups of a fixed width (the round's cohort, here 40, at most group_size):
    padding rows and rows whose client has finished compute at every step but never move their
    client. Against groups of one row (nothing padded, nothing finished), with momentum, decay,
    weight decay, the proximal term and corrections: bitwise equal."""
    model, x, y = lenet_data() if model == "lenet5" else setup(LogReg if model == "logreg" else Quadratic)
    cl = clients(9, seed=4)
    spec = SPECS["all"]
    corrs = [torch.randn(model.num_params, dtype=D) * 0.01 if c % 2 else None for c in range(len(cl))]
    ref = run_block(model, x, y, spec, cl, corrs, group_size=1, fused=False)
    for gs in (64, 4):   # one group of 40 rows (31 padding); groups of 4, the last padded
        got = run_block(model, x, y, spec, cl, corrs, group_size=gs, fused=False, cohort=40)
        for a, b in zip(ref, got):
            assert torch.equal(a.delta, b.delta), gs
            assert (a.loss, a.samples, a.steps, a.anorm) == (b.loss, b.samples, b.steps, b.anorm)


def test_a_finished_row_whose_weights_overflow_does_not_spoil_its_loss():
    """A row whose client has finished still computes its loss, weighted 0, at its final weights:
    0 * inf is NaN, so the block must not count it. lr 1e160 takes the 1-step client's x to about
    1e160, where 1/2 ||x - e||^2 overflows; its own loss, at x0, is 1/2 ||x0 - e||^2, finite."""
    model = FlatModel(Quadratic(2), torch.device("cpu"), D)
    x = torch.arange(16, dtype=D).view(8, 2) / 10
    bt = BlockTrainer(model, x, torch.zeros(8, dtype=torch.int64), batch_size=4, fused=False)
    x0 = torch.zeros(2, dtype=D)
    jobs = [(torch.arange(0, 4), 3, torch.Generator().manual_seed(0)), (torch.arange(4, 8), 1, torch.Generator())]
    short = bt.train(x0, jobs, SolverSpec(lr=1e160), 1e160)[1]
    e = x[4:8]
    assert short.loss == float((0.5 * (e**2).sum(1)).mean())
    torch.testing.assert_close(short.delta, -1e160 * (x0 - e).mean(0), rtol=1e-15, atol=0)   # x0 - lr * grad


def test_cnn_block_through_vmap_equals_sequential():
    """LeNet-5 goes through vmap of its forward, with its compiled pooling folded over the group."""
    model, x, y = lenet_data()
    cl = clients(5, seed=2)
    spec = SPECS["all"]
    _, seq = run_sequential(model, x, y, spec, cl, [None] * len(cl))
    blk = run_block(model, x, y, spec, cl, [None] * len(cl), fused=False)
    for a, b in zip(seq, blk):
        assert (a.steps, a.anorm) == (b.steps, b.anorm)
        assert float((a.delta - b.delta).abs().max()) <= 1e-12 * float(a.delta.abs().max())


def test_models_the_block_cannot_take_say_why():
    bn = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)), torch.device("cpu"), D)
    assert "buffers" in unsupported(bn, None, SPECS["sgd"])
    drop = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)), torch.device("cpu"), D)
    assert "dropout" in unsupported(drop, None, SPECS["sgd"])
    lin = FlatModel(LogReg(4, 3), torch.device("cpu"), D)
    assert "augmentation" in unsupported(lin, lambda xb, g: xb, SPECS["sgd"])
    assert unsupported(lin, None, SPECS["sgd"]) is None


needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="no compiled group kernel (no C compiler and no numba)")


@needs_numba
def test_fused_step_by_hand():
    """One sample, W = 0: softmax is uniform, so the step is hand-computable.

    C = 3, x = (2, -1), y = 1, lr = 0.5: dl/dz = (1/3, -2/3, 1/3), dl/dW = dl/dz x^T,
    dl/db = dl/dz, loss = log 3; the new weights are -lr times the gradient.
    """
    model = FlatModel(LogReg(2, 3), torch.device("cpu"), D)
    with torch.no_grad():
        model.flat.zero_()
    x = torch.tensor([[2.0, -1.0]], dtype=D)
    y = torch.tensor([1])
    bt = BlockTrainer(model, x, y, batch_size=4)
    gen = torch.Generator().manual_seed(0)
    (res,) = bt.train(model.flat.clone(), [(torch.tensor([0]), 1, gen)], SolverSpec(lr=0.5), 0.5)
    t = 1 / 3
    dz = np.array([t, t - 1, t])
    want = -0.5 * np.concatenate([np.outer(dz, [2.0, -1.0]).ravel(), dz])
    np.testing.assert_allclose(res.delta.numpy(), want, rtol=1e-15, atol=0)
    assert res.loss == pytest.approx(np.log(3), rel=1e-15)
    assert (res.steps, res.samples, res.anorm) == (1, 1, 1.0)


@needs_numba
def test_fused_float32_and_a_far_wrong_class_stay_finite():
    """float32, as the engine runs logreg: within float32 rounding of the sequential loop, and a
    sample whose class has a logit 200 below the largest keeps a finite loss of about 200
    (its probability underflows; the log-sum-exp form does not)."""
    torch.manual_seed(1)
    model = FlatModel(LogReg(6, 4), torch.device("cpu"), torch.float32)
    x = torch.randn(40, 6)
    y = torch.randint(0, 4, (40,))
    with torch.no_grad():
        model.flat.copy_(torch.randn(model.length) * 0.1)
    cl = clients(5, seed=2)
    cl = [(idx % 40, steps) for idx, steps in cl]
    spec = SPECS["all"]
    x0 = model.flat.detach().clone()
    tr = Trainer(model, x, y, batch_size=8)
    seq = [tr.train(x0, idx, steps, LocalSolver(spec), rng.torch_generator(torch.device("cpu"), 0, rng.CLIENT_TRAIN,
                                                                           0, c), None, spec.lr)
           for c, (idx, steps) in enumerate(cl)]
    model.load(x0)
    blk = run_block(model, x, y, spec, cl, None)
    for a, b in zip(seq, blk):
        assert float((a.delta - b.delta).abs().max()) <= 1e-5 * float(a.delta.abs().max())
        assert b.loss == pytest.approx(a.loss, rel=1e-5)

    far = FlatModel(LogReg(1, 2), torch.device("cpu"), torch.float32)
    with torch.no_grad():
        far.flat.copy_(torch.tensor([100.0, -100.0, 0.0, 0.0]))   # z = (100, -100) at x = 1
    bt = BlockTrainer(far, torch.ones(1, 1), torch.tensor([1]), batch_size=1)
    (res,) = bt.train(far.flat.clone(), [(torch.tensor([0]), 1, torch.Generator())], SolverSpec(lr=1e-3), 1e-3)
    assert res.loss == pytest.approx(200.0, rel=1e-6)
    assert torch.isfinite(res.delta).all()


@pytest.mark.parametrize("fused", [True, False])
def test_general_quadratic_block_equals_sequential(fused):
    """GIFT's form, rows [c; h; n] (3, dim): l = 1/2 sum_j h_j (x_j - c_j)^2 + n . x."""
    torch.manual_seed(2)
    dim = 9
    model = FlatModel(Quadratic(dim), torch.device("cpu"), D)
    x = torch.randn(300, 3, dim, dtype=D)
    x[:, 1] = x[:, 1].abs() + 0.5                 # positive curvatures
    y = torch.zeros(300, dtype=torch.int64)
    with torch.no_grad():
        model.flat.copy_(torch.randn(dim, dtype=D))
    cl, spec = clients(), SPECS["all"]
    corrs = [torch.randn(dim, dtype=D) * 0.01 if c % 3 else None for c in range(len(cl))]
    _, seq = run_sequential(model, x, y, spec, cl, corrs)
    blk = run_block(model, x, y, spec, cl, corrs, fused=fused)
    for a, b in zip(seq, blk):
        assert (a.steps, a.samples, a.anorm) == (b.steps, b.samples, b.anorm)
        assert float((a.delta - b.delta).abs().max()) <= 1e-12 * float(a.delta.abs().max())
        assert b.loss == pytest.approx(a.loss, rel=1e-12)


@needs_numba
def test_fused_quadratic_step_by_hand():
    """F(x) = 1/2 ||x - e||^2 from x = 0 with batch {e1, e2}: one step of lr 0.5 gives
    x = 0.5 * (e1 + e2) / 2, and the loss is the batch mean of ||e_b||^2 / 2."""
    model = FlatModel(Quadratic(2), torch.device("cpu"), D)
    x = torch.tensor([[1.0, 2.0], [3.0, -4.0]], dtype=D)
    bt = BlockTrainer(model, x, torch.zeros(2, dtype=torch.int64), batch_size=2)
    (res,) = bt.train(torch.zeros(2, dtype=D), [(torch.tensor([0, 1]), 1, torch.Generator())], SolverSpec(lr=0.5), 0.5)
    assert res.delta.tolist() == [1.0, -0.5]
    assert res.loss == (0.5 * 5 + 0.5 * 25) / 2


def test_auto_picks_blocks_by_rule_vmapped_models_on_a_gpu(monkeypatch, capsys):
    """runtime.vectorize = 'auto': on the CPU blocks only for closed-form models (logreg, the quadratic);
    on a GPU for every model that vmaps (an MLP, LeNet-5), never for dropout; a GPU's group size
    leaves three quarters of its memory (4 model copies per client)."""
    from types import SimpleNamespace

    from mpi4py import MPI

    from hpcfl import config
    from hpcfl.engine import simulation
    from hpcfl.client import block as blk
    from runner import job

    def setup(device, model="mlp", augment=None):
        table = job()
        if model != "mlp":
            table["model"] = {"name": model}
        s = simulation.prepare(config.from_dict(dict(table, runtime={**table["runtime"], "vectorize": "off"})),
                               MPI.COMM_SELF)
        s.model.device = torch.device(device)   # the rule reads the device kind only
        return blk.choose_block_trainer(config.from_dict(table), MPI.COMM_SELF, s.model, augment,
                                        s.algo.solver.spec, s.trainer.x, s.trainer.y), s.model

    assert setup("cpu")[0] is None
    assert setup("cpu", "logreg")[0] is not None
    memory = {"total": 80 * 2**30}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=memory["total"]))
    b, model = setup("cuda")
    assert b is not None and b.group_size == blk.GROUP_SIZE == 64
    assert "vmaps, on cuda; up to 64 clients a group" in capsys.readouterr().out
    memory["total"] = 4 * 4 * model.num_params * 4 * 10    # room for 10 clients' 4 copies in a quarter
    assert setup("cuda")[0].group_size == 10
    assert setup("cuda", augment=lambda xb, gen: xb)[0] is None   # per-sample randomness: not vmapped
