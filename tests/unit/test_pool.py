"""MaxPool2x2 is bitwise nn.MaxPool2d(2), and ReLUMaxPool2x2 bitwise nn.ReLU() then nn.MaxPool2d(2):
values, indices, gradients, whole training runs."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hpcfl.models import pool, pool_kernels
from hpcfl.models.cnn import LeNet5
from hpcfl.bench.bare import torch_layers
from hpcfl.models.pool import MaxPool2x2, ReLUMaxPool2x2

MAKERS = {"c": pool_kernels._c_kernels, "numba": pool_kernels._numba_kernels}
BUILT: dict = {}


@pytest.fixture(params=sorted(MAKERS))
def kernel(request, monkeypatch):
    """Each compiled form in turn (C through ctypes, numba), as the one the layers use."""
    if request.param not in BUILT:
        BUILT[request.param] = MAKERS[request.param]()
    if BUILT[request.param] is None:
        pytest.skip(f"no {request.param} kernels here (no compiler / numba, or HPCFL_NO_CC / HPCFL_NO_NUMBA)")
    monkeypatch.setattr(pool_kernels, "_KERNELS", [BUILT[request.param]])
    return BUILT[request.param]


needs_kernel = pytest.mark.usefixtures("kernel")


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


def assert_double_backward_is_torchs(layer: nn.Module, ref: nn.Module, x: torch.Tensor) -> None:
    """Gradients of sum(layer(x)^2 * w) and of the squared gradient's sum, against ``ref``'s, bitwise."""
    w = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    grads = []
    for m in (layer, ref):
        xr = x.clone().requires_grad_()
        (gx,) = torch.autograd.grad((m(xr) ** 2 * w).sum(), xr, create_graph=True)
        (ggx,) = torch.autograd.grad((gx ** 2).sum(), xr)
        grads.append((gx.detach(), ggx))
    assert same_bits(grads[0][0], grads[1][0]) and same_bits(grads[0][1], grads[1][1])
    assert grads[0][1].abs().sum() > 0


@needs_kernel
def test_double_backward_is_torchs():
    x = torch.relu(torch.randn(2, 3, 8, 8, dtype=torch.float64))
    assert_double_backward_is_torchs(MaxPool2x2(), nn.MaxPool2d(2), x)


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
    monkeypatch.setattr(pool_kernels, "_KERNELS", [None])                                        # numba missing
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
def test_lenet_trains_bitwise_as_with_torchs_relu_and_pooling():
    """Twenty momentum-SGD steps of the zoo's LeNet-5 and of a copy with nn.ReLU and nn.MaxPool2d: identical
    weights. The tie rule itself is checked above: here ties (ReLU zeros, and the constant
    band's equal activations) meet the conv stack's backward, where equal activations with
    equal receptive fields give the same gradient whichever of them is picked.
    """
    torch.manual_seed(0)
    net = LeNet5((3, 32, 32), 10)
    assert sum(isinstance(m, ReLUMaxPool2x2) for m in net.modules()) == 2
    ref, start = torch_layers(copy.deepcopy(net)), copy.deepcopy(net)
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
    compiled = pool.kernels()
    spy = SimpleNamespace(pool2x2=lambda x, out, idx: (calls.append(x.shape), compiled.pool2x2(x, out, idx)))
    monkeypatch.setattr(pool_kernels, "_KERNELS", [spy])
    layer = MaxPool2x2()
    layer(torch.randn(2, 3, 8, 8))
    torch.func.vmap(layer)(torch.randn(4, 2, 3, 8, 8))   # 4 clients x batch 2 x 3 channels: one call
    assert calls == [(2, 3, 8, 8), (8, 3, 8, 8)]
    torch.set_num_threads(2)
    layer(torch.randn(2, 3, 8, 8))
    assert len(calls) == 2
    assert pool.load_for(nn.Sequential(MaxPool2x2()), torch.device("cpu")) is False   # 2 threads: not for it
    assert pool.load_for(LeNet5((3, 32, 32), 10), torch.device("cpu")) is True        # the fused layer's are
    torch.set_num_threads(3)
    assert pool.load_for(LeNet5((3, 32, 32), 10), torch.device("cpu")) is False
    torch.set_num_threads(1)
    assert pool.load_for(LeNet5((3, 32, 32), 10), torch.device("cpu")) is True
    assert pool.load_for(nn.Sequential(MaxPool2x2()), torch.device("cpu")) is True
    assert pool.load_for(nn.Linear(2, 2), torch.device("cpu")) is False


# ---- ReLUMaxPool2x2: nn.ReLU() then nn.MaxPool2d(2), one compiled pass each way ----

def raw(shape, dtype=torch.float32, seed=0):
    """Pre-activations with every case the fused layer must get right: negatives (ReLU's +0.0),
    windows of all negatives, -0.0 beside 0.0, equal positives, NaNs of both signs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=dtype)
    x[..., :2, :] = 0.5                                   # whole windows of equal positives
    x[..., 2:4, :4] = -1.0                                # windows of negatives only: out 0, no gradient
    x[..., 3, 4::3] = -0.0                                # signed zeros among zeros and negatives
    x[..., 2, 5::4] = 0.0
    x = torch.where(torch.rand(shape, generator=g, dtype=dtype) < 0.01, float("nan"), x)
    x[..., 4, 1] = float("nan")
    x[..., 5, 2] = -float("nan")                           # a NaN with its sign bit set
    return x


def relu_pool_ref(x: torch.Tensor) -> torch.Tensor:
    return nn.MaxPool2d(2)(nn.ReLU()(x))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(4, 6, 28, 28), (3, 16, 10, 10), (2, 3, 7, 9)])
