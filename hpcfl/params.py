"""A model's parameters and float buffers as one flat vector.

The engine moves models as flat vectors (the wire format), and local solvers update
parameters with one vectorised operation. :class:`FlatModel` makes every parameter and
floating-point buffer of a module a *view* into one contiguous tensor, so loading a
global model is one ``copy_``, a client's delta is one subtraction, and nothing is
copied back and forth between the module and the vector.

Layout: ``[parameters in module order | float buffers in module order]``. Parameters
come first so that ``flat[:num_params]`` is what solvers update; buffers (batch-norm
running statistics) are averaged like parameters but never stepped on.
Integer buffers (``num_batches_tracked``) are not part of the vector.
"""

from __future__ import annotations

import numpy as np
import torch


class FlatModel:
    """Flat-vector view of a ``torch.nn.Module``.

    Parameters
    ----------
    module : torch.nn.Module
        Moved to ``device``/``dtype``; its parameters and float buffers become views.
    device : torch.device
    dtype : torch.dtype

    Attributes
    ----------
    flat : torch.Tensor, shape (L,)
        The storage; L = num_params + num_buffer_elements.
    num_params : int
        Length of the trainable prefix.
    names, shapes : list
        Entry names ("param:conv1.weight", "buffer:bn.running_mean") and shapes.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device, dtype: torch.dtype):
        self.module = module.to(device=device, dtype=dtype)
        self.device = device
        self.dtype = dtype
        params = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        buffers = [(n, b) for n, b in self.module.named_buffers() if b.is_floating_point()]
        self.params = [p for _, p in params]
        self.names = [f"param:{n}" for n, _ in params] + [f"buffer:{n}" for n, _ in buffers]
        self.shapes = [tuple(t.shape) for _, t in params] + [tuple(t.shape) for _, t in buffers]
        sizes = [int(np.prod(s)) for s in self.shapes]
        self.num_params = int(sum(sizes[: len(params)]))
        self.length = int(sum(sizes))
        self.flat = torch.zeros(self.length, device=device, dtype=dtype)
        self._grad_flat: torch.Tensor | None = None   # grad_into's buffer, made on first use
        offset = 0
        for (name, tensor), size in zip(params + buffers, sizes):
            view = self.flat[offset : offset + size].view_as(tensor)
            view.copy_(tensor.detach())
            if name in dict(params):
                tensor.data = view
            else:
                owner, _, attr = name.rpartition(".")
                sub = self.module.get_submodule(owner) if owner else self.module
                sub._buffers[attr] = view
            offset += size

    @property
    def weights(self) -> torch.Tensor:
        """The trainable prefix ``flat[:num_params]`` (a view)."""
        return self.flat[: self.num_params]

    def load(self, vec) -> None:
        """Copy a flat vector (numpy or torch, any float dtype) into the model."""
        if isinstance(vec, np.ndarray):
            vec = torch.from_numpy(vec)
        self.flat.copy_(vec)

    def grad(self, loss: torch.Tensor) -> torch.Tensor:
        """Gradient of ``loss`` w.r.t. the parameters as one flat tensor, shape (num_params,)."""
        grads = torch.autograd.grad(loss, self.params)
        return torch.cat([g.reshape(-1) for g in grads])

    def grad_into(self, loss: torch.Tensor) -> torch.Tensor:
        """Like :meth:`grad`, into one buffer kept for the model's life: no allocation per step.

        Every parameter's ``.grad`` is a view into the buffer, zeroed here before the
        backward pass accumulates into it. The result is overwritten by the next call: use
        it before then (the local-training loop does); :meth:`grad` returns a fresh tensor.
        """
        flat, views = self.grad_buffer()
        for p, view in zip(self.params, views):
            if p.grad is not view:   # first use, or someone (zero_grad) reset it
                p.grad = view
        flat.zero_()
        loss.backward()
        return flat

    def grad_buffer(self) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The flat gradient buffer (num_params,) of :meth:`grad_into` and one view of it per
        parameter, in ``params`` order; made on first use and kept for the model's life."""
        if self._grad_flat is None:
            self._grad_flat = torch.zeros(self.num_params, device=self.device, dtype=self.dtype)
            offsets = np.cumsum([0] + [p.numel() for p in self.params])
            self._grad_views = [self._grad_flat[a:b].view_as(p) for p, a, b in zip(self.params, offsets, offsets[1:])]
        return self._grad_flat, self._grad_views

    def numpy(self) -> np.ndarray:
        """A host copy of the flat vector."""
        return self.flat.detach().cpu().numpy().copy()
