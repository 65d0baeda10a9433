"""The graph-free step (hpcfl.client.program) against autograd: the same bits, or autograd kept.

A program replaces autograd only where its loss and gradient are bitwise autograd's, so the
checks here are bit comparisons (of the bytes: they tell +0.0 from -0.0), over single steps
and whole local-training runs, for every layer kind it takes.
"""

import numpy as np
import pytest
import torch
from torch import nn

from hpcfl import rng
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.client.program import compile_step
from hpcfl.client.trainer import Trainer
from hpcfl.models.cnn import LeNet5
from hpcfl.models.simple import LogReg, Mlp
from hpcfl.params import FlatModel

CPU = torch.device("cpu")


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().numpy().tobytes()


class Chain(nn.Module):
    """Every layer kind the program takes, in one chain (strided, padded, grouped, biasless convs)."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(2, 4, 3, stride=1, padding=1), nn.Tanh(), nn.Conv2d(4, 4, 3, stride=2, groups=2, bias=False),
            nn.ReLU(), nn.MaxPool2d(2, stride=1), nn.Identity(), nn.Flatten(1), nn.Linear(4 * 5 * 5, 7, bias=False),
            nn.ReLU(), nn.Linear(7, 5))

    def forward(self, x):
        return self.body(x)


class Functional(nn.Module):
    """A chain written with torch.flatten and F.relu calls in forward."""

    def __init__(self):
        super().__init__()
        self.conv, self.fc = nn.Conv2d(1, 3, 5), nn.Linear(3 * 12 * 12, 4)

    def forward(self, x):
        return self.fc(torch.flatten(torch.nn.functional.relu(self.conv(x)), 1))


MODELS = {
    "lenet5_cifar": (lambda: LeNet5((3, 32, 32), 10), (3, 32, 32), 10),
    "lenet5_mnist": (lambda: LeNet5((1, 28, 28), 10), (1, 28, 28), 10),
    "mlp_relu": (lambda: Mlp(64, (32, 16), 10, "relu"), (64,), 10),
    "mlp_tanh_images": (lambda: Mlp(64, (24,), 10, "tanh"), (1, 8, 8), 10),
    "logreg": (lambda: LogReg(20, 3), (20,), 3),
    "chain": (Chain, (2, 14, 14), 5),
    "functional": (Functional, (1, 16, 16), 4),
}


def make(name, dtype=torch.float32, n=120, seed=0):
    build, shape, classes = MODELS[name]
    torch.manual_seed(seed)
    model = FlatModel(build(), CPU, dtype)
    x = torch.randn(n, *shape, dtype=dtype)
    y = torch.randint(0, classes, (n,))
    return model, x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_program_is_made_and_its_step_is_autograds_bit_for_bit(name, dtype):
    model, x, y = make(name, dtype)
    program, why = compile_step(model, x[:4], y[:4])
    assert program is not None, why
    for lo, hi in [(0, 32), (32, 33), (40, 77)]:   # full, one-sample and odd batches
        loss, grad = program.loss_grad(x[lo:hi], y[lo:hi])
        mine = (bits(loss), bits(grad))
        ref_loss = torch.nn.functional.cross_entropy(model.module(x[lo:hi]), y[lo:hi])
        ref = model.grad_into(ref_loss)
        assert mine == (bits(ref_loss), bits(ref)), f"{name}: batch {lo}:{hi} differs"


def train_both(name, spec, steps=25, batch=8, dtype=torch.float32):
    """The same client trained through the program and through autograd: (result, result)."""
    out = []
    for step in ("auto", "autograd"):
        model, x, y = make(name, dtype)
        tr = Trainer(model, x, y, batch, step=step)
        assert (tr.program is not None) == (step == "auto"), tr.why_autograd
        x0 = model.flat.detach().clone()
        gen = rng.torch_generator(CPU, 0, rng.CLIENT_TRAIN, 0, 5)
        corr = torch.linspace(-0.01, 0.01, model.num_params, dtype=dtype)
        out.append(tr.train(x0, torch.arange(3, 100), steps, LocalSolver(spec), gen, corr, spec.lr))
    return out


@pytest.mark.parametrize("name", ["lenet5_mnist", "mlp_relu", "chain"])
def test_local_training_through_the_program_equals_autograds(name):
    """25 steps with momentum, weight decay, a proximal term and a correction: every bit the same."""
    spec = SolverSpec(lr=0.05, momentum=0.9, weight_decay=1e-3, mu=0.1, decay=0.99)
    a, b = train_both(name, spec)
    assert bits(a.delta) == bits(b.delta)
    assert (a.loss, a.steps, a.anorm, a.samples) == (b.loss, b.steps, b.anorm, b.samples)
    assert a.delta.abs().max() > 0


def test_a_zero_gradient_is_positive_zero_as_autograd_accumulates_it():
    """Weight gradient g_i * x_j with a zero feature and g_i < 0: the product is -0.0, and
    autograd's accumulation into a zeroed .grad gives +0.0; the program must too."""
    torch.manual_seed(0)
    model = FlatModel(Mlp(4, (), 2, "relu"), CPU, torch.float32)
    x, y = torch.tensor([[1.0, 0.0, 2.0, 0.0]]), torch.tensor([1])
    program, why = compile_step(model, x, y)
    assert program is not None, why
    grad = program.loss_grad(x, y)[1].clone()
    weight = grad[:8].view(2, 4)
    assert weight[1, 1] == 0 and weight[1, 0] < 0    # the negative row, at the zero feature
    assert not torch.signbit(weight[:, 1]).any() and not torch.signbit(weight[:, 3]).any()
    ref = model.grad_into(torch.nn.functional.cross_entropy(model.module(x), y))
    assert bits(grad) == bits(ref)


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 4), nn.Dropout(0.5), nn.Linear(4, 2))

    def forward(self, x):
        return self.body(x)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 2)

    def forward(self, x):
        return self.b(self.a(x) + x)


