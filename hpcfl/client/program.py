"""A model's local SGD step without autograd: the same torch kernels, called directly.

A LeNet-5 step on one CPU thread spends about a quarter of its time outside the kernels:
building the autograd graph, the engine's walk over it, ``AccumulateGrad`` nodes and
their checks (docs/performance.md, "Clients on CPU threads"). For a model that is a plain
chain of layers, the forward pass can keep what the backward pass needs and the backward
pass can call the derivative kernels autograd would call, with the same arguments in the
same order, writing each parameter's gradient straight into the flat gradient buffer.

Supported chains (anything else keeps autograd): ``nn.Conv2d`` (zero padding given as
integers), ``nn.Linear`` on 2-d inputs, ``nn.ReLU``, ``nn.Tanh``, ``nn.Flatten``,
``nn.MaxPool2d``, ``nn.Identity`` and the zoo's compiled ``ReLUMaxPool2x2`` and ``MaxPool2x2``
(:mod:`hpcfl.models.pool`), ending in logits for ``F.cross_entropy``. Such a model is found
by tracing its ``forward`` with ``torch.fx`` (the layers above as leaves): the graph must be
one chain, each layer reading the previous one's output.

The gradients are autograd's bit for bit: each derivative is the kernel autograd's own
formula calls (``convolution_backward`` with the same output mask, ``threshold_backward``,
``g.t() @ x`` for a weight, the batch sum for a bias, ``nll_loss_backward`` then
``_log_softmax_backward_data``), and the buffer gets the ``0 + g`` that accumulating into a
zeroed ``.grad`` gives (which turns a -0.0 into +0.0). :func:`compile_step` does not take this
on trust: it runs one step both ways on the first samples of the training set and keeps
the program only if the loss and every gradient element are bitwise equal
(tests/unit/test_program.py also compares whole training runs).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..models.pool import MaxPool2x2, ReLUMaxPool2x2, _relu_pool, _relu_pool_grad, _takes_kernel

aten = torch.ops.aten
_LEAVES = (nn.Conv2d, nn.Linear, nn.ReLU, nn.Tanh, nn.Flatten, nn.MaxPool2d, nn.Identity, ReLUMaxPool2x2, MaxPool2x2)


class _Conv:
    def __init__(self, m: nn.Conv2d, grads: dict):
        self.w, self.b = m.weight, m.bias
        self.gw, self.gb = grads[id(m.weight)], (grads[id(m.bias)] if m.bias is not None else None)
        self.args = (list(m.stride), list(m.padding), list(m.dilation), False, [0, 0], m.groups)
        self.bias_sizes = [m.out_channels] if m.bias is not None else None

    def forward(self, x):
        self.x = x
        return aten.convolution(x, self.w, self.b, *self.args)

    def backward(self, g, need_input: bool):
        gi, gw, gb = aten.convolution_backward(g, self.x, self.w, self.bias_sizes, *self.args,
                                               [need_input, True, self.b is not None])
        self.gw.copy_(gw)
        if self.gb is not None:
            self.gb.copy_(gb)
        return gi


class _Linear:
    def __init__(self, m: nn.Linear, grads: dict):
        self.w, self.b = m.weight, m.bias
        self.gw, self.gb = grads[id(m.weight)], (grads[id(m.bias)] if m.bias is not None else None)

    def forward(self, x):
        if x.dim() != 2:
            raise _Unsupported("a linear layer on a non-2-d input")
        self.x = x
        return torch.addmm(self.b, x, self.w.t()) if self.b is not None else torch.mm(x, self.w.t())

    def backward(self, g, need_input: bool):
        torch.mm(g.t(), self.x, out=self.gw)   # autograd's mm_mat2_backward for the weight's transpose
        if self.gb is not None:
            torch.sum(g, 0, out=self.gb)
        return torch.mm(g, self.w) if need_input else None


class _ReLU:
    def forward(self, x):
        self.y = torch.relu(x)
        return self.y

    def backward(self, g, need_input: bool):
        return aten.threshold_backward(g, self.y, 0)


class _Tanh:
    def forward(self, x):
        self.y = torch.tanh(x)
        return self.y

    def backward(self, g, need_input: bool):
        return aten.tanh_backward(g, self.y)


class _Flatten:
    def __init__(self, start: int = 1, end: int = -1):
        self.start, self.end = start, end

    def forward(self, x):
        self.shape = x.shape
        return x.flatten(self.start, self.end)

    def backward(self, g, need_input: bool):
        return g.reshape(self.shape)


class _Identity:
    def forward(self, x):
        return x

    def backward(self, g, need_input: bool):
        return g


class _MaxPool:
    """Max pooling, ReLU first when ``relu``; the zoo's compiled kernels where they apply."""

    def __init__(self, kernel, stride, padding, dilation, ceil: bool, relu: bool, max_threads: int = 0):
        self.args = (list(kernel), list(stride), list(padding), list(dilation), ceil)
        self.relu, self.max_threads = relu, max_threads
        self.fused = relu and max_threads > 0   # ReLUMaxPool2x2's one-pass kernels

    def forward(self, x):
        self.x = x
        if self.fused and _takes_kernel(x, self.max_threads):
            self.out, self.pos = _relu_pool(x)
            return self.out
        self.pos = None
        self.r = torch.relu(x) if self.relu else x
        out, self.idx = aten.max_pool2d_with_indices(self.r, *self.args)
        return out

    def backward(self, g, need_input: bool):
        if self.pos is not None:
            return _relu_pool_grad(g, self.x, self.out, self.pos)
        gr = aten.max_pool2d_with_indices_backward(g, self.r, *self.args, self.idx)
        return aten.threshold_backward(gr, self.r, 0) if self.relu else gr


