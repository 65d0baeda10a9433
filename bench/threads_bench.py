"""Torch threads per rank against model size: the measurement behind ``runtime.threads = 0``.

For each model of the zoo at a typical input and batch, one local SGD step (forward,
backward, update) is timed with 1 and with 2 intra-op threads, the two interleaved in
blocks so that both see the same load; the median of the blocks is printed with the
machine's load average before and after (``os.getloadavg``), since other processes
change the answer: two threads only pay when both cores are free and each op has enough
work to split. hpcfl.parallel.runtime.pick_threads draws its line from these figures.

    python bench/threads_bench.py                 # every model, about a minute on 2 cores
    python bench/threads_bench.py --models mlp lenet5 --blocks 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from hpcfl import models
from hpcfl.config import options

# (model, options table, input shape, classes, batch): the shapes of the jobs in jobs/
CASES = {
    "logreg": ({}, (60,), 10, 32),                      # Synthetic(1,1)
    "mlp": ({"hidden": [64]}, (64,), 10, 16),           # the quickstart
    "fedlga_mlp": ({}, (784,), 10, 32),                 # FMNIST
    "lenet5": ({}, (3, 32, 32), 10, 64),                # FedGSNR / GIFT CIFAR-10
    "kws_lstm": ({}, (101, 40), 35, 32),                # GIFT speech commands
    "resnet18": ({}, (3, 32, 32), 10, 64),              # FedDisco CIFAR-10
    "vgg11": ({}, (3, 32, 32), 10, 32),                 # FedNova CIFAR-10
}


def step_time(net, x, y, steps: int) -> float:
    """Seconds per SGD step, over ``steps`` steps after one warm-up step."""
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def one():
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    one()
    t0 = time.perf_counter()
    for _ in range(steps):
        one()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="*", default=list(CASES))
    p.add_argument("--blocks", type=int, default=5, help="interleaved 1-thread / 2-thread blocks per model")
    p.add_argument("--seconds", type=float, default=0.5, help="about this long per block")
    a = p.parse_args()
    print(f"cpus {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'model':<11} {'params':>10}  {'1 thread ms':>11}  {'2 threads ms':>12}  {'2/1':>5}")
    for name in a.models:
        table, shape, classes, batch = CASES[name]
        torch.manual_seed(0)
        net = models.build_model(name, options.build(models.model_options(name), table, "model"), shape, classes)
        x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
        torch.set_num_threads(1)
        probe = step_time(net, x, y, 2)
        steps = max(2, int(a.seconds / probe))
        times = {1: [], 2: []}
        for _ in range(a.blocks):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                times[threads].append(step_time(net, x, y, steps))
        one, two = statistics.median(times[1]), statistics.median(times[2])
        params = sum(t.numel() for t in net.parameters())
        print(f"{name:<11} {params:>10,}  {one * 1e3:>11.3f}  {two * 1e3:>12.3f}  {two / one:>5.2f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
