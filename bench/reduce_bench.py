"""Cost of the exact reduction versus a plain float64 Allreduce(SUM).

    mpiexec -n 2 python -m mpi4py bench/reduce_bench.py [--length 10000000] [--local 1 5] [--repeat 5]

Each rank adds ``local`` contributions (random rows of ``length`` float64, magnitudes
varying by up to 10**3 within 16 neighbouring elements and 10**12 over the row) and
reduces to rank 0, as a round does. Three accumulators:

- ``float``: :class:`hpcfl.parallel.comm.FloatSum`, a running float64 sum and one Allreduce;
- ``exact``: :class:`hpcfl.parallel.gridsum.GridSum`, the engine's exact sum (grid fixed from the
  previous round, O(L) memory);
- ``rows``: :class:`hpcfl.parallel.comm.ExactSum`, the exact sum that keeps every row until the
  grid is agreed (the engine's before version 0.11).

Times are medians over ``repeat`` rounds after one warm-up round (which also gives
GridSum its grid), measured between barriers: "add" is the per-rank cost of accepting
the rows, "reduce" the collectives and conversions. "MiB" is the accumulator's own
buffers per rank. The exact sums are checked bitwise against the same sum on one rank,
and their error is given relative to each element's largest contribution.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

from hpcfl.parallel.comm import ExactSum, FloatSum
from hpcfl.parallel.gridsum import GridSum


def fill(acc, row):
    """A contribution as the engine gives it: packed into the claimed row, then committed."""
    np.copyto(acc.claim(), row)
    acc.commit()


def buffers(acc) -> float:
    arrays = [v for v in vars(acc).values() if isinstance(v, np.ndarray)]
    arrays += list(getattr(acc, "_pool", []))
    return sum(a.nbytes for a in arrays) / 2**20


def timed(comm, fn):
    comm.Barrier()
    t = time.perf_counter()
    out = fn()
    comm.Barrier()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=10_000_000)
    ap.add_argument("--local", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"ranks {comm.size}, buffer {a.length:,} float64 ({a.length * 8 / 2**20:.0f} MiB)")
        print(f"{'mode':<6} {'local':>5} {'add s':>8} {'reduce s':>9} {'total s':>8} {'x float':>8} {'MiB':>7}")
    for local in a.local:
        rng = np.random.default_rng(comm.rank)
        scale = 10.0 ** (rng.integers(-6, 6, a.length // 16 + 1).repeat(16)[: a.length] + rng.integers(0, 3, a.length))
        rows = [rng.standard_normal(a.length) * scale for _ in range(local)]
        total = local * comm.size
        results, base = {}, None
        for mode, cls in (("float", FloatSum), ("exact", GridSum), ("rows", ExactSum)):
            adds, reds = [], []
            acc = cls(a.length)  # one accumulator reused across rounds, as the engine does
            for rep in range(a.repeat + 1):
                acc.reset(total) if cls is GridSum else acc.reset()
                t_add, _ = timed(comm, lambda: [fill(acc, r) for r in rows])
                t_red, out = timed(comm, lambda: acc.reduce(comm, total, root=0))
                if rep:
                    adds.append(t_add)
                    reds.append(t_red)
            results[mode] = out
            if comm.rank == 0:
                ad, rd = np.median(adds), np.median(reds)
                base = base or ad + rd
                print(f"{mode:<6} {local:>5} {ad:>8.3f} {rd:>9.3f} {ad + rd:>8.3f} {(ad + rd) / base:>8.2f} "
                      f"{buffers(acc):>7.0f}")
            del acc
        all_rows = comm.gather(rows, root=0)
        if comm.rank == 0:
            flat = [r for rr in all_rows for r in rr]
            big = np.max(np.abs(flat), axis=0)
            pad = np.zeros(-(-a.length // 16) * 16)
            pad[: a.length] = big
            block = pad.reshape(-1, 16).max(axis=1).repeat(16)[: a.length]
            for mode, cls in (("exact", GridSum), ("rows", ExactSum)):
                one = cls(a.length)
                for rep in range(2):     # GridSum: the second round, on the grid of the first
                    one.reset(total) if cls is GridSum else one.reset()
                    for r in flat:
                        one.add(r)
                    ref = one.reduce(MPI.COMM_SELF, total)
                err = np.abs(results[mode] - results["rows"])
                print(f"       {mode}: bitwise equal to the 1-rank sum: {ref.tobytes() == results[mode].tobytes()}; "
                      f"max difference from rows relative to the largest contribution to the element "
                      f"{np.max(err / np.where(big > 0, big, 1.0)):.1e}, to its block of 16 "
                      f"{np.max(err / np.where(block > 0, block, 1.0)):.1e}")
            print(f"       float: max |float - rows| / largest contribution: "
                  f"{np.max(np.abs(results['float'] - results['rows']) / np.where(big > 0, big, 1.0)):.1e}")


if __name__ == "__main__":
    main()
