"""The candidates for training small convolutional and dense clients faster on CPU threads.

    python bench/lanes_bench.py                       # LeNet-5 at W's shape, about 2 minutes on 2 cores
    python bench/lanes_bench.py --model mlp --blocks 5

Each route trains the same clients (batch 32, W's image shape, or the quickstart MLP's) through
hpcfl's own trainers, and prints milliseconds per client step, the median of interleaved blocks
(every route sees the same load), with the load average before and after:

* one client at a time on 1 and on 2 torch threads, through autograd (the loop before lanes);
* the same with the model and batches in channels-last memory format (autograd);
* the graph-free step (:mod:`hpcfl.client.program`) on 1 thread;
* lanes: 2 clients side by side, 1 thread each (:mod:`hpcfl.client.lanes`), graph-free step;
* vmap groups (:mod:`hpcfl.client.block`, ``runtime.vectorize = "on"``): 8 clients as one
  batched computation on 2 threads.

docs/performance.md, "Clients on CPU threads", quotes these figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings

import torch

from hpcfl import rng
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.client.block import BlockTrainer
from hpcfl.client.lanes import Lanes
from hpcfl.client.trainer import Trainer
from hpcfl.models.cnn import LeNet5
from hpcfl.models.simple import Mlp
from hpcfl.params import FlatModel

CPU = torch.device("cpu")
SPEC = SolverSpec(lr=0.01)
MODELS = {"lenet5": (lambda: LeNet5((3, 32, 32), 10), (3, 32, 32)),                  # W's model
          "mlp": (lambda: Mlp(64, (64,), 10, "relu"), (64,)),                          # the quickstart's
          "fedlga_mlp": (lambda: Mlp(784, (200, 200), 10, "relu"), (784,))}            # FedLGA's FMNIST MLP


def clients(n: int, steps: int):
    """(position, slot, indices, steps, generator) for n clients of 8 batches of 32 samples."""
    return [(j, j, torch.arange(j * 256, (j + 1) * 256), steps, rng.torch_generator(CPU, 0, rng.CLIENT_TRAIN, 0, j))
            for j in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="lenet5")
    ap.add_argument("--blocks", type=int, default=7, help="interleaved blocks per route (median taken)")
    ap.add_argument("--clients", type=int, default=8, help="clients per block")
    ap.add_argument("--steps", type=int, default=8, help="local steps per client")
    a = ap.parse_args()
    # channels-last weights against the flat (NCHW) gradient buffer: autograd copies, and says so each step
    warnings.filterwarnings("ignore", message=".*gradient layout contract.*")
    build, shape = MODELS[a.model]
    x = torch.randn(a.clients * 256, *shape)
    y = torch.randint(0, 10, (a.clients * 256,))
    cl_x = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x

    def trainer(step: str, channels_last: bool = False) -> tuple[Trainer, torch.Tensor]:
        torch.manual_seed(0)
        module = build()
        if channels_last:
            module = module.to(memory_format=torch.channels_last)
        model = FlatModel(module, CPU, torch.float32)
        if channels_last:   # FlatModel's flat views are contiguous: give the convolutions channels-last weights
            for m in module.modules():
                if isinstance(m, torch.nn.Conv2d):
                    m.weight.data = m.weight.data.contiguous(memory_format=torch.channels_last)
        return Trainer(model, cl_x if channels_last else x, y, 32, step=step), model.flat.detach().clone()

    def one_by_one(tr, x0, threads):
        def go():
            torch.set_num_threads(threads)
            for _, _, idx, k, gen in clients(a.clients, a.steps):
                tr.train(x0, idx, k, LocalSolver(SPEC), gen, None, SPEC.lr)
        return go

    ag, ag0 = trainer("autograd")
    gf, gf0 = trainer("auto")
    lanes = Lanes(gf, SPEC, 2)
    block = BlockTrainer(ag.model, x, y, 32, group_size=a.clients, fused=False)
    routes = {
        "one at a time, autograd, 1 thread": one_by_one(ag, ag0, 1),
        "one at a time, autograd, 2 threads": one_by_one(ag, ag0, 2),
        "lanes: 2 clients x 1 thread, graph-free": lambda: (torch.set_num_threads(2), list(
            lanes.train(gf0, clients(a.clients, a.steps), lambda s: None, SPEC.lr))),
        "one at a time, graph-free, 1 thread": one_by_one(gf, gf0, 1),
        "vmap group of all clients, 2 threads": lambda: (torch.set_num_threads(2), block.train(
            ag0, [(idx, k, gen) for _, _, idx, k, gen in clients(a.clients, a.steps)], SPEC, SPEC.lr)),
    }
    if x.dim() == 4:
        cl, cl0 = trainer("autograd", channels_last=True)
        routes["one at a time, channels-last, 1 thread"] = one_by_one(cl, cl0, 1)
        routes["one at a time, channels-last, 2 threads"] = one_by_one(cl, cl0, 2)
    times = {name: [] for name in routes}
    for f in routes.values():   # warm-up: oneDNN's primitives, the pooling kernel's load
        f()
    load0 = os.getloadavg()[0]
    per_block = a.clients * a.steps
    for b in range(a.blocks):
        names = list(routes) if b % 2 == 0 else list(routes)[::-1]
        for name in names:
            t = time.perf_counter()
            routes[name]()
            times[name].append((time.perf_counter() - t) / per_block * 1e3)
    base = statistics.median(times["one at a time, autograd, 2 threads"])
    print(f"{a.model}, batch 32, {a.clients} clients x {a.steps} steps per block, {a.blocks} blocks; "
          f"load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"{'route':44s} {'ms/step':>8s} {'range':>13s} {'vs 2 threads':>12s}")
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:44s} {med:8.3f} {min(v):6.3f}-{max(v):6.3f} {med / base:11.2f}x")


if __name__ == "__main__":
    main()
