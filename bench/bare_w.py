"""Workload W (docs/workloads.md) as a bare PyTorch loop: the reference for hpcfl's speed.

    OMP_NUM_THREADS=2 python bench/bare_w.py --threads 2
    OMP_NUM_THREADS=1 mpiexec -n 2 python -m mpi4py bench/bare_w.py --threads 1

The same SGD work as ``jobs/bench_w.toml``, written the way one would without hpcfl:

* data: W's recipe, one ``numpy.random.default_rng(0)`` (the noise is drawn in
  chunks to bound memory; numpy's stream makes that identical to one draw, and
  ``--check-data`` verifies W's SHA-256 prefixes);
* partition: hpcfl's ``dirichlet`` function (NIID-Bench ``noniid-labeldir``, alpha 0.5,
  min 10 samples, seed 0), so the client sizes are exactly hpcfl's;
* cohort: 10 of 100 clients uniformly without replacement, drawn with the same seeded
  numpy generator as hpcfl's ``sample_cohort`` (so both do the same clients each round);
* local training: the global weights copied into a local LeNet-5, a fresh
  ``torch.optim.SGD(lr=0.01)``, one epoch over the client's samples in batches of 32
  from a shuffled permutation (last batch partial), batches gathered from the training
  tensor by index;
* aggregation: deltas weighted by sample counts; under MPI clients are split over ranks
  in contiguous blocks (hpcfl's default placement) and each round does one
  ``Allreduce`` of the flat [sum n_i delta_i | sum n_i] vector (float64);
* evaluation: every 5 rounds and after the last, 1000-sample test chunks split over
  ranks, correct counts summed with a small Allreduce.

Prints one line per round, then W's figures: steady seconds per round
(mean over rounds 2-20, evaluation rounds included, rank 0's clock), whole-process wall
time, start-up before round 1 (both from the process start as the kernel records it),
peak RSS per rank (``resource.getrusage``) and the final test accuracy. ``--json PATH``
also writes them (rank 0) for bench/w_compare.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import sys
import time

import numpy as np

T_IMPORT = time.time()


def process_start_time() -> float:
    """Epoch seconds at which this process started (Linux /proc; else script import time)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        boot = time.time() - uptime
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return T_IMPORT


T_START = process_start_time()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

W_SHA16 = {"x_train": "53d6ed9e42f85434", "y_train": "11602baa5d0064e3",
           "x_test": "6e86d4c2ca9deee5", "y_test": "b9b305371fdc2d21"}
CHUNK = 4096


