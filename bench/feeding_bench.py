"""Local-training throughput: hpcfl's feeding path versus a DataLoader loop.

    python bench/feeding_bench.py [--threads 2] [--subset 0] [--client 5000] [--epochs 2] [--repeats 5]

One client of ``--client`` samples (drawn without replacement from W's training set,
docs/workloads.md, sorted like hpcfl's partitions) trains LeNet-5 (hpcfl's ``lenet5``) with SGD
lr 0.01, batch 32, for ``--epochs`` epochs: E * ceil(n / 32) steps, last batch of each
epoch partial, in every variant:

* ``hpcfl Trainer``: ``hpcfl.client.trainer.Trainer`` on a ``FlatModel`` with
  ``LocalSolver(SolverSpec(lr=0.01))``; the whole training tensor stays put and each
  batch is an index slice of it (the engine's path);
* ``DataLoader w=0``: ``DataLoader(TensorDataset(x_c, y_c), batch_size=32, shuffle=True)``
  over the client's samples and ``torch.optim.SGD`` (the usual PyTorch loop);
* ``DataLoader w=2``: the same with ``num_workers=2`` (persistent workers, created before
  timing; on 2 cores they compete with the training threads);
* ``bare slicing`` (reference): the engine's feeding (index slices of the whole tensor)
  with ``torch.optim.SGD`` and ``backward()``, to separate feeding from the flat-vector
  update.

Data: W's x_train (50,000 CIFAR-shaped samples, W's generator) or, with
``--subset N``, its first N rows (the same values, cheaper to generate). Threads are
fixed (``torch.set_num_threads``; OMP_NUM_THREADS is set to match when unset). One
warm-up epoch per variant, then ``--repeats`` timed repeats, interleaved across variants
so load changes hit all of them alike; the median is reported. Figures from a shared
machine are noisy; compare the ratios.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time

if __name__ == "__main__" and "OMP_NUM_THREADS" not in os.environ:
    _t = "2"
    for i, arg in enumerate(sys.argv):
        if arg == "--threads" and i + 1 < len(sys.argv):
            _t = sys.argv[i + 1]
        elif arg.startswith("--threads="):
            _t = arg.split("=", 1)[1]
    os.environ["OMP_NUM_THREADS"] = _t

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from hpcfl.algorithms.local import LocalSolver, SolverSpec  # noqa: E402
from hpcfl.client.trainer import Trainer  # noqa: E402
from hpcfl.models import build_model, model_options  # noqa: E402
from hpcfl.params import FlatModel  # noqa: E402


def w_train(n: int):
    """The first n rows of W's (x_train, y_train): same stream as W's recipe."""
    rng = np.random.default_rng(0)
    means = rng.standard_normal((10, 3, 32, 32), dtype=np.float32)
    y = rng.integers(0, 10, size=50000)[:n]
    x = means[y]
    x *= np.float32(1.5)
    for lo in range(0, n, 4096):
        hi = min(n, lo + 4096)
        x[lo:hi] += rng.standard_normal((hi - lo, 3, 32, 32), dtype=np.float32)
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def new_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("lenet5", model_options("lenet5")(), (3, 32, 32), 10)


def main() -> int:
    ap = argparse.ArgumentParser(description="hpcfl feeding path vs DataLoader (LeNet-5, CIFAR-shaped)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--subset", type=int, default=0, help="use the first N training rows (0: all 50,000)")
    ap.add_argument("--client", type=int, default=5000, help="samples of the one client")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--no-workers", action="store_true", help="skip the num_workers=2 DataLoader")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)

    t0 = time.perf_counter()
    n_all = a.subset or 50000
    x, y = w_train(n_all)
    idx_np = np.sort(np.random.default_rng(1).choice(n_all, size=a.client, replace=False))
    idx = torch.from_numpy(idx_np)
    xc, yc = x[idx].clone(), y[idx].clone()   # the client's own tensors, for the DataLoader
    n = a.client
    per_epoch = math.ceil(n / a.batch)
    steps = a.epochs * per_epoch
    lr = 0.01
    print(f"feeding_bench: LeNet-5, training tensor {n_all} x 3x32x32, one client of {n} samples, "
          f"{a.epochs} epoch(s) = {steps} steps of batch {a.batch}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; "
          f"load average {os.getloadavg()[0]:.2f}; data {time.perf_counter() - t0:.1f} s")
    print("command: " + shlex.join([os.path.basename(sys.executable), *sys.argv]))

    # ---- variants: each returns a callable that runs `epochs` epochs from the same start
    flat = FlatModel(new_model(), torch.device("cpu"), torch.float32)
    x0 = flat.flat.detach().clone()
    trainer = Trainer(flat, x, y, a.batch)
    solver = LocalSolver(SolverSpec(lr=lr))

    def hpcfl_run(epochs, rep):
        gen = torch.Generator().manual_seed(1000 + rep)
        res = trainer.train(x0, idx, epochs * per_epoch, solver, gen)
        return res.samples

    plain = new_model()
    init = {k: v.clone() for k, v in plain.state_dict().items()}

    def loader_run(loader):
        def run(epochs, rep):
            plain.load_state_dict(init)
            plain.train()
            opt = torch.optim.SGD(plain.parameters(), lr=lr)
            seen = 0
            for _ in range(epochs):
                for xb, yb in loader:
                    loss = F.cross_entropy(plain(xb), yb)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    seen += yb.numel()
            return seen
        return run

    def slicing_run(epochs, rep):
        plain.load_state_dict(init)
        plain.train()
        opt = torch.optim.SGD(plain.parameters(), lr=lr)
        gen = torch.Generator().manual_seed(1000 + rep)
        seen = 0
        for _ in range(epochs):
            perm = idx[torch.randperm(n, generator=gen)]
            for lo in range(0, n, a.batch):
                b = perm[lo : lo + a.batch]
                loss = F.cross_entropy(plain(x[b]), y[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                seen += b.numel()
        return seen

    variants = {
        "hpcfl Trainer": hpcfl_run,
        "DataLoader w=0": loader_run(DataLoader(TensorDataset(xc, yc), batch_size=a.batch, shuffle=True)),
    }
    notes = []
    if not a.no_workers:
        try:
            dl2 = DataLoader(TensorDataset(xc, yc), batch_size=a.batch, shuffle=True, num_workers=2,
                             persistent_workers=True)
            variants["DataLoader w=2"] = loader_run(dl2)
        except Exception as exc:  # noqa: BLE001 - report and go on
            notes.append(f"DataLoader num_workers=2 unavailable: {exc!r}")
    variants["bare slicing"] = slicing_run

    # ---- warm-up (one epoch each), then interleaved timed repeats
    for name, fn in list(variants.items()):
        try:
            fn(1, -1)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"{name} failed in warm-up: {exc!r}")
            del variants[name]
    times = {k: [] for k in variants}
    for rep in range(a.repeats):
        for name, fn in variants.items():
            t = time.perf_counter()
            seen = fn(a.epochs, rep)
            times[name].append(time.perf_counter() - t)
            assert seen == a.epochs * n, (name, seen)

    base = np.median(times["DataLoader w=0"]) if "DataLoader w=0" in times else float("nan")
    w = max(len(k) for k in times)
    best_base = min(times["DataLoader w=0"]) if "DataLoader w=0" in times else float("nan")
    line = "-" * (w + 92)
    print(line)
    print(f"{'variant':<{w}} | {'samples/s':>10} | {'ms/step':>8} | {'median s':>8} | {'min..max s':>15} | "
          f"{'vs DL w=0':>9} | {'best smp/s':>10} | {'best vs DL':>10}")
    print(line)
    for name, ts in times.items():
        med, best = float(np.median(ts)), float(min(ts))
        print(f"{name:<{w}} | {a.epochs * n / med:>10.0f} | {med / steps * 1e3:>8.2f} | {med:>8.3f} | "
              f"{min(ts):>7.3f}..{max(ts):<7.3f} | {base / med:>8.2f}x | {a.epochs * n / best:>10.0f} | "
              f"{best_base / best:>9.2f}x")
    print(line)
    if "hpcfl Trainer" in times and "bare slicing" in times:
        print(f"hpcfl Trainer / bare slicing throughput: "
              f"{np.median(times['bare slicing']) / np.median(times['hpcfl Trainer']):.2f}x (median), "
              f"{min(times['bare slicing']) / min(times['hpcfl Trainer']):.2f}x (best)")
    for note in notes:
        print("note: " + note)
    print(f"median (and best) of {a.repeats} repeats after a one-epoch warm-up; load average at the end "
          f"{os.getloadavg()[0]:.2f} (shared machine: compare ratios, not absolute rates)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