def test_relu_pool_values_and_gradients_are_torchs(shape, dtype):
    x = raw(shape, dtype)
    g = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2, dtype=dtype)
    g[..., -1, :] = -0.0                                    # torch's scatter makes these +0.0
    g[..., 1, 1] = float("nan")
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, ref = ReLUMaxPool2x2()(a), relu_pool_ref(b)
    assert same_bits(out.detach(), ref.detach())
    out.backward(g)
    ref.backward(g)
    assert same_bits(a.grad, b.grad)
    assert torch.isnan(out).any() and (out == 0).any() and (a.grad != 0).any()   # the cases were there


@needs_kernel
def test_relu_pool_hand_case():
    # windows: [-1 -2; -3 -4] -> +0.0 with no gradient; [-0.0 0; 2 2] -> 2, the first 2 (row 1,
    # col 2) takes the gradient; a NaN wins its window and passes the gradient, as relu's does;
    # [3 3; 1 0] -> 3, the first 3 takes it; [-0.0 -1; -2 -3] -> -0.0 (relu keeps -0.0), no gradient
    x = torch.tensor([[[[-1.0, -2.0, -0.0, 0.0, 1.0, float("nan"), 3.0, 3.0, -0.0, -1.0],
                        [-3.0, -4.0, 2.0, 2.0, 5.0, 0.0, 1.0, 0.0, -2.0, -3.0]]]], requires_grad=True)
    out = ReLUMaxPool2x2()(x)
    assert out[0, 0, 0, [0, 1, 3, 4]].tolist() == [0.0, 2.0, 3.0, 0.0] and torch.isnan(out[0, 0, 0, 2])
    assert torch.signbit(out[0, 0, 0]).tolist() == [False, False, False, False, True]
    out.backward(torch.tensor([[[[7.0, 8.0, 9.0, 6.0, 5.0]]]]))
    assert x.grad.tolist() == [[[[0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 6.0, 0.0, 0.0, 0.0],
                                 [0.0, 0.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]]]


@needs_kernel
def test_relu_pool_double_backward_is_torchs():
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    assert_double_backward_is_torchs(ReLUMaxPool2x2(), torch_layers(nn.Sequential(ReLUMaxPool2x2())), x)


@needs_kernel
def test_relu_pool_vmap_is_one_call_and_torchs(monkeypatch):
    calls = []
    compiled = pool.kernels()
    spy = SimpleNamespace(relu_pool2x2=lambda x, out, pos: (calls.append(x.shape), compiled.relu_pool2x2(x, out, pos)),
                          relu_pool2x2_grad=compiled.relu_pool2x2_grad)
    monkeypatch.setattr(pool_kernels, "_KERNELS", [spy])
    xs = raw((3, 5, 4, 8, 8), seed=2).requires_grad_()
    out = torch.func.vmap(ReLUMaxPool2x2())(xs)
    assert calls == [(15, 4, 8, 8)]                         # 3 clients x 5 samples, 4 channels
    for threads, used in ((2, True), (3, False)):             # the kernel up to 2 threads (MAX_THREADS)
        torch.set_num_threads(threads)
        ReLUMaxPool2x2()(xs[0].detach())
        assert (len(calls) == 2) is used
        calls[1:] = []
    torch.set_num_threads(1)
    xr = xs.detach().clone().requires_grad_()
    ref = torch.stack([relu_pool_ref(x) for x in xr])
    assert same_bits(out.detach(), ref.detach())
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    assert same_bits(xs.grad, xr.grad)


@needs_kernel
def test_relu_pool_under_other_transforms_and_the_vmap_function_alone_are_torchs():
    x = raw((2, 3, 6, 6), torch.float64)
    w = torch.randn(2, 3, 3, 3, dtype=torch.float64)
    ref = torch.func.grad(lambda t: (relu_pool_ref(t) * w).sum())(x)
    assert same_bits(torch.func.grad(lambda t: (ReLUMaxPool2x2()(t) * w).sum())(x), ref)   # torch's layers
    xr = x.clone().requires_grad_()
    out = pool._ReLUMaxPool2x2Batched.apply(xr)   # its forward, outside vmap, with torch's backward
    assert same_bits(out.detach(), relu_pool_ref(x))
    out.backward(w)
    assert same_bits(xr.grad, ref)


def test_relu_pool_falls_back_to_torch_where_the_kernel_does_not_apply(monkeypatch):
    x = raw((2, 4, 10, 10))
    ref = relu_pool_ref(x)
    layer = ReLUMaxPool2x2()
    assert same_bits(layer(x.to(memory_format=torch.channels_last)).contiguous(), ref)
    assert same_bits(layer(x.half()).float(), relu_pool_ref(x.half()).float())
    torch.set_num_threads(3)                                  # above MAX_THREADS: torch's, in parallel
    assert same_bits(layer(x), ref)
    torch.set_num_threads(1)
    monkeypatch.setattr(pool_kernels, "_KERNELS", [None])
    assert same_bits(layer(x), ref)
    with pytest.raises(RuntimeError):
        layer(torch.zeros(1, 1, 1, 1))


@pytest.mark.parametrize("context", ["no_grad", "inference_mode", "func.grad", "vmap"])
def test_the_kernels_resolve_on_a_first_call_from_any_context(context, monkeypatch):
    """kernels() checks a form against torch's layers on its first call, which may come from inside
    no_grad, inference mode or a torch.func transform: the check must run the same there."""
    if pool_kernels._c_kernels() is None and pool_kernels._numba_kernels() is None:
        pytest.skip("no compiled pooling here")
    monkeypatch.setattr(pool_kernels, "_KERNELS", [])
    x = raw((4, 2, 3, 8, 8), seed=5)
    layer = ReLUMaxPool2x2()
    if context == "no_grad":
        with torch.no_grad():
            got, ref = layer(x[0]), relu_pool_ref(x[0])
    elif context == "inference_mode":
        with torch.inference_mode():
            got, ref = layer(x[0]), relu_pool_ref(x[0])
    elif context == "func.grad":
        got = torch.func.grad(lambda t: (layer(t) ** 2).sum())(x[0])
        ref = torch.func.grad(lambda t: (relu_pool_ref(t) ** 2).sum())(x[0])
    else:
        got, ref = torch.func.vmap(layer)(x), torch.stack([relu_pool_ref(t) for t in x])
    assert pool_kernels._KERNELS[0] is not None
    assert same_bits(got, ref)


def test_the_kernels_take_host_tensors_whatever_torchs_default_device(monkeypatch):
    """A script that sets another default device (here "meta", as no GPU is at hand) still gets
    host buffers from the check and the layers: the kernels write through host pointers."""
    if pool_kernels._c_kernels() is None and pool_kernels._numba_kernels() is None:
        pytest.skip("no compiled pooling here")
    monkeypatch.setattr(pool_kernels, "_KERNELS", [])
    x = raw((2, 3, 8, 8), seed=6)
    torch.set_default_device("meta")
    try:
        got = ReLUMaxPool2x2()(x)
        out, idx = pool._MaxPool2x2.apply(x)
    finally:
        torch.set_default_device(None)
    assert pool_kernels._KERNELS[0] is not None
    assert same_bits(got, relu_pool_ref(x))
    assert same_bits(out, F.max_pool2d(x, 2)) and torch.equal(idx, F.max_pool2d(x, 2, return_indices=True)[1])
