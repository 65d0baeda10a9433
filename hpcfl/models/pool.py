"""2 x 2 max pooling, and ReLU then 2 x 2 max pooling, bitwise torch's, compiled on CPU.

On CPU, torch's ``max_pool2d`` over NCHW float tensors was the slowest layer of LeNet-5: on
one core of the 2-core machine, 690-830 us for a (32, 6, 28, 28) input, where the two
convolutions take 790 and 190 us. It is a scalar loop that also writes an int64 index per
output. ``MaxPool2x2`` runs the same scan compiled, in the same order with the same
comparison (``v > best or isnan(v)``, so ties keep the first element in row-major order and a NaN
wins, as in torch), and gives torch's own backward kernel the indices it would have made. The
values, the indices, and so every gradient are bitwise torch's: the swap changes no result,
only the time (tests/unit/test_pool.py compares all three, on ties, NaNs and whole training runs).

``ReLUMaxPool2x2`` is ``nn.ReLU()`` then ``nn.MaxPool2d(2)`` (LeNet-5's pairs) in one compiled
pass each way: the forward applies torch's ReLU (a negative becomes +0.0; -0.0 and NaNs pass)
and the same scan, keeping the winner's place in its window as one byte; the backward writes
what torch's two backward kernels would (pooling adds the gradient to a zero at the winner,
ReLU zeroes it where the output is <= 0) in one pass over the input. That removes two of
four passes over the large tensor, the int64 indices, the zero fill and two autograd nodes.

The kernels exist twice, with the same bits: C in ``pool.c`` (vector loops on SSE2), compiled
once per machine and loaded through ctypes in about a millisecond (:mod:`hpcfl.cc`), and
numba loops below, which need 0.5-1 s to load per process and run where no C compiler is
found. :func:`kernels` takes the first that gives torch's bits on a small hard input.

The kernels run on one thread. ``MaxPool2x2`` takes its kernel where torch runs on one (the
R ranks x 1 thread layouts, one rank per core): with 2 threads torch's pooling runs in
parallel and the whole step was 8% faster with it. ``ReLUMaxPool2x2`` takes its kernel up to 2
threads (each layer's ``MAX_THREADS``). Everywhere else (more threads, neither C nor numba,
``HPCFL_NO_CC=1`` with ``HPCFL_NO_NUMBA=1``, a GPU, a half-precision or non-contiguous input)
these are torch's functions. Under ``torch.func.vmap`` the clients' batches are folded into
one and pooled in one call.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from .. import cc
from ..jit import numba_or_none

_KERNELS: list = []   # [namespace of compiled kernels, or None], once resolved

try:   # torch.func's wrappers: a vmapped input goes to the vmap rule, other transforms to torch
    from torch._C._functorch import is_batchedtensor as _batched
    from torch._C._functorch import is_functorch_wrapped_tensor as _wrapped
except ImportError:   # a torch without these: every input counts as wrapped, torch's layers run
    def _batched(t: torch.Tensor) -> bool:
        return False

    def _wrapped(t: torch.Tensor) -> bool:
        return True


# the check below makes plain tensors even when the first call comes from inside a torch.func transform
_outside_transforms = getattr(torch._C, "_DisableFuncTorch", contextlib.nullcontext)


def _numba_kernels():
    """The kernels compiled by numba (float32 and float64), or None where numba cannot be had."""
    numba = numba_or_none()
    if numba is None:
        return None

    @numba.njit(["void(float32[:, :, ::1], float32[:, :, ::1], int64[:, :, ::1])",
                 "void(float64[:, :, ::1], float64[:, :, ::1], int64[:, :, ::1])"], cache=True, nogil=True)
    def pool2x2(x, out, idx):   # pragma: no cover - compiled
        """out[p, i, j] = the max of x[p, 2i:2i+2, 2j:2j+2]; idx its flat index in the (H, W) plane."""
        W = x.shape[2]
        for p in range(out.shape[0]):
            for i in range(out.shape[1]):
                r = 2 * i
                for j in range(out.shape[2]):
                    c = 2 * j
                    best, at = x[p, r, c], r * W + c
                    # torch's scan: row-major, a later element wins if greater, or if NaN
                    v = x[p, r, c + 1]
                    if v > best or v != v:
                        best, at = v, r * W + c + 1
                    v = x[p, r + 1, c]
                    if v > best or v != v:
                        best, at = v, (r + 1) * W + c
                    v = x[p, r + 1, c + 1]
                    if v > best or v != v:
                        best, at = v, (r + 1) * W + c + 1
                    out[p, i, j] = best
                    idx[p, i, j] = at

    @numba.njit(["void(float32[:, :, :, ::1], float32[:, :, :, ::1], int8[:, :, :, ::1])",
                 "void(float64[:, :, :, ::1], float64[:, :, :, ::1], int8[:, :, :, ::1])"], cache=True, nogil=True)
    def relu_pool2x2(x, out, pos):   # pragma: no cover - compiled
        """out[b, c, i, j] = the max of relu(x[b, c, 2i:2i+2, 2j:2j+2]); pos its place in the
        window (0 1 / 2 3). Selects, not branches."""
        for b in range(out.shape[0]):
            for c in range(out.shape[1]):
                for i in range(out.shape[2]):
                    r, s = 2 * i, 2 * i + 1
                    for j in range(out.shape[3]):
                        # torch's relu: a negative becomes +0.0; -0.0 and NaN (any sign) pass unchanged
                        v0 = x[b, c, r, 2 * j]
                        v0 = 0.0 if v0 < 0 else v0
                        v1 = x[b, c, r, 2 * j + 1]
                        v1 = 0.0 if v1 < 0 else v1
                        v2 = x[b, c, s, 2 * j]
                        v2 = 0.0 if v2 < 0 else v2
                        v3 = x[b, c, s, 2 * j + 1]
                        v3 = 0.0 if v3 < 0 else v3
                        # torch's pooling scan over those, as in pool2x2
                        t = (v1 > v0) | (v1 != v1)
                        best, at = (v1, 1) if t else (v0, 0)
                        t = (v2 > best) | (v2 != v2)
                        best, at = (v2, 2) if t else (best, at)
                        t = (v3 > best) | (v3 != v3)
                        best, at = (v3, 3) if t else (best, at)
                        out[b, c, i, j] = best
                        pos[b, c, i, j] = at

    @numba.njit(["void(float32[:, :, :, ::1], float32[:, :, :, ::1], int8[:, :, :, ::1], float32[:, :, :, ::1])",
                 "void(float64[:, :, :, ::1], float64[:, :, :, ::1], int8[:, :, :, ::1], float64[:, :, :, ::1])"],
                cache=True, nogil=True)
    def relu_pool2x2_grad(g, out, pos, dx):   # pragma: no cover - compiled
        """dx of relu_pool2x2 for the output gradient g, every element written: torch's pooling
        backward adds g to a zero at the max (0.0 + g: a -0.0 becomes +0.0), then relu's backward
        zeroes it where the output is <= 0 (not where it is NaN); the rest is +0.0."""
        H, W = dx.shape[2], dx.shape[3]
        Ho, Wo = g.shape[2], g.shape[3]
        for b in range(g.shape[0]):
            for c in range(g.shape[1]):
                for i in range(Ho):
                    r, s = 2 * i, 2 * i + 1
                    for j in range(Wo):
                        v = 0.0 + g[b, c, i, j]
                        v = 0.0 if out[b, c, i, j] <= 0 else v
                        k = pos[b, c, i, j]
                        dx[b, c, r, 2 * j] = v if k == 0 else 0.0
                        dx[b, c, r, 2 * j + 1] = v if k == 1 else 0.0
                        dx[b, c, s, 2 * j] = v if k == 2 else 0.0
                        dx[b, c, s, 2 * j + 1] = v if k == 3 else 0.0
                    for j in range(2 * Wo, W):   # an odd width's last column is in no window
                        dx[b, c, r, j] = 0.0
                        dx[b, c, s, j] = 0.0
                for i in range(2 * Ho, H):       # an odd height's last row
                    for j in range(W):
                        dx[b, c, i, j] = 0.0

    def planes(t: torch.Tensor):   # the (B * C, H, W) numpy view of a contiguous (B, C, H, W) tensor
        B, C, H, W = t.shape
        return t.detach().view(B * C, H, W).numpy()

    return SimpleNamespace(
        backend="numba",
        pool2x2=lambda x, out, idx: pool2x2(planes(x), planes(out), planes(idx)),
        relu_pool2x2=lambda x, out, pos: relu_pool2x2(x.detach().numpy(), out.numpy(), pos.numpy()),
        relu_pool2x2_grad=lambda g, out, pos, dx: relu_pool2x2_grad(g.numpy(), out.numpy(), pos.numpy(), dx.numpy()))


def _c_kernels():
    """The same kernels from ``pool.c`` through ctypes (:mod:`hpcfl.cc`), or None where it cannot
    be compiled or was built without its vector loops (numba's are then faster)."""
    lib = cc.load(Path(__file__).with_name("pool.c"))
    if lib is None or not lib.hpcfl_pool_simd():
        return None
    ptr, n = ctypes.c_void_p, ctypes.c_int64
    fn = {}
    for name, args in (("pool2x2", 3), ("relu_pool2x2", 3), ("relu_pool2x2_grad", 4)):
        for dtype, suffix in ((torch.float32, "f32"), (torch.float64, "f64")):
            f = getattr(lib, f"{name}_{suffix}")
            f.argtypes, f.restype = [ptr] * args + [n, n, n], None
            fn[name, dtype] = f

    def forward(name):
        def run(x, out, place):   # (B, C, H, W) contiguous -> out, place (B, C, H // 2, W // 2)
            B, C, H, W = x.shape
            fn[name, x.dtype](x.data_ptr(), out.data_ptr(), place.data_ptr(), B * C, H, W)
        return run

    def relu_pool2x2_grad(g, out, pos, dx):   # dx (B, C, H, W) from g, out, pos (B, C, H // 2, W // 2)
        B, C, H, W = dx.shape
        fn["relu_pool2x2_grad", dx.dtype](g.data_ptr(), out.data_ptr(), pos.data_ptr(), dx.data_ptr(), B * C, H, W)

    return SimpleNamespace(backend="c", path=lib._name, pool2x2=forward("pool2x2"),
                           relu_pool2x2=forward("relu_pool2x2"), relu_pool2x2_grad=relu_pool2x2_grad)


def _agrees_with_torch(k) -> bool:
    """Whether the kernels ``k`` give torch's bits on a small input with every hard case (ties,
    negatives, -0.0, NaNs of both signs, odd sizes), in float32 and float64: a guard against a
    compiler that does not keep IEEE semantics. About a millisecond."""
    for dtype in (torch.float32, torch.float64):
        x = torch.arange(-20.0, 32.0, dtype=dtype).remainder(7.0).sub(3.0).view(1, 2, 2, 13).repeat(1, 1, 3, 1)
        x = x.view(1, 2, 6, 13)[..., :5, :]                          # odd height and width
        x[0, 0, 0, :4] = torch.tensor([-0.0, 0.0, float("nan"), -float("nan")], dtype=dtype)
        x = x.contiguous()
        ints = torch.int32 if dtype == torch.float32 else torch.int64
        out, idx = torch.empty(1, 2, 2, 6, dtype=dtype), torch.empty(1, 2, 2, 6, dtype=torch.int64)
        k.pool2x2(x, out, idx)
        ref, ref_idx = F.max_pool2d(x, 2, return_indices=True)
        if not (torch.equal(out.view(ints), ref.view(ints)) and torch.equal(idx, ref_idx)):
            return False
        pos, dx = torch.empty(1, 2, 2, 6, dtype=torch.int8), torch.empty_like(x)
        k.relu_pool2x2(x, out, pos)
        g = torch.linspace(-1.0, 1.0, 24, dtype=dtype).view(1, 2, 2, 6)
        g[0, 0, 0, :2] = torch.tensor([-0.0, float("nan")], dtype=dtype)
        k.relu_pool2x2_grad(g, out, pos, dx)
        # torch's layers, forward and the two backward kernels autograd would run; called directly,
        # so that the check runs the same under no_grad, inference mode or a torch.func transform
        r = torch.relu(x)
        ref, ref_idx = F.max_pool2d(r, 2, return_indices=True)
        ref_dx = torch.ops.aten.threshold_backward(
            torch.ops.aten.max_pool2d_with_indices_backward(g, r, [2, 2], [2, 2], [0, 0], [1, 1], False, ref_idx), r, 0)
        if not (torch.equal(out.view(ints), ref.view(ints)) and torch.equal(dx.view(ints), ref_dx.view(ints))):
            return False
    return True


def kernels():
    """The compiled kernels, or None (neither C nor numba can be had, or both are disabled):
    a namespace of ``pool2x2(x, out, idx)``, ``relu_pool2x2(x, out, pos)`` and
    ``relu_pool2x2_grad(g, out, pos, dx)`` on contiguous tensors, and ``backend`` ("c" or
    "numba"; the C form also has ``path``, its shared library). Resolved once per process.

    The C form (``pool.c``, see :mod:`hpcfl.cc`) comes first: it loads in about a millisecond
    once compiled, where numba's load takes 0.5-1 s, and its vector loops are as fast or
    faster. Either form must give torch's bits on a small hard input before it is used
    (:func:`_agrees_with_torch`); the engine loads them before round 1 when the model trains
    on CPU (:func:`load_for`), elsewhere the first CPU forward does.
    """
    if not _KERNELS:
        chosen = None
        for name, make in (("C", _c_kernels), ("numba", _numba_kernels)):
            try:
                k = make()
            except Exception as err:   # a broken numba install or cache, an odd compiler: the next form
                warnings.warn(f"hpcfl: the {name} max pooling is off ({err})", stacklevel=2)
                continue
            if k is None:
                continue
            try:
                with _outside_transforms():   # a first call may come from inside torch.func.grad or vmap
                    same = _agrees_with_torch(k)
            except Exception as err:   # e.g. a library missing a symbol: the next form
                warnings.warn(f"hpcfl: the {name} max pooling is off ({err})", stacklevel=2)
                continue
            if same:
                chosen = k
                break
            warnings.warn(f"hpcfl: the {name} max pooling does not give torch's bits on this machine; it is off",
                          stacklevel=2)
        _KERNELS.append(chosen)
    return _KERNELS[0]


def load_for(module: nn.Module, device: torch.device) -> bool:
    """Load the kernels now if ``module`` has a :class:`MaxPool2x2` or :class:`ReLUMaxPool2x2`
    that runs on CPU at a thread count where it takes its kernel; True if they will be used."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or not any(isinstance(m, (MaxPool2x2, ReLUMaxPool2x2)) and threads <= m.MAX_THREADS
                                       for m in module.modules()):
        return False
    return kernels() is not None


def _takes_kernel(x: torch.Tensor, max_threads: int) -> bool:
    """Whether the compiled kernels apply to the input ``x``: at most ``max_threads`` torch
    threads, on CPU, float32 or float64, contiguous NCHW with at least one 2 x 2 window."""
    return (x.dim() == 4 and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
            and x.shape[2] >= 2 and x.shape[3] >= 2 and x.is_contiguous()
            and torch.get_num_threads() <= max_threads and kernels() is not None)


class _MaxPool2x2(torch.autograd.Function):
    """(B, C, H, W) -> values and int64 indices (B, C, H // 2, W // 2), torch's layout."""

    @staticmethod
    def forward(x):
        B, C, H, W = x.shape
        out = x.new_empty((B, C, H // 2, W // 2))
        idx = torch.empty((B, C, H // 2, W // 2), dtype=torch.int64)
        kernels().pool2x2(x, out, idx)
        return out, idx

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], output[1])
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad, _grad_idx):
        x, idx = ctx.saved_tensors
        # torch's own backward of max_pool2d (and so its double backward, too)
        return torch.ops.aten.max_pool2d_with_indices_backward(grad, x, [2, 2], [2, 2], [0, 0], [1, 1], False, idx)

    @staticmethod
    def vmap(info, in_dims, x):
        if in_dims[0] is None:
            return _MaxPool2x2.apply(x), (None, None)
        x = x.movedim(in_dims[0], 0)
        n, B, C, H, W = x.shape
        out, idx = _MaxPool2x2.apply(x.reshape(n * B, C, H, W))
        return (out.view(n, B, C, H // 2, W // 2), idx.view(n, B, C, H // 2, W // 2)), (0, 0)


def _relu_pool(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Compiled max_pool2d(relu(x), 2) of a plain contiguous (B, C, H, W) tensor: the values and
    int8 window places (B, C, H // 2, W // 2)."""
    B, C, H, W = x.shape
    out = x.new_empty((B, C, H // 2, W // 2))
    pos = torch.empty((B, C, H // 2, W // 2), dtype=torch.int8)
    kernels().relu_pool2x2(x, out, pos)
    return out, pos


def _torch_relu_pool_grad(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The input gradient of max_pool2d(relu(x), 2) through torch's own layers (differentiable
    again when grad mode is on, as in a double backward)."""
    with torch.enable_grad():
        xd = x.detach().requires_grad_()
        y = F.max_pool2d(F.relu(xd), 2)
    return torch.autograd.grad(y, xd, grad, create_graph=torch.is_grad_enabled())[0]


def _relu_pool_grad(grad: torch.Tensor, x: torch.Tensor, out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """The input gradient (B, C, H, W) of :func:`_relu_pool` for ``grad`` (B, C, H // 2, W // 2)."""
    if torch.is_grad_enabled() or _wrapped(grad) or grad.device.type != "cpu" or grad.dtype != x.dtype:
        # a double backward, or a torch.func transform: torch's layers, the same first derivative
        return _torch_relu_pool_grad(grad, x)
    dx = torch.empty_like(x)
    kernels().relu_pool2x2_grad(grad.contiguous(), out, pos, dx)
    return dx


class _ReLUMaxPool2x2(torch.autograd.Function):
    """(B, C, H, W) -> max_pool2d(relu(x), 2) (B, C, H // 2, W // 2), both passes compiled.

    The old-style Function (``forward(ctx, x)``, one output): it has a third of the call
    overhead of the form with ``setup_context`` and a vmap rule (10 against 33 us forward, 56
    against 106 us with backward), which on LeNet-5's second layer is as much as the kernel.
    Under vmap the layer goes through :class:`_ReLUMaxPool2x2Batched` instead.
    """

    @staticmethod
    def forward(ctx, x):
        out, pos = _relu_pool(x)
        ctx.save_for_backward(x, out)
        ctx.pos = pos   # int8, never differentiated: kept off the saved-tensor checks
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return _relu_pool_grad(grad, x, out, ctx.pos)


class _ReLUMaxPool2x2Batched(torch.autograd.Function):
    """:class:`_ReLUMaxPool2x2` for ``torch.func.vmap``: the clients' batches folded into one call."""

    @staticmethod
    def forward(x):   # used only outside vmap, where the layer takes _ReLUMaxPool2x2 itself
        return _relu_pool(x)[0]

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return _torch_relu_pool_grad(grad, x)

    @staticmethod
    def vmap(info, in_dims, x):
        if in_dims[0] is None:
            return _ReLUMaxPool2x2.apply(x), None
        x = x.movedim(in_dims[0], 0)
        n, B, C, H, W = x.shape
        out = _ReLUMaxPool2x2.apply(x.reshape(n * B, C, H, W).contiguous())
        return out.view(n, B, C, H // 2, W // 2), 0


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)`` with a compiled CPU forward; same values, indices and gradients."""

    #: The most torch threads at which the (one-thread) kernel runs: at 2 threads a LeNet-5 step
    #: with it was 8% slower than with torch's parallel pooling (bench/pool_bench.py --threads 2).
    MAX_THREADS = 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H // 2, W // 2)."""
        if _takes_kernel(x, self.MAX_THREADS):
            return _MaxPool2x2.apply(x)[0]
        return F.max_pool2d(x, 2)

    def extra_repr(self) -> str:
        return "kernel_size=2, stride=2"


class ReLUMaxPool2x2(nn.Module):
    """``nn.ReLU()`` then ``nn.MaxPool2d(2)`` in one compiled pass each way on CPU; same values and
    gradients, bit for bit."""

    #: The most torch threads at which the (one-thread) kernels run: at 2 threads a LeNet-5 step
    #: with them was 9% faster than with torch's layers (0.91x); more threads were not measured.
    MAX_THREADS = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H // 2, W // 2)."""
        if _takes_kernel(x, self.MAX_THREADS):
            if _batched(x):
                return _ReLUMaxPool2x2Batched.apply(x)
            if not _wrapped(x):
                return _ReLUMaxPool2x2.apply(x)
        return F.max_pool2d(F.relu(x), 2)

    def extra_repr(self) -> str:
        return "relu, then kernel_size=2, stride=2"
