"""FedLGA's g_i: the gradient at a slow client's last iterate, computed by the rank that holds the client.

Eq. 6 of the paper (004, lines 287-291) builds G = g g^T from dF_i(w_{i,E_i}) / dw, the gradient of the
client's local objective F_i, its empirical risk over its private training data (004, lines 142-143), at
the truncated local model w_{i,E_i} = x^t + D_i. Two ways to get it (``grad_proxy``):

- :func:`full_gradient` (``"full_grad"``, the paper's G): the mean gradient over all n_i training samples
  of the client, no weight decay (the paper's F_i has none). The client runs one more pass over its data,
  about ceil(n_i / B) steps of compute (forward-backward without the update), and uploads one more (P,)
  vector; :meth:`hpcfl.algorithms.fedlga.LgaRule.finish_steps` and ``transfer`` charge both to the
  simulated clock.
- :func:`last_gradient` (``"last_grad"``): a cheaper estimate, one mini-batch of B samples plus the L2
  term of weight decay (the objective the local solver follows): the full gradient plus batch noise.

Both load the client's last iterate into the rank's model, which the caller restores afterwards
(``ctx.clients.load_x0()``), and both are independent of the rank that computes them.
"""

from __future__ import annotations

import numpy as np

# Samples per forward-backward of the full pass. Fixed, not derived from the rank count or the
# device, so the chunks, and the float64 sum over them in chunk order, are the same on any rank.
FULL_GRAD_CHUNK = 128


def full_steps_of_pass(sizes: np.ndarray, batch: int) -> np.ndarray:
    """Steps' worth of compute of one pass over each client's data: ceil(n_i / B), int64 (k,)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return -(-sizes // int(batch))


def full_gradient(ctx, j: int, res, P: int, chunk: int = FULL_GRAD_CHUNK) -> np.ndarray:
    """The paper's g_i (Eq. 6): grad F_i at client ``j``'s last iterate over all its training samples.

    F_i(w) = (1 / n_i) sum_k l(w; xi_k) over the client's n_i samples, in their stored order, in chunks
    of ``chunk`` samples: g = (1 / n_i) sum_chunks m_c grad(mean loss of the chunk), summed in float64
    in chunk order. No weight decay. The module runs in training mode, as in local training (batch
    norm normalises each chunk by its own statistics), without augmentation.

    Parameters
    ----------
    ctx : RoundContext
        ``ctx.clients`` (:class:`hpcfl.client.trainer.LocalClients`) and ``ctx.sizes`` (k,).
    j : int
        The client's cohort position.
    res : ClientResult
        Its training result; ``res.delta`` (L,) is D_i over the flat state.
    P : int
        Number of trainable parameters (the prefix of the flat state).
    chunk : int
        Samples per forward-backward; memory is one chunk's activations.

    Returns
    -------
    (P,) float64. Costs ceil(n_i / chunk) forward-backward passes, n_i samples in all.
    """
    # torch, imported here: reading a job must not import it
    import torch

    c = ctx.clients
    n = int(ctx.sizes[j])
    if n < 1:
        raise ValueError(f"client at cohort position {j} has no training samples: no gradient of F_i")
    c.model.load(c.x0 + res.delta)
    c.model.module.train()
    total = None
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        x, y = c.data(j, torch.arange(lo, hi))
        # the chunk's mean loss times its size: its share of the sum over the client's samples
        g = c.model.grad(c.loss_fn(c.model.module(x), y)).detach().double()[:P] * (hi - lo)
        total = g if total is None else total.add_(g)
    return (total / n).cpu().numpy()


def last_gradient(ctx, j: int, res, P: int) -> np.ndarray:
    """A one-mini-batch estimate of g_i: the gradient of client ``j``'s training objective at its last iterate.

    One mini-batch of the trainer's batch size, drawn from the client's data with the generator
    keyed by (seed, STATS, round, client), so the value does not depend on which rank computes it;
    plus the L2 term of weight decay (the objective the local solver follows, not the paper's F_i).
    Costs one forward-backward; returns (P,) float64.
    """
    # torch, imported here: reading a job must not import it
    from ..client.stats import stats_sample

    c = ctx.clients
    c.model.load(c.x0 + res.delta)
    c.model.module.train()
    x, y = c.data(j, stats_sample(int(ctx.sizes[j]), c.trainer.batch_size, c.generator(j)))
    g = c.model.grad(c.loss_fn(c.model.module(x), y)).detach().double()
    if c.weight_decay:
        g = g + c.weight_decay * c.model.weights.detach().double()
    return g.cpu().numpy()[:P]
