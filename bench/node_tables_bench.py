"""Per-rank private memory at 1,000,000 clients on 1, 2 and 4 ranks: per-client tables once per node.

    python bench/node_tables_bench.py [--clients 1000000] [--ranks 1 2 4] [--share both|on|off]

Logistic regression on a Gaussian mixture (2 training samples per client, 20 features), FedAvg,
per-client evaluation on (hpcfl's default), the set-up a run does: ``simulation.prepare``, then
``share_tables`` (the node's ranks move the read-only tables into shared windows). Every rank then
reads every shared table once, as ranks do over a run (each page then counts as the node's, not
its first rank's). Each rank reports its private memory (``Private_Clean + Private_Dirty`` in
``/proc/self/smaps_rollup``) and its proportional share (``Pss``), after the imports and after
set-up; the difference is what set-up costs the rank privately: the client tables, the model and
the trainers. ``--share off`` sets the size threshold above every table (the code before the
windows); both are run by default, in fresh processes. The dataset cache is emptied first, so
the first run of each rank count is a cache miss (the node's first rank generates and writes it)
and the second a hit. Not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def smaps() -> dict:
    """This process's private, proportional and resident memory now, and its peak resident memory, MB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:])
    kib = {k: int(v.split()[0]) for k, v in fields.items()}
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {"private_mb": (kib["Private_Clean"] + kib["Private_Dirty"]) / 1024, "pss_mb": kib["Pss"] / 1024,
            "rss_mb": kib["Rss"] / 1024, "peak_mb": int(status["VmHWM"].split()[0]) / 1024}


def launch(script: str, ranks: int, argv: list) -> list:
    """Run ``script --worker ARGV`` on ``ranks`` ranks (mpiexec from 2) and return the rows its rank 0
    printed (a ``@@rows`` JSON line); exit with its output if it failed."""
    cmd = [sys.executable, str(Path(script).resolve()), "--worker", *argv]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), sys.executable, "-m", "mpi4py"] + cmd[1:]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    line = [x for x in out.stdout.splitlines() if x.startswith("@@rows ")]
    if out.returncode or not line:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[0][len("@@rows "):])


def measure(table: dict, touch, **fields) -> None:
    """Every rank: the set-up a run does for job ``table`` (``prepare``, ``share_tables``), then
    ``touch(s)`` (reads what is measured; returns a dict with at least ``check``), the memory before
    and after; rank 0 prints every rank's row (``fields`` added) as the ``@@rows`` line."""
    from mpi4py import MPI

    from hpcfl import config
    from hpcfl.engine import simulation
    from hpcfl.engine.setup import release_tables, share_tables

    comm = MPI.COMM_WORLD
    cfg = config.from_dict(table)
    comm.Barrier()
    base = smaps()
    s = simulation.prepare(cfg, comm)
    share_tables(s, comm)
    seen = touch(s)
    comm.Barrier()
    after = smaps()
    row = {"rank": comm.rank, "ranks": comm.size, **fields, **seen,
           "shared_mb": (s.tables.shared_bytes / 2**20) if s.tables is not None else 0.0,
           **{f"base_{k}": v for k, v in base.items()}, **{f"after_{k}": v for k, v in after.items()}}
    rows = comm.gather(row, root=0)
    release_tables(s)
    if comm.rank == 0:
        print("@@rows " + json.dumps(rows), flush=True)


def worker(a) -> None:
    import numpy as np

    from hpcfl.parallel import shared

    if a.share == "off":
        shared.MIN_BYTES = 1 << 62
    table = {
        "run": {"name": "tables", "seed": 0, "rounds": 1, "eval_every": 0, "eval_clients": True},
        "data": {"dataset": "gaussian_mixture", "partition": "iid", "num_clients": a.clients, "cache": a.cache,
                 "gaussian_mixture": {"num_train": 2 * a.clients, "num_test": 10000}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg", "clients_per_round": 100, "lr": 0.05, "local_steps": 5},
        "runtime": {"threads": 1, "progress": "none", "vectorize": "off"},
    }

    def touch(s):
        touched = [s.client_index.numpy(), s.client_offset, s.sizes, s.owner, s.class_counts]
        if s.client_eval is not None:
            touched += [s.client_eval.sample, s.client_eval.client, s.client_eval.sizes]
        return {"check": sum(int(np.asarray(t, dtype=np.int64).sum() % 7) for t in touched)}   # every page

    measure(table, touch, share=a.share, cache=a.label)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--share", choices=("both", "on", "off"), default="both")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache", default="", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    results = []
    for share in (("off", "on") if a.share == "both" else (a.share,)):
        for ranks in a.ranks:
            with tempfile.TemporaryDirectory(prefix="hpcfl-tables-") as cache:
                for label in ("miss", "hit"):
                    results += launch(__file__, ranks, ["--clients", str(a.clients), "--share", share, "--cache",
                                                         cache, "--label", label])
    print(f"{a.clients:,} clients, logistic regression, per-client evaluation on; MB per rank "
          f"(set-up = after set-up minus after imports; max over ranks)")
    print(f"{'share':6s} {'ranks':>5s} {'cache':6s} {'private set-up':>15s} {'private total':>14s} {'PSS set-up':>11s}"
          f" {'shared/node':>12s}")
    for share in ("off", "on"):
        for ranks in a.ranks:
            for label in ("miss", "hit"):
                rows = [r for r in results if r["share"] == share and r["ranks"] == ranks and r["cache"] == label]
                if not rows:
                    continue
                setup = max(r["after_private_mb"] - r["base_private_mb"] for r in rows)
                pss = max(r["after_pss_mb"] - r["base_pss_mb"] for r in rows)
                total = max(r["after_private_mb"] for r in rows)
                print(f"{share:6s} {ranks:5d} {label:6s} {setup:15.0f} {total:14.0f} {pss:11.0f} {rows[0]['shared_mb']:12.0f}")


if __name__ == "__main__":
    main()
