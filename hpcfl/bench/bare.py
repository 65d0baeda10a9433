"""The bare torch loop ``hpcfl bench`` compares the engine with.

It does a workload's SGD work the way one would write it without a simulator: the same
data, clients, cohorts and local steps as the engine (taken from hpcfl's data layer and
sampler, so the work is identical), a local ``nn.Module`` (the zoo's architecture and initial
weights, written with torch's own layers: :func:`torch_layers`) with a fresh ``torch.optim.SGD``
per client, batches gathered by index from the training tensor, and, under MPI, each
round's cohort dealt to ranks longest-first (greedy balancing) with one float64
``Allreduce`` of ``[sum p_i delta_i | sum p_i]`` per round. No exact reduction, no records,
no checkpoints, no guards: what the engine adds is measured against this.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F


def run_bare(job: dict, comm, reverse: bool = False, layers: str = "torch", device: str = "cpu",
             vmap: bool = False) -> dict:
    """Train ``job``'s workload; returns per-round phase seconds and the work done (every rank),
    and the final flat model (``final``). ``reverse`` trains each rank's clients in reverse
    order (FedAvg does not depend on the order: a test checks the loop keeps clients independent).
    ``layers``: "torch" swaps the zoo's own layers for torch's (:func:`torch_layers`); "zoo" keeps them.
    ``device``: where the data, the model and the update sum live ("cpu", "cuda", "cuda:1").
    ``vmap``: train a round's clients as one batched computation (:func:`_vmapped_round`)."""
    rounds = bare_rounds(job, comm, reverse, layers, device, vmap)
    next(rounds)   # set up
    t_loop, rows = time.time(), []
    while True:
        try:
            rows.append(next(rounds))
        except StopIteration as end:
            return {"t_loop": t_loop, "rounds": rows, "final": end.value}