class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)

    def forward(self, x):
        return self.a(torch.relu(self.a(x)))


class SamePadding(nn.Module):
    def __init__(self):
        super().__init__()
        self.c, self.f = nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten(1)

    def forward(self, x):
        return self.f(self.c(x))


class OwnLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 2)

    def forward(self, x):
        return self.a(x)

    def loss(self, out, y):
        return out.square().mean()


class WithNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.n = nn.Linear(6, 2), nn.BatchNorm1d(2)

    def forward(self, x):
        return self.n(self.a(x))


@pytest.mark.parametrize("module, shape, reason", [
    (WithDropout, (6,), "layer Dropout"),
    (Residual, (6,), "one chain"),
    (Shared, (6,), "shared by layers"),
    (SamePadding, (1, 5, 5), "padding 'same'"),
    (OwnLoss, (6,), "its own loss"),
    (WithNorm, (6,), "float buffers"),
    (lambda: nn.Sequential(nn.Linear(6, 3), nn.Softmax(1)), (6,), "layer Softmax"),
])
def test_models_outside_the_chain_keep_autograd_and_say_why(module, shape, reason):
    torch.manual_seed(0)
    model = FlatModel(module(), CPU, torch.float32)
    program, why = compile_step(model, torch.randn(4, *shape), torch.randint(0, 2, (4,)))
    assert program is None and reason in why
    tr = Trainer(model, torch.randn(20, *shape), torch.randint(0, 2, (20,)), 4)
    assert tr.program is None and reason in tr.why_autograd


def test_linear_on_a_3d_input_keeps_autograd():
    """nn.Linear over (B, T, F) runs through matmul, not addmm: the program refuses it in its check."""
    model = FlatModel(nn.Sequential(nn.Linear(3, 2), nn.Flatten(1)), CPU, torch.float32)
    program, why = compile_step(model, torch.randn(4, 5, 3), torch.randint(0, 2, (4,)))
    assert program is None and "non-2-d" in why


def test_a_replica_trains_its_own_copy():
    model, x, y = make("mlp_relu")
    tr = Trainer(model, x, y, 8)
    rep = tr.replica()
    assert rep.model is not model and rep.program is not None and rep.x is tr.x
    before = bits(model.flat)
    x0 = model.flat.detach().clone()
    gen = rng.torch_generator(CPU, 0, rng.CLIENT_TRAIN, 0, 1)
    res = rep.train(x0, torch.arange(0, 40), 5, LocalSolver(SolverSpec(lr=0.1)), gen, None, 0.1)
    assert bits(model.flat) == before   # the original model is untouched
    gen = rng.torch_generator(CPU, 0, rng.CLIENT_TRAIN, 0, 1)
    ref = tr.train(x0, torch.arange(0, 40), 5, LocalSolver(SolverSpec(lr=0.1)), gen, None, 0.1)
    assert bits(res.delta) == bits(ref.delta) and np.isfinite(res.loss)
