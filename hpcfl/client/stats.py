"""Per-sample gradient statistics of a client: mean and per-coordinate variance.

FedGSNR (Accelerating FL on non-iid data via maximum gradient signal-to-noise ratio)
needs, at the round-start model, the mean mu and the biased (1/B) diagonal variance v of
B per-sample gradients. They come from one vectorised pass (``torch.func.vmap`` over
``torch.func.grad``), not B backward passes, processed in chunks so that at most
``chunk x P`` gradients exist at once (P = 14.7 M for VGG-16 would need 3.8 GB for B = 64).

The pass runs the module in eval mode: batch-norm statistics are not well defined for a
single sample, so batch norm uses its running statistics, and dropout is off. The
module's training flags are restored afterwards.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


class _Objective(torch.nn.Module):
    """loss_fn(net(x[None]), y[None]) as a module, so that ``functional_call`` swaps the
    parameters for the forward *and* for a loss that reads them (``Quadratic.loss``)."""

    def __init__(self, net: torch.nn.Module, loss_fn: Callable):
        super().__init__()
        self.net = net
        self.loss_fn = loss_fn

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.net(x.unsqueeze(0)), y.unsqueeze(0))


def auto_chunk(num_params: int) -> int:
    """Samples per vectorised call when ``chunk = 0``: about 4M gradient values at once.

    Tiny models gain from many samples per call (the transforms' dispatch dominates: an
    MLP with 2k parameters runs 4x faster per client with 20 clients per call); large
    ones are compute-bound and need the memory (LeNet-5: 67 samples, VGG-16: 1).
    """
    return int(min(4096, max(1, (1 << 22) // max(1, num_params))))


def per_sample_moments(module: torch.nn.Module, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                       loss_fn: Callable, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and biased variance of the per-sample gradients of ``loss_fn`` (one client).

    Parameters
    ----------
    module : torch.nn.Module
        The model; its buffers are used as they are (batch norm: running statistics).
    params : list of torch.Tensor
        Parameters of ``module`` to differentiate, in ``module.named_parameters()`` order
        (``FlatModel.params``); other parameters are held constant.
    x : torch.Tensor, shape (B, ...)
        B >= 1 input samples.
    y : torch.Tensor, shape (B, ...)
        Their targets.
    loss_fn : callable (output, target) -> scalar
        The loss the local optimiser minimises, evaluated on one sample at a time (batch
        of 1); e.g. ``F.cross_entropy`` or a model's own ``module.loss``.
    chunk : int
        Samples per vectorised call; memory is about ``chunk x P`` gradients.

    Returns
    -------
    mu, v : torch.Tensor, shape (P,), float64, on the parameters' device
        P = sum of ``numel`` over ``params``, flattened in that order (the layout of
        ``FlatModel.weights``). v is the 1/B (biased) variance. On the torch.func path
        both come from the centered two-pass formula over the client's rows, in the
        model's dtype (no cancellation, no B x P float64 copy), pieces merged in float64;
        on the all-Linear path (:func:`linear_moments`) from S1 and S2 in float64.

    Raises
    ------
    ValueError
        Empty batch, mismatched x and y, chunk < 1, or a tensor in ``params`` that is not
        a parameter of ``module``.
    """
    return per_sample_moments_many(module, params, [x], [y], loss_fn, chunk)[0]