def bare_rounds(job: dict, comm, reverse: bool = False, layers: str = "torch", device: str = "cpu",
                vmap: bool = False):
    """The bare loop as a generator: the first ``next`` sets up (and yields None), each further one
    trains a round and yields its row; the final flat model is the generator's return value.
    ``hpcfl bench --interleave`` runs it a round at a time between the engine's rounds.

    On a GPU everything stays there: the training set, the model, each client's batches (drawn by a
    generator on the device) and the float64 update sum; the sum goes to the host only for MPI.
    Phase times wait for the device first (``torch.cuda.synchronize``)."""
    from .. import config, data, models
    from ..algorithms.sampling import Sampler
    from ..parallel.comm import deal
    from ..parallel.runtime import sync

    cfg = config.from_dict(job)
    a = cfg.algorithm
    rank, size = comm.rank, comm.size
    dev = torch.device(device)
    ds = data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed, cfg.data.cache)
    parts = data.make_partition(cfg.data.partition, ds.y_train, cfg.data.num_clients, cfg.partition_options,
                                cfg.run.seed, ds)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    parts_t = [torch.from_numpy(p).to(dev) for p in parts]
    x_train, y_train = torch.from_numpy(ds.x_train).to(dev), torch.from_numpy(ds.y_train).to(dev)
    x_test, y_test = torch.from_numpy(ds.x_test).to(dev), torch.from_numpy(ds.y_test).to(dev)
    sampler = Sampler("uniform", a.clients_per_round, cfg.run.seed, sizes.astype(np.float64))
    B = a.batch_size

    def steps_of(n: int) -> int:
        return a.local_steps if a.local_steps > 0 else a.local_epochs * -(-n // B)

    torch.manual_seed(cfg.run.seed)
    net = models.build_model(cfg.model.name, cfg.model_options, ds.input_shape, ds.num_classes)
    if layers == "torch":
        torch_layers(net)
    net.to(dev)
    params = [p for p in net.parameters()]
    global_flat = torch.nn.utils.parameters_to_vector(params).detach().clone()
    L = global_flat.numel()
    # the parameters become views of one local vector (vector_to_parameters assigns views, not
    # copies); each client starts by copying the global model into it
    local_flat = global_flat.clone()
    torch.nn.utils.vector_to_parameters(local_flat, params)
    acc = torch.zeros(L + 1, dtype=torch.float64, device=dev)

    def batches(cid: int, rnd: int, steps: int):
        """The client's batches: seeded per-epoch permutations of its samples, a partial last batch."""
        gen = torch.Generator(device=dev).manual_seed(cfg.run.seed * 1_000_003 + rnd * 100_003 + cid)
        idx, n = parts_t[cid], int(sizes[cid])
        perm, pos = None, n
        for _ in range(steps):
            if pos >= n:
                perm, pos = idx[torch.randperm(n, generator=gen, device=dev)], 0
            yield perm[pos : pos + B]
            pos += B

    yield None
    for rnd in range(cfg.run.rounds):
        sync(dev)
        t0 = time.perf_counter()
        cohort, _ = sampler.cohort(rnd)
        steps = np.array([steps_of(int(sizes[c])) for c in cohort])
        mine = np.flatnonzero(deal(steps * np.minimum(sizes[cohort], B), size) == rank)
        acc.zero_()
        net.train()
        order = mine[::-1] if reverse else mine
        if vmap:
            done = _vmapped_round(net, global_flat, [(int(cohort[j]), int(steps[j])) for j in order], batches,
                                  rnd, x_train, y_train, a.lr, sizes, acc)
        else:
            done = 0
            for j in order:
                cid = int(cohort[j])
                with torch.no_grad():
                    local_flat.copy_(global_flat)
                opt = torch.optim.SGD(params, lr=a.lr)
                for batch in batches(cid, rnd, int(steps[j])):
                    opt.zero_grad()
                    F.cross_entropy(net(x_train[batch]), y_train[batch]).backward()
                    opt.step()
                    done += 1
                acc[:L] += float(sizes[cid]) * (local_flat.detach() - global_flat).double()
                acc[L] += float(sizes[cid])
        sync(dev)
        t1 = time.perf_counter()
        if size > 1:
            from mpi4py import MPI
            host = acc.cpu().numpy()
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            acc.copy_(torch.from_numpy(host))
        global_flat += (acc[:L] / acc[L]).to(global_flat.dtype)
        sync(dev)
        t2 = time.perf_counter()
        accuracy = float("nan")
        last = rnd == cfg.run.rounds - 1
        if last or (cfg.run.eval_every and (rnd + 1) % cfg.run.eval_every == 0):
            accuracy = _evaluate(net, local_flat, global_flat, x_test, y_test, comm)
        sync(dev)
        t3 = time.perf_counter()
        yield {"round": rnd + 1, "train": t1 - t0, "reduce": t2 - t1, "eval": t3 - t2, "round_s": t3 - t0,
               "steps": done, "accuracy": accuracy}
    return global_flat.cpu().numpy().copy()


def _vmapped_round(net, global_flat, clients: list, batches, rnd: int, x, y, lr: float, sizes, acc) -> int:
    """One round's clients as one batched computation, as one would write it with ``torch.func``:
    their weights are the rows of a (G, L) tensor, ``vmap(grad(loss))`` gives every row's gradient
    on its own padded batch (padding weighted 0), and SGD updates the rows that still have steps
    (clients sorted by steps, longest first, so those are a prefix). Adds sum n_i Delta_i and
    sum n_i into ``acc``; returns the local steps taken."""
    from torch.func import functional_call, grad, vmap

    names = [n for n, _ in net.named_parameters()]
    shapes = [p.shape for _, p in net.named_parameters()]
    offsets = np.cumsum([0] + [int(np.prod(s)) for s in shapes])

    def loss(w, xb, yb, weight):
        ps = {n: w[a:b].view(s) for n, s, a, b in zip(names, shapes, offsets, offsets[1:])}
        return (F.cross_entropy(functional_call(net, ps, (xb,)), yb, reduction="none") * weight).sum()

    step = vmap(grad(loss))
    clients = sorted(clients, key=lambda c: -c[1])
    G, S, L = len(clients), (clients[0][1] if clients else 0), global_flat.numel()
    B = None
    rows = []   # per client: its list of batches
    for cid, k in clients:
        rows.append(list(batches(cid, rnd, k)))
        B = max([B or 0] + [len(b) for b in rows[-1]])
    w = global_flat.expand(G, L).clone()
    done = 0
    for k in range(S):
        active = sum(1 for _, steps in clients if steps > k)
        idx = torch.zeros(active, B, dtype=torch.int64, device=w.device)
        weight = torch.zeros(active, B, dtype=w.dtype, device=w.device)
        for g in range(active):
            b = rows[g][k]
            idx[g, : len(b)] = b
            weight[g, : len(b)] = 1.0 / len(b)
        w[:active] -= lr * step(w[:active], x[idx], y[idx], weight)
        done += active
    n = torch.tensor([float(sizes[cid]) for cid, _ in clients], dtype=torch.float64, device=w.device)
    acc[:L] += (n[:, None] * (w - global_flat).double()).sum(0)
    acc[L] += n.sum()
    return done


def torch_layers(net: torch.nn.Module) -> torch.nn.Module:
    """``net`` with each of the zoo's faster equivalents of torch layers replaced by torch's own,
    in place: :class:`~hpcfl.models.pool.MaxPool2x2` -> ``nn.MaxPool2d(2)`` and
    :class:`~hpcfl.models.pool.ReLUMaxPool2x2` -> ``nn.ReLU()`` then ``nn.MaxPool2d(2)`` (no
    weights; the same functions, bitwise). The network one would write by hand, with the zoo's
    weights."""
    from ..models.pool import MaxPool2x2, ReLUMaxPool2x2

    for parent in list(net.modules()):
        for name, child in parent.named_children():
            if isinstance(child, MaxPool2x2):
                setattr(parent, name, torch.nn.MaxPool2d(2))
            elif isinstance(child, ReLUMaxPool2x2):
                setattr(parent, name, torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool2d(2)))
    return net


@torch.no_grad()
def _evaluate(net, local_flat, flat, x, y, comm) -> float:
    local_flat.copy_(flat)
    net.eval()
    chunks = [(lo, min(lo + 1000, len(y))) for lo in range(0, len(y), 1000)][comm.rank :: comm.size]
    correct = np.zeros(1)
    for lo, hi in chunks:
        correct[0] += float((net(x[lo:hi]).argmax(1) == y[lo:hi]).sum())
    if comm.size > 1:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, correct, op=MPI.SUM)
    return correct[0] / len(y)