class _Unsupported(Exception):
    pass


def _pair(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


def _layer(m: nn.Module, grads: dict):
    if isinstance(m, nn.Conv2d):
        if m.padding_mode != "zeros" or isinstance(m.padding, str):
            raise _Unsupported(f"convolution padding {m.padding!r} / {m.padding_mode!r}")
        return _Conv(m, grads)
    if isinstance(m, nn.Linear):
        return _Linear(m, grads)
    if isinstance(m, nn.ReLU):
        return _ReLU()
    if isinstance(m, nn.Tanh):
        return _Tanh()
    if isinstance(m, nn.Flatten):
        return _Flatten(m.start_dim, m.end_dim)
    if isinstance(m, nn.Identity):
        return _Identity()
    if isinstance(m, ReLUMaxPool2x2):
        return _MaxPool((2, 2), (2, 2), (0, 0), (1, 1), False, True, m.MAX_THREADS)
    if isinstance(m, MaxPool2x2):
        return _MaxPool((2, 2), (2, 2), (0, 0), (1, 1), False, False)
    if isinstance(m, nn.MaxPool2d) and not m.return_indices:
        stride = m.stride if m.stride is not None else m.kernel_size
        return _MaxPool(_pair(m.kernel_size), _pair(stride), _pair(m.padding), _pair(m.dilation), m.ceil_mode, False)
    raise _Unsupported(f"layer {type(m).__name__}")


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, name: str) -> bool:
        return isinstance(m, _LEAVES) or super().is_leaf_module(m, name)


def _chain(module: nn.Module) -> list[nn.Module | tuple]:
    """The model's forward as a list of leaf modules (or ("flatten", start, end)), in order."""
    try:
        graph = _Tracer().trace(module)
    except Exception as e:   # noqa: BLE001  (data-dependent control flow and the like: not a chain)
        raise _Unsupported(f"forward cannot be traced ({type(e).__name__})") from None
    chain, prev = [], None
    for node in graph.nodes:
        if node.op == "placeholder":
            if prev is not None:
                raise _Unsupported("forward takes more than one input")
            prev = node
            continue
        if node.op == "output":
            if node.args[0] is not prev:
                raise _Unsupported("the output is not the last layer's")
            break
        tensors = [a for a in list(node.args) + list(node.kwargs.values()) if isinstance(a, torch.fx.Node)]
        if tensors != [prev] or node.args[0] is not prev:
            raise _Unsupported("the layers do not form one chain")
        if node.op == "call_module":
            chain.append(module.get_submodule(node.target))
        elif (node.op == "call_function" and node.target is torch.flatten) or (
                node.op == "call_method" and node.target == "flatten"):
            rest = list(node.args[1:])
            start = node.kwargs.get("start_dim", rest[0] if rest else 0)
            end = node.kwargs.get("end_dim", rest[1] if len(rest) > 1 else -1)
            chain.append(("flatten", start, end))
        elif node.op == "call_function" and node.target in (torch.relu, F.relu) and not node.kwargs.get("inplace"):
            chain.append(nn.ReLU())
        else:
            raise _Unsupported(f"operation {node.target!r}")
        prev = node
    return chain


