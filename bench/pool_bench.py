"""The compiled ReLU + 2 x 2 max pooling layers against torch's, in one process, interleaved.

    [HPCFL_NO_CC=1] python bench/pool_bench.py [--threads 1] [--blocks 12] [--steps 40]

Prints microseconds per call of the pooling layers alone (LeNet-5's two pooling shapes at
batch 32, forward and backward; ``MaxPool2x2`` against ``nn.MaxPool2d(2)``, and
``ReLUMaxPool2x2`` against ``nn.ReLU()`` then ``nn.MaxPool2d(2)``), then milliseconds per SGD
step of LeNet-5 at batch 32 on CIFAR-shaped inputs, with the zoo's layers (``ReLUMaxPool2x2``)
and with torch's (:func:`hpcfl.bench.bare.torch_layers`),
timed in alternating blocks of ``--steps`` steps so that both see the same machine drift: the
median over ``--blocks`` blocks, and the range of the per-block ratios. The two networks start
from the same weights and see the same batches; at the end the script checks that their
weights are still bitwise equal.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
import torch.nn.functional as F

from hpcfl.bench.bare import torch_layers
from hpcfl.models import pool
from hpcfl.models.cnn import LeNet5


def per_call_us(fn, n: int = 300) -> float:
    for _ in range(20):
        fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def layer_figures() -> None:
    relu_pool = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.MaxPool2d(2))
    for shape in [(32, 6, 28, 28), (32, 16, 10, 10)]:
        x = torch.randn(shape).requires_grad_()
        g = torch.randn(shape[0], shape[1], shape[2] // 2, shape[3] // 2)
        for name, layer in (("torch pool", torch.nn.MaxPool2d(2)), ("compiled pool", pool.MaxPool2x2()),
                            ("torch relu+pool", relu_pool), ("compiled relu+pool", pool.ReLUMaxPool2x2())):
            fwd = per_call_us(lambda: layer(x))
            both = per_call_us(lambda: layer(x).backward(g))
            print(f"  {str(shape):<17} {name:<19} forward {fwd:7.1f} us, forward + backward {both:7.1f} us")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if pool.kernels() is None:
        print("neither a C compiler nor numba can be had (or HPCFL_NO_CC and HPCFL_NO_NUMBA are set): "
              "there is no compiled pooling to measure")
        return 1
    print(f"torch {torch.__version__}, {a.threads} thread(s), the {pool.kernels().backend} kernels "
          f"(HPCFL_NO_CC=1 measures numba's)")
    layer_figures()

    torch.manual_seed(0)
    zoo = LeNet5((3, 32, 32), 10)
    ref = torch_layers(copy.deepcopy(zoo))
    x = torch.randn(20000, 3, 32, 32)
    y = torch.randint(0, 10, (20000,))

    def stepper(net):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1)   # both networks draw the same batches

        def step():
            b = torch.randint(0, len(y), (32,), generator=gen)
            opt.zero_grad()
            F.cross_entropy(net(x[b]), y[b]).backward()
            opt.step()
        return step

    steps = {"torch": stepper(ref), "compiled": stepper(zoo)}
    times = {k: [] for k in steps}
    for _ in range(3):
        for s in steps.values():
            s()
    for blk in range(a.blocks):
        for name in (("torch", "compiled") if blk % 2 == 0 else ("compiled", "torch")):
            t = time.perf_counter()
            for _ in range(a.steps):
                steps[name]()
            times[name].append((time.perf_counter() - t) / a.steps * 1e3)
    ratios = sorted(c / t for c, t in zip(times["compiled"], times["torch"]))
    for name, ts in times.items():
        print(f"  LeNet-5 step, {name:<8} layers: {statistics.median(ts):6.2f} ms (median of {a.blocks} blocks)")
    print(f"  ratio compiled / torch: {statistics.median(ratios):.3f} (blocks {ratios[0]:.3f}-{ratios[-1]:.3f})")
    same = all(torch.equal(p, q) for p, q in zip(zoo.parameters(), ref.parameters()))
    print(f"  weights bitwise equal after {a.blocks * a.steps + 3} steps each: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
