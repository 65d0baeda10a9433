"""The compiled kernels behind :mod:`hpcfl.models.pool`'s layers, and the choice among their forms.

Three kernels, each in float32 and float64, on contiguous NCHW tensors: ``pool2x2`` (2 x 2 max
pooling with torch's int64 indices), ``relu_pool2x2`` (torch's ReLU, then the same scan, with
the winner's place in its window as one byte) and ``relu_pool2x2_grad`` (what torch's two
backward kernels would write). They exist twice, with the same bits: C in ``pool.c`` (vector
loops on SSE2), compiled once per machine and loaded through ctypes in about a millisecond
(:mod:`hpcfl.native.cc`), and numba loops below, which need 0.5-1 s to load per process and run where
no C compiler is found. :func:`kernels` takes the first form that gives torch's bits on a
small hard input (:func:`_agrees_with_torch`), else None (torch's layers then run).
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ..native import cc
from ..native.jit import numba_or_none

_KERNELS: list = []   # [namespace of compiled kernels, or None], once resolved

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
    """The same kernels from ``pool.c`` through ctypes (:mod:`hpcfl.native.cc`), or None where it cannot
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
        # host tensors whatever torch's default device is: the kernels take host pointers
        on = {"dtype": dtype, "device": "cpu"}
        x = torch.arange(-20.0, 32.0, **on).remainder(7.0).sub(3.0).view(1, 2, 2, 13).repeat(1, 1, 3, 1)
        x = x.view(1, 2, 6, 13)[..., :5, :]                          # odd height and width
        x[0, 0, 0, :4] = torch.tensor([-0.0, 0.0, float("nan"), -float("nan")], **on)
        x = x.contiguous()
        ints = torch.int32 if dtype == torch.float32 else torch.int64
        out, idx = torch.empty(1, 2, 2, 6, **on), torch.empty(1, 2, 2, 6, dtype=torch.int64, device="cpu")
        k.pool2x2(x, out, idx)
        ref, ref_idx = F.max_pool2d(x, 2, return_indices=True)
        if not (torch.equal(out.view(ints), ref.view(ints)) and torch.equal(idx, ref_idx)):
            return False
        pos, dx = torch.empty(1, 2, 2, 6, dtype=torch.int8, device="cpu"), torch.empty_like(x)
        k.relu_pool2x2(x, out, pos)
        g = torch.linspace(-1.0, 1.0, 24, **on).view(1, 2, 2, 6)
        g[0, 0, 0, :2] = torch.tensor([-0.0, float("nan")], **on)
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

    The C form (``pool.c``, see :mod:`hpcfl.native.cc`) comes first: it loads in about a millisecond
    once compiled, where numba's load takes 0.5-1 s, and its vector loops are as fast or
    faster. Either form must give torch's bits on a small hard input before it is used
    (:func:`_agrees_with_torch`); the engine loads them before round 1 when the model trains
    on CPU (:func:`hpcfl.models.pool.load_for`), elsewhere the first CPU forward does.
    """
    if not _KERNELS:
        chosen = None
        for name, make in (("C", _c_kernels), ("numba", _numba_kernels)):
            try:
                k = make()
                if k is None:
                    continue
                with _outside_transforms():   # a first call may come from inside torch.func.grad or vmap
                    same = _agrees_with_torch(k)
            except Exception as err:   # a broken numba install or cache, a library missing a symbol: the next form
                warnings.warn(f"hpcfl: the {name} max pooling is off ({err})", stacklevel=2)
                continue
            if same:
                chosen = k
                break
            warnings.warn(f"hpcfl: the {name} max pooling does not give torch's bits on this machine; it is off",
                          stacklevel=2)
        _KERNELS.append(chosen)
    return _KERNELS[0]