def per_sample_moments_many(module: torch.nn.Module, params: list[torch.Tensor], xs: list[torch.Tensor],
                            ys: list[torch.Tensor], loss_fn: Callable,
                            chunk: int = 64) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`per_sample_moments` of several clients, sharing vectorised calls.

    Whole clients are packed into calls of at most ``chunk`` samples (a client larger than
    ``chunk`` is processed alone, in pieces), and each client's sums are taken over its own
    contiguous rows. So a client's result does not depend on which other clients share
    its calls, provided per-sample gradients are computed row by row, which
    ``tests/unit/test_gsnr_engine.py`` checks bitwise on the platform at hand (with
    ``chunk`` no larger than one client's samples it holds by construction).

    Models made only of ``nn.Linear`` layers (fed 2-D inputs) with the cross-entropy loss
    take an exact shortcut that never forms per-sample gradients: :func:`linear_moments`.

    Returns one (mu, v) pair per client, in the order given.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    for x, y in zip(xs, ys):
        if int(x.shape[0]) < 1 or int(y.shape[0]) != int(x.shape[0]):
            raise ValueError(f"need B >= 1 samples with one target each, got x {tuple(x.shape)}, y {tuple(y.shape)}")
    name_of = {id(p): n for n, p in module.named_parameters()}
    missing = [i for i, p in enumerate(params) if id(p) not in name_of]
    if missing:
        raise ValueError(f"params {missing} are not parameters of the module")
    if loss_fn is F.cross_entropy and _all_linear(module, params):
        out = linear_moments(module, params, xs, ys, chunk)
        if out is not None:
            return out
    names = [name_of[id(p)] for p in params]
    sizes = [p.numel() for p in params]
    device = params[0].device if params else xs[0].device
    total = sum(sizes)
    # per client: samples so far, mean and M2 = sum of squared deviations (float64)
    acc = [[0, torch.zeros(total, dtype=torch.float64, device=device),
            torch.zeros(total, dtype=torch.float64, device=device)] for _ in xs]

    objective = _Objective(module, loss_fn)
    buffers = {f"net.{n}": b for n, b in module.named_buffers()}

    def loss(p: dict, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(objective, (p, buffers), (xb, yb))

    per_sample_grad = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    wrt = {f"net.{n}": p.detach() for n, p in zip(names, params)}
    flags = [(m, m.training) for m in module.modules()]   # restore each submodule's own flag
    module.eval()
    try:
        for group in _pack(xs, chunk):
            x = torch.cat([xs[c][lo:hi] for c, lo, hi in group]) if len(group) > 1 else xs[group[0][0]][
                group[0][1] : group[0][2]]
            y = torch.cat([ys[c][lo:hi] for c, lo, hi in group]) if len(group) > 1 else ys[group[0][0]][
                group[0][1] : group[0][2]]
            grads = per_sample_grad(wrt, x, y)
            counts = [hi - lo for _, lo, hi in group]
            mus, vs = [], []
            for n, size in zip(names, sizes):
                g = grads[f"net.{n}"].reshape(-1, size)
                if len(set(counts)) == 1:    # the usual case: (clients, B, size), a few kernels in all
                    m, v = _centered(g.reshape(len(group), counts[0], size), dim=1)
                else:                        # each client's own contiguous rows
                    m, v = (torch.stack(t) for t in zip(*(_centered(r, dim=0) for r in torch.split(g, counts))))
                mus.append(m)
                vs.append(v)
            del grads
            mu, var = torch.cat(mus, dim=1).to(torch.float64), torch.cat(vs, dim=1).to(torch.float64)
            for i, (c, lo, hi) in enumerate(group):
                _combine(acc[c], hi - lo, mu[i], var[i])
    finally:
        for m, flag in flags:
            m.training = flag
    return [(mean.clone(), torch.clamp(m2 / count, min=0.0)) for count, mean, m2 in acc]


def _centered(g: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and biased variance over ``dim`` by the centered two-pass formula (no cancellation)."""
    mean = g.mean(dim=dim, keepdim=True)
    dev = g - mean
    return mean.squeeze(dim), (dev * dev).mean(dim=dim)


def _combine(acc: list, n: int, mu: torch.Tensor, var: torch.Tensor) -> None:
    """Merge a piece of n samples (mean, biased variance) into acc = [count, mean, M2] (Chan et al.)."""
    count, mean, m2 = acc
    if count == 0:             # the usual case: the whole client in one call
        acc[0], acc[1], acc[2] = n, mu, var * n
        return
    total = count + n
    delta = mu - mean
    acc[1] = mean + delta * (n / total)
    acc[2] = m2 + var * n + delta * delta * (count * n / total)
    acc[0] = total


def _all_linear(module: torch.nn.Module, params: list[torch.Tensor]) -> bool:
    owned = {id(t) for m in module.modules() if isinstance(m, torch.nn.Linear) for t in (m.weight, m.bias)
             if t is not None}
    return bool(params) and all(id(p) in owned for p in params)


def linear_moments(module: torch.nn.Module, params: list[torch.Tensor], xs: list[torch.Tensor],
                   ys: list[torch.Tensor], chunk: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
    """Exact per-sample gradient moments of an all-``nn.Linear`` model under cross-entropy.

    For a linear layer with inputs a (B, in) and output gradients delta (B, out) of the
    summed per-sample losses, sample b's weight gradient is delta_b a_b^T, so
    S1 = delta^T a and S2 = (delta^2)^T (a^2) (elementwise squares), and the bias gives
    sum delta and sum delta^2 (the sums BackPACK calls SumGradSquared): forward and
    backward passes over whole clients packed as in :func:`per_sample_moments_many`, then
    each client's sums from its own rows, in float64; no B x P gradients. Returns None
    when a layer sees inputs that are not (B, in) (a sequence model) or runs more than once
    per forward: the caller then takes the vmap path.
    """
    layers = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    seen: dict[int, list] = {}
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.setdefault(id(mod), []).append((inp[0], out)))
             for m in layers]
    flags = [(m, m.training) for m in module.modules()]
    module.eval()
    results: list = [None] * len(xs)
    try:
        for group in _pack(xs, chunk):
            if any(lo != 0 or hi != int(xs[c].shape[0]) for c, lo, hi in group):
                return None                       # a client split over calls: leave it to vmap
            seen.clear()
            x = torch.cat([xs[c] for c, _, _ in group]) if len(group) > 1 else xs[group[0][0]]
            y = torch.cat([ys[c] for c, _, _ in group]) if len(group) > 1 else ys[group[0][0]]
            with torch.enable_grad():
                loss = F.cross_entropy(module(x), y, reduction="sum")
                used = [m for m in layers if id(m) in seen]
                if any(len(seen[id(m)]) != 1 or seen[id(m)][0][0].dim() != 2 for m in used):
                    return None
                grads = torch.autograd.grad(loss, [seen[id(m)][0][1] for m in used])
            counts = [hi - lo for _, lo, hi in group]
            sums: dict[int, tuple] = {}
            for m, g in zip(used, grads):
                a, d = seen[id(m)][0][0].detach().double(), g.double()
                a3, d3 = torch.split(a, counts), torch.split(d, counts)   # each client's own rows
                sums[id(m.weight)] = ([dc.T @ ac for ac, dc in zip(a3, d3)],
                                      [(dc * dc).T @ (ac * ac) for ac, dc in zip(a3, d3)])
                if m.bias is not None:
                    sums[id(m.bias)] = ([dc.sum(0) for dc in d3], [(dc * dc).sum(0) for dc in d3])
            if any(id(p) not in sums for p in params):
                return None
            for i, (c, _, _) in enumerate(group):
                s1 = torch.cat([sums[id(p)][0][i].reshape(-1) for p in params])
                s2 = torch.cat([sums[id(p)][1][i].reshape(-1) for p in params])
                mu = s1 / counts[i]
                results[c] = (mu, torch.clamp(s2 / counts[i] - mu * mu, min=0.0))
    finally:
        for h in hooks:
            h.remove()
        for m, flag in flags:
            m.training = flag
    return results


def _pack(xs: list[torch.Tensor], chunk: int) -> list[list[tuple[int, int, int]]]:
    """Calls of whole clients, at most ``chunk`` samples each: lists of (client, lo, hi)."""
    groups, current, filled = [], [], 0
    for c, x in enumerate(xs):
        n = int(x.shape[0])
        if n > chunk:                            # alone, in pieces of ``chunk``
            if current:
                groups.append(current)
                current, filled = [], 0
            groups += [[(c, lo, min(lo + chunk, n))] for lo in range(0, n, chunk)]
            continue
        if filled + n > chunk:
            groups.append(current)
            current, filled = [], 0
        current.append((c, 0, n))
        filled += n
    if current:
        groups.append(current)
    return groups


def stats_sample(n: int, batch: int, gen: torch.Generator) -> torch.Tensor:
    """Positions of the samples behind one client's statistics.

    Parameters
    ----------
    n : int
        Number of local samples.
    batch : int
        B, the requested number of per-sample gradients.
    gen : torch.Generator
        The client's keyed generator (on the training device); one ``randperm`` draw per call.

    Returns
    -------
    torch.Tensor, shape (min(batch, n),), int64
        Distinct positions in [0, n), uniform without replacement; all n samples (in
        random order) when n < batch.
    """
    if n < 0 or batch < 0:
        raise ValueError(f"n and batch must be non-negative, got {n}, {batch}")
    return torch.randperm(n, generator=gen, device=gen.device)[:batch]