class StepProgram:
    """One model's loss and gradient for a mini-batch, without autograd.

    Parameters
    ----------
    model : FlatModel
        Its module's parameters are read in place (the solver updates them between steps);
        gradients go to the flat buffer of :meth:`FlatModel.grad_into`.
    layers : list
        The chain's layer objects, input first.
    """

    def __init__(self, model, layers: list):
        self.model, self.layers = model, layers

    def loss_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean cross-entropy of the batch and its gradient, shapes () and (num_params,).

        The gradient is the model's reused buffer: consume it before the next call.
        """
        with torch.no_grad():
            h = xb
            for layer in self.layers:
                h = layer.forward(h)
            logp = aten._log_softmax(h, 1, False)
            loss, total = aten.nll_loss_forward(logp, yb, None, 1, -100)
            g = aten.nll_loss_backward(torch.ones((), dtype=loss.dtype, device=loss.device), logp, yb, None, 1,
                                       -100, total)
            g = aten._log_softmax_backward_data(g, logp, 1, logp.dtype)
            last = len(self.layers) - 1
            for i in range(last, -1, -1):
                g = self.layers[i].backward(g, i > 0)
            flat = self.model.grad_buffer()[0]
            flat.add_(0.0)   # what accumulating into a zeroed .grad does: -0.0 becomes +0.0
        return loss, flat


def compile_step(model, x_sample: torch.Tensor, y_sample: torch.Tensor) -> tuple[StepProgram | None, str]:
    """A :class:`StepProgram` for ``model`` and ``""``, or None and why the model keeps autograd.

    ``x_sample``, ``y_sample``: a few training samples (B, *input_shape), (B,) on which one
    step is computed both ways; the program is kept only if the loss and the gradient are
    bitwise autograd's.
    """
    m = model.module
    if model.device.type != "cpu":
        return None, "not on CPU"
    if model.length != model.num_params:
        return None, "the model has float buffers"
    if getattr(m, "loss", None) is not None:
        return None, "the model has its own loss"
    if y_sample.dtype != torch.int64:
        return None, "labels are not class indices"
    try:
        chain = _chain(m)
        grads = {id(p): v for p, v in zip(model.params, model.grad_buffer()[1])}
        layers = [_Flatten(*item[1:]) if isinstance(item, tuple) else _layer(item, grads) for item in chain]
        if len({id(p) for p in model.params}) != len(model.params) or any(
                sum(p is q for lay in layers for q in (getattr(lay, "w", None), getattr(lay, "b", None))) != 1
                for p in model.params):
            raise _Unsupported("a parameter is shared by layers or used by none")
        program = StepProgram(model, layers)
        loss, grad = program.loss_grad(x_sample, y_sample)
        mine = (loss.clone(), grad.clone())
    except _Unsupported as e:
        return None, str(e)
    except RuntimeError as e:   # the model's own forward fails here too: autograd's error will say it at training
        return None, f"its step failed in the check ({str(e).splitlines()[0][:120]})"
    ref_loss = F.cross_entropy(m(x_sample), y_sample)
    ref = model.grad_into(ref_loss)
    same = (torch.equal(ref_loss.detach(), mine[0])
            and np.array_equal(ref.numpy().view(np.uint8), mine[1].numpy().view(np.uint8)))
    if not same:
        return None, "its step differed from autograd's in the check"
    return program, ""
