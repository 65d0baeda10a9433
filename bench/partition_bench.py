"""Partition benchmark: 1,000,000 samples (10 classes) over 100,000 clients.

Run from the repository root::

    python bench/partition_bench.py [--samples 1000000] [--clients 100000] [--classes 10]

Times ``iid`` and ``dirichlet`` (alpha = 0.5, NIID-Bench recipe) and the class-count
matrix, and prints the process's peak RSS (``resource.getrusage``). Targets: < 10 s and
< 1 GB each.

With 10 samples per client on average, the Dirichlet recipe's usual ``min_samples = 10``
is unreachable (thousands of clients get nothing from a skewed draw), and redrawing
until it holds would never end; the benchmark therefore uses ``min_samples = 0``, so
one draw is made and empty clients are allowed.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcfl.data import class_counts, make_partition  # noqa: E402
from hpcfl.data.partition import DirichletOptions, IidOptions  # noqa: E402


def peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--clients", type=int, default=100_000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.5)
    args = ap.parse_args()

    labels = np.random.default_rng(12345).integers(0, args.classes, size=args.samples)
    print(f"{args.samples} samples, {args.classes} classes, {args.clients} clients; "
          f"start RSS {peak_rss_mb():.0f} MB")
    runs = [
        ("iid", IidOptions()),
        ("dirichlet", DirichletOptions(alpha=args.alpha, min_samples=0)),
    ]
    for name, opts in runs:
        t0 = time.perf_counter()
        parts = make_partition(name, labels, args.clients, opts, seed=0)
        t1 = time.perf_counter()
        counts = class_counts(labels, parts, args.classes)
        t2 = time.perf_counter()
        sizes = counts.sum(axis=1)
        assert sizes.sum() == args.samples
        print(f"{name:10s} partition {t1 - t0:6.2f} s   class_counts {t2 - t1:5.2f} s   "
              f"sizes min/median/max {sizes.min()}/{int(np.median(sizes))}/{sizes.max()}   "
              f"empty {int((sizes == 0).sum())}   peak RSS {peak_rss_mb():.0f} MB")
        del parts, counts


if __name__ == "__main__":
    main()
