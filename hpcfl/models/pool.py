"""2 x 2 max pooling, bitwise torch's, with a compiled forward on CPU.

On CPU, torch's ``max_pool2d`` over NCHW float tensors was the slowest layer of LeNet-5: on
one core of the 2-core machine, 690-830 us for a (32, 6, 28, 28) input, where the two
convolutions take 790 and 190 us. It is a scalar loop that also writes an int64 index per
output. ``MaxPool2x2`` runs the same loop compiled by numba, in the same order with the same
comparison (``v > best or isnan(v)``, so ties keep the first element in row-major order and a NaN
wins, as in torch), and gives torch's own backward kernel the indices it would have made. The
values, the indices, and so every gradient are bitwise torch's: the swap changes no result,
only the time (tests/unit/test_pool.py compares all three, on ties, NaNs and whole training runs).

The kernel runs on one thread, so it is used where torch runs on one (the R ranks x 1 thread
layouts, one rank per core): there a LeNet-5 step is about 6% faster (``bench/pool_bench.py``).
With 2 threads torch's pooling runs in parallel and the whole step was 8% faster with it.
Everywhere else (more threads, no numba, ``HPCFL_NO_NUMBA=1``, a GPU, a half-precision or
non-contiguous input) it is ``torch.nn.functional.max_pool2d(x, 2)``. Under ``torch.func.vmap``
the clients' batches are folded into one and pooled in one call.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..jit import numba_or_none

_KERNEL: list = []   # [compiled kernel or None], once resolved


def _compile():
    """The compiled forward (float32 and float64), or None where numba cannot be had."""
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

    return pool2x2


def kernel():
    """The compiled pooling forward, or None (numba missing or disabled); compiled or loaded once.

    Loading imports numba and its compiler context: 0.5-0.6 s here (2-3 s for a first compile).
    The engine does it before round 1 when the model trains on CPU (:func:`load_for`); elsewhere
    the first CPU forward does it.
    """
    if not _KERNEL:
        try:
            _KERNEL.append(_compile())
        except Exception as err:   # a broken numba install or cache: torch's pooling, the same bits
            warnings.warn(f"hpcfl: the compiled max pooling is off ({err}); torch's is used", stacklevel=2)
            _KERNEL.append(None)
    return _KERNEL[0]


def load_for(module: nn.Module, device: torch.device) -> bool:
    """Load the kernel now if ``module`` has a :class:`MaxPool2x2` and runs on CPU with one torch
    thread; True if it will be used."""
    if (device.type != "cpu" or torch.get_num_threads() != 1
            or not any(isinstance(m, MaxPool2x2) for m in module.modules())):
        return False
    return kernel() is not None


class _MaxPool2x2(torch.autograd.Function):
    """(B, C, H, W) -> values and int64 indices (B, C, H // 2, W // 2), torch's layout."""

    @staticmethod
    def forward(x):
        B, C, H, W = x.shape
        out = x.new_empty((B, C, H // 2, W // 2))
        idx = torch.empty((B, C, H // 2, W // 2), dtype=torch.int64)
        kernel()(x.detach().view(B * C, H, W).numpy(), out.view(B * C, H // 2, W // 2).numpy(),
                 idx.view(B * C, H // 2, W // 2).numpy())
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


class MaxPool2x2(nn.Module):
    """``nn.MaxPool2d(2)`` with a compiled CPU forward; same values, indices and gradients."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, C, H // 2, W // 2)."""
        if (x.dim() == 4 and x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)
                and x.shape[2] >= 2 and x.shape[3] >= 2 and x.is_contiguous() and torch.get_num_threads() == 1
                and kernel() is not None):
            return _MaxPool2x2.apply(x)[0]
        return F.max_pool2d(x, 2)

    def extra_repr(self) -> str:
        return "kernel_size=2, stride=2"
