"""MaxPool2x2 is bitwise nn.MaxPool2d(2): values, indices, gradients, whole training runs."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.models import pool
from hpcfl.models.cnn import LeNet5
from hpcfl.models.pool import MaxPool2x2

needs_kernel = pytest.mark.skipif(pool.kernel() is None, reason="numba missing or HPCFL_NO_NUMBA: the torch path only")


@pytest.fixture(autouse=True)
def one_thread():
    """The layer takes its kernel with one torch thread only."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns (tells -0.0 from 0.0 and compares NaNs)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(ints[a.dtype]), b.view(ints[b.dtype]))


def tricky(shape, dtype=torch.float32, seed=0):
    """ReLU outputs with ties of every kind: zeros, equal positives, -0.0 beside 0.0, NaNs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.relu(torch.randn(shape, generator=g, dtype=dtype))
    x[..., :3, :] = 0.5                                   # whole windows of equal positives
    x[..., 3, ::3] = -0.0                                 # signed zeros among zeros
    x = torch.where(torch.rand(shape, generator=g, dtype=dtype) < 0.01, float("nan"), x)
    x[..., 4, 1] = float("nan")                            # at least one, second in its window
    return x


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 6, 28, 28), (3, 16, 10, 10), (2, 3, 7, 9)])
def test_values_and_indices_are_torchs(shape, dtype):
    x = tricky(shape, dtype)
    out, idx = pool._MaxPool2x2.apply(x)
    ref, ref_idx = F.max_pool2d(x, 2, return_indices=True)
    assert same_bits(out, ref)
    assert torch.equal(idx, ref_idx)
    assert torch.isnan(out).any() and (ref_idx % x.shape[3] % 2 == 1).any()   # the cases were there


@needs_kernel
def test_ties_keep_the_first_element():
    # hand case: a window of equal values keeps its top-left; a later greater one wins; NaN wins
    x = torch.tensor([[[[1.0, 1.0, 0.0, 2.0], [1.0, 1.0, 3.0, 2.0]]]])
    out, idx = pool._MaxPool2x2.apply(x)
    assert out.flatten().tolist() == [1.0, 3.0] and idx.flatten().tolist() == [0, 6]
    x[0, 0, 1, 0] = float("nan")
    out, idx = pool._MaxPool2x2.apply(x)
    assert torch.isnan(out[0, 0, 0, 0]) and idx.flatten().tolist() == [4, 6]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_are_torchs(dtype):
    x = tricky((4, 6, 12, 14), dtype, seed=1)
    g = torch.randn(4, 6, 6, 7, dtype=dtype)
    g[0, 0, 0, 0] = -0.0
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    MaxPool2x2()(a).backward(g)
    nn.MaxPool2d(2)(b).backward(g)
    assert same_bits(a.grad, b.grad)


@needs_kernel
def test_double_backward_is_torchs():
    x = torch.relu(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    w = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    grads = []
    for layer in (MaxPool2x2(), nn.MaxPool2d(2)):
        xr = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad((layer(xr) ** 2 * w).sum(), xr, create_graph=True)
        (ggx,) = torch.autograd.grad((gx ** 2).sum(), xr)
        grads.append((gx.detach(), ggx))
    assert same_bits(grads[0][0], grads[1][0]) and same_bits(grads[0][1], grads[1][1])
    assert grads[0][1].abs().sum() > 0


def test_falls_back_to_torch_where_the_kernel_does_not_apply(monkeypatch):
    x = tricky((2, 4, 10, 10))
    ref = F.max_pool2d(x, 2)
    layer = MaxPool2x2()
    assert same_bits(layer(x.to(memory_format=torch.channels_last)).contiguous(), ref)   # not NCHW-contiguous
    assert same_bits(layer(x.double()), ref.double())
    assert same_bits(layer(x.half()).float(), F.max_pool2d(x.half(), 2).float())
    torch.set_num_threads(2)                                                             # torch's, in parallel
    assert same_bits(layer(x), ref)
    torch.set_num_threads(1)
    monkeypatch.setattr(pool, "_KERNEL", [None])                                        # numba missing
    assert same_bits(layer(x), ref)
    with pytest.raises(RuntimeError):                                                    # torch's own error
        layer(torch.zeros(1, 1, 1, 1))


@needs_kernel
def test_vmap_pools_every_client_as_torch_does():
    xs = tricky((3, 5, 4, 8, 8), seed=2).requires_grad_()
    out = torch.func.vmap(MaxPool2x2())(xs)
    ref = torch.stack([F.max_pool2d(x, 2) for x in xs.detach()])
    assert same_bits(out.detach(), ref)
    g = torch.randn_like(ref)
    out.backward(g)
    xr = xs.detach().clone().requires_grad_()
    torch.stack([F.max_pool2d(x, 2) for x in xr]).backward(g)
    assert same_bits(xs.grad, xr.grad)


@needs_kernel
def test_lenet_trains_bitwise_as_with_torchs_pooling():
    """Twenty momentum-SGD steps of the zoo's LeNet-5 and of a copy with nn.MaxPool2d: identical
    weights. The tie rule itself is checked above: here ties (ReLU zeros, and the constant
    band's equal activations) meet the conv stack's backward, where equal activations with
    equal receptive fields give the same gradient whichever of them is picked.
    """
    torch.manual_seed(0)
    net = LeNet5((3, 32, 32), 10)
    assert sum(isinstance(m, MaxPool2x2) for m in net.modules()) == 2
    ref, start = copy.deepcopy(net), copy.deepcopy(net)
    ref.conv[2], ref.conv[5] = nn.MaxPool2d(2), nn.MaxPool2d(2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 3, 32, 32, generator=g)
    x[:, :, :6, :] = 1.0
    y = torch.randint(0, 10, (256,), generator=g)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in (net, ref)]
    for step in range(20):
        b = slice(32 * (step % 8), 32 * (step % 8 + 1))
        for m, opt in zip((net, ref), opts):
            opt.zero_grad()
            F.cross_entropy(m(x[b]), y[b]).backward()
            opt.step()
    moved = [(p - q).abs().max() for p, q in zip(net.parameters(), start.parameters())]
    assert all(same_bits(p.detach(), q.detach()) for p, q in zip(net.parameters(), ref.parameters()))
    assert max(moved) > 0.01


@needs_kernel
def test_the_kernel_runs_with_one_thread_only_and_folds_a_vmapped_group(monkeypatch):
    calls = []
    compiled = pool.kernel()
    monkeypatch.setattr(pool, "_KERNEL", [lambda x, out, idx: (calls.append(x.shape), compiled(x, out, idx))])
    layer = MaxPool2x2()
    layer(torch.randn(2, 3, 8, 8))
    torch.func.vmap(layer)(torch.randn(4, 2, 3, 8, 8))   # 4 clients x batch 2 x 3 channels: one call
    assert calls == [(6, 8, 8), (24, 8, 8)]
    torch.set_num_threads(2)
    layer(torch.randn(2, 3, 8, 8))
    assert len(calls) == 2
    assert pool.load_for(LeNet5((3, 32, 32), 10), torch.device("cpu")) is False   # 2 threads: not loaded for
    torch.set_num_threads(1)
    assert pool.load_for(LeNet5((3, 32, 32), 10), torch.device("cpu")) is True
    assert pool.load_for(nn.Linear(2, 2), torch.device("cpu")) is False