def make_data(seed: int = 0):
    """W's arrays; noise drawn in chunks (same stream as one draw, less memory)."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((10, 3, 32, 32), dtype=np.float32)

    def split(n):
        y = rng.integers(0, 10, size=n)
        x = means[y]
        x *= np.float32(1.5)
        for lo in range(0, n, CHUNK):
            hi = min(n, lo + CHUNK)
            x[lo:hi] += rng.standard_normal((hi - lo, 3, 32, 32), dtype=np.float32)
        return x, y.astype(np.int64)

    x_train, y_train = split(50000)
    x_test, y_test = split(10000)
    return x_train, y_train, x_test, y_test


def sha16(a: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(a)).cast("B")).hexdigest()[:16]


def lenet5() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(400, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(),
        nn.Linear(84, 10),
    )


def cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> np.ndarray:
    """Same draw as hpcfl.engine.simulation.sample_cohort (SeedSequence [seed, COHORT=1, rnd, 0])."""
    gen = np.random.default_rng(np.random.SeedSequence([seed, 1, rnd % 2**32, 0]))
    return np.sort(gen.choice(num_clients, size=per_round, replace=False))


def get_comm():
    """COMM_WORLD when started under mpiexec, else None (a plain single process)."""
    if not any(k in os.environ for k in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")):
        return None
    from mpi4py import MPI
    return MPI.COMM_WORLD


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="torch threads per process (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check-data", action="store_true", help="verify workload W's SHA-256 prefixes (about 1 s)")
    ap.add_argument("--json", help="write the figures here (rank 0)")
    a = ap.parse_args(argv)

    comm = get_comm()
    rank, size = (comm.rank, comm.size) if comm is not None else (0, 1)
    if a.threads:
        torch.set_num_threads(a.threads)
    say = (lambda *s: print(*s, flush=True)) if rank == 0 else (lambda *s: None)

    # ---- set-up: data, partition, placement, model
    x_np, y_np, xt_np, yt_np = make_data(a.seed)
    if a.check_data:
        got = {"x_train": sha16(x_np), "y_train": sha16(y_np), "x_test": sha16(xt_np), "y_test": sha16(yt_np)}
        bad = {k: v for k, v in got.items() if v != W_SHA16[k]}
        if bad:
            raise SystemExit(f"data differ from workload W: {bad}")
        say("data: SHA-256 prefixes match workload W")
    from hpcfl.data.partition import DirichletOptions, dirichlet
    parts = dirichlet(y_np, a.clients, DirichletOptions(alpha=0.5, min_samples=10), a.seed)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    owner = np.repeat(np.arange(size), [len(b) for b in np.array_split(np.arange(a.clients), size)])
    part_t = [torch.from_numpy(p) for p in parts]
    x_train, y_train = torch.from_numpy(x_np), torch.from_numpy(y_np)
    x_test, y_test = torch.from_numpy(xt_np), torch.from_numpy(yt_np)

    torch.manual_seed(a.seed)
    global_model = lenet5()
    local_model = lenet5()
    gparams = list(global_model.parameters())
    lparams = list(local_model.parameters())
    gflat = nn.utils.parameters_to_vector(gparams).detach()
    L = gflat.numel()
    acc = np.zeros(L + 1, dtype=np.float64)  # [sum n_i delta_i | sum n_i]
    test_chunks = [(lo, min(lo + 1000, len(yt_np))) for lo in range(0, len(yt_np), 1000)][rank::size]

    def evaluate() -> float:
        global_model.eval()
        correct = np.zeros(1)
        with torch.no_grad():
            for lo, hi in test_chunks:
                correct[0] += float((global_model(x_test[lo:hi]).argmax(1) == y_test[lo:hi]).sum())
        if comm is not None and size > 1:
            from mpi4py import MPI
            comm.Allreduce(MPI.IN_PLACE, correct, op=MPI.SUM)
        return correct[0] / len(yt_np)

    if comm is not None:
        comm.Barrier()
    t_loop = time.time()
    say(f"bare_w: {size} process(es) x {torch.get_num_threads()} thread(s), {a.clients} clients, "
        f"{L} parameters; startup {t_loop - T_START:.1f} s")

    rows, test_acc, samples_done, steps_done = [], float("nan"), 0, 0
    for rnd in range(a.rounds):
        t0 = time.perf_counter()
        acc.fill(0.0)
        for cid in cohort(a.seed, rnd, a.clients, a.per_round):
            if owner[cid] != rank:
                continue
            with torch.no_grad():
                for p, g in zip(lparams, gparams):
                    p.copy_(g)
            local_model.train()
            opt = torch.optim.SGD(lparams, lr=a.lr)
            idx = part_t[cid]
            n = idx.numel()
            gen = torch.Generator().manual_seed(a.seed * 1_000_003 + rnd * 1009 + int(cid))
            perm = idx[torch.randperm(n, generator=gen)]
            for lo in range(0, n, a.batch):
                b = perm[lo : lo + a.batch]
                loss = F.cross_entropy(local_model(x_train[b]), y_train[b])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                steps_done += 1
            samples_done += n
            with torch.no_grad():
                delta = nn.utils.parameters_to_vector(lparams) - gflat
            acc[:L] += sizes[cid] * delta.double().numpy()
            acc[L] += sizes[cid]
        t1 = time.perf_counter()
        if comm is not None and size > 1:
            from mpi4py import MPI
            comm.Allreduce(MPI.IN_PLACE, acc, op=MPI.SUM)
        gflat = (gflat.double() + torch.from_numpy(acc[:L] / acc[L])).float()
        nn.utils.vector_to_parameters(gflat, gparams)
        t2 = time.perf_counter()
        evaluated = rnd == a.rounds - 1 or (a.eval_every and (rnd + 1) % a.eval_every == 0)
        if evaluated:
            test_acc = evaluate()
        t3 = time.perf_counter()
        rows.append({"round": rnd, "time_train": t1 - t0, "time_reduce": t2 - t1, "time_eval": t3 - t2,
                     "time_round": t3 - t0, "test_accuracy": test_acc if evaluated else float("nan")})
        acc_s = f"{test_acc:.4f}" if evaluated else "  -   "
        say(f"round {rnd + 1:>2}/{a.rounds}  test_acc {acc_s}  {t3 - t0:.2f} s")

    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    totals = np.array([samples_done, steps_done], dtype=np.int64)
    if comm is not None and size > 1:
        from mpi4py import MPI
        comm.Allreduce(MPI.IN_PLACE, totals, op=MPI.SUM)
        peaks = comm.gather(peak_kb, root=0)
    else:
        peaks = [peak_kb]
    wall = time.time() - T_START
    if rank != 0:
        return 0

    steady = rows[1:] if len(rows) > 1 else rows
    fig = {
        "runner": "bare", "ranks": size, "threads": torch.get_num_threads(),
        "steady_s_per_round": float(np.mean([r["time_round"] for r in steady])),
        "steady_median_s": float(np.median([r["time_round"] for r in steady])),
        "steady_train_s": float(np.mean([r["time_train"] for r in steady])),
        "steady_reduce_s": float(np.mean([r["time_reduce"] for r in steady])),
        "steady_eval_s": float(np.mean([r["time_eval"] for r in steady])),
        "eval_total_s": float(sum(r["time_eval"] for r in rows)),
        "wall_s": wall, "startup_s": t_loop - T_START,
        "peak_rss_mib": [p / 1024 for p in peaks],
        "final_test_accuracy": test_acc,
        "samples_trained": int(totals[0]), "local_steps": int(totals[1]),
        "rounds": rows,
    }
    say("-" * 64)
    say(f"steady s/round (rounds 2-{a.rounds}) | {fig['steady_s_per_round']:.3f} (median "
        f"{fig['steady_median_s']:.3f}; train {fig['steady_train_s']:.3f}, reduce+update "
        f"{fig['steady_reduce_s']:.3f}, eval {fig['steady_eval_s']:.3f})")
    say(f"whole-process wall time     | {wall:.1f} s")
    say(f"start-up before round 1     | {fig['startup_s']:.1f} s")
    peaks_s = ", ".join(f"rank {i}: {m:.0f} MiB" for i, m in enumerate(fig["peak_rss_mib"]))
    say(f"peak RSS per rank           | {peaks_s}")
    say(f"final test accuracy         | {test_acc:.4f}")
    say(f"work                        | {fig['samples_trained']} samples, {fig['local_steps']} local steps")
    say("-" * 64)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
