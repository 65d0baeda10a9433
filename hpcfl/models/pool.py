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

The kernels exist twice, with the same bits, as C and as numba loops; which one runs is
chosen once per process (:mod:`hpcfl.models.pool_kernels`).

The kernels run on one thread. ``MaxPool2x2`` takes its kernel where torch runs on one (the
R ranks x 1 thread layouts, one rank per core): with 2 threads torch's pooling runs in
parallel and the whole step was 8% faster with it. ``ReLUMaxPool2x2`` takes its kernel up to 2
threads (each layer's ``MAX_THREADS``). Everywhere else (more threads, neither C nor numba,
``HPCFL_NO_CC=1`` with ``HPCFL_NO_NUMBA=1``, a GPU, a half-precision or non-contiguous input)
these are torch's functions. Under ``torch.func.vmap`` the clients' batches are folded into
one and pooled in one call.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .pool_kernels import kernels

try:   # torch.func's wrappers: a vmapped input goes to the vmap rule, other transforms to torch
    from torch._C._functorch import is_batchedtensor as _batched
    from torch._C._functorch import is_functorch_wrapped_tensor as _wrapped
except ImportError:   # a torch without these: every input counts as wrapped, torch's layers run
    def _batched(t: torch.Tensor) -> bool:
        return False

    def _wrapped(t: torch.Tensor) -> bool:
        return True


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
        idx = torch.empty((B, C, H // 2, W // 2), dtype=torch.int64, device=x.device)
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
    pos = torch.empty((B, C, H // 2, W // 2), dtype=torch.int8, device=x.device)
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
