"""Per-client evaluation's results, bit for bit, between two source trees.

Run from the repository root::

    python bench/client_eval_identity.py --tree OLD_CHECKOUT --tree . [--rounds 30]

Runs, from each tree, the quickstart job (jobs/quickstart.toml as shipped: 20 clients, Dirichlet
digits, per-client evaluation on by default, evaluated every round) and a FedGSNR job (digits,
30 clients, ``dirichlet_client`` partition, an MLP, full participation, ``steps = "gsnr"``,
evaluated every round, float64), then compares every array of ``/client_eval``, ``/metrics`` (less
the wall-clock ``time_*`` columns), ``/clients`` and ``/final/params`` of the two trees' results.h5
with ``tobytes()``: a change to how the held-out rows are drawn or summed that moves any client's
row, or the order of a client's loss sum, shows here. Exit 1 on the first difference. Not part of
the test suite (it needs two trees); tests/unit/test_client_eval.py holds the in-tree equivalences.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py

GSNR = """
[run]
name = "gsnr_identity"
seed = 3
rounds = {rounds}
eval_every = 1
[data]
dataset = "digits"
partition = "dirichlet_client"
num_clients = 30
[data.dirichlet_client]
alpha = 0.3
[model]
name = "mlp"
[model.mlp]
hidden = [32]
[algorithm]
name = "fedavg"
steps = "gsnr"
local_steps = 5
clients_per_round = 0
lr = 0.05
batch_size = 16
[runtime]
threads = 1
progress = "none"
dtype = "float64"
eval_batch_size = 100
"""


def run(tree: Path, job: Path, out: Path, rounds: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "HPCFL_CACHE_DIR": str(out.parent / "cache")}
    p = subprocess.run([sys.executable, "-m", "hpcfl", "run", str(job), "--out", str(out), "--set",
                        f"run.rounds={rounds}", "--set", "runtime.progress=none"], cwd=tree, env=env,
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")


def arrays(path: Path) -> dict:
    """Every compared array of a results.h5, by its path in the file."""
    out = {}
    with h5py.File(path, "r") as f:
        for group in ("client_eval", "metrics", "clients", "final"):
            for name, d in f[group].items():
                if isinstance(d, h5py.Dataset) and not name.startswith("time_") and name != "param_names":
                    out[f"/{group}/{name}"] = d[()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", type=Path, required=True, help="two source trees")
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    if len(args.tree) != 2:
        raise SystemExit("give two --tree")
    trees = [t.resolve() for t in args.tree]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "gsnr.toml").write_text(GSNR.format(rounds=args.rounds))
        jobs = {"quickstart": trees[0] / "jobs" / "quickstart.toml", "fedgsnr": Path(d) / "gsnr.toml"}
        bad = 0
        for name, job in jobs.items():
            res = []
            for i, tree in enumerate(trees):
                out = Path(d) / f"{name}{i}"
                run(tree, job, out, args.rounds)
                res.append(arrays(out / "results.h5"))
            a, b = res
            if a.keys() != b.keys():
                print(f"{name}: different arrays: {sorted(a.keys() ^ b.keys())}")
                bad += 1
                continue
            diff = [k for k in a if a[k].dtype != b[k].dtype or a[k].tobytes() != b[k].tobytes()]
            rows = len(a.get("/client_eval/round", ()))
            print(f"{name}: {len(a)} arrays, {rows} /client_eval rows: "
                  f"{'bitwise the same' if not diff else 'DIFFERENT: ' + ', '.join(diff)}")
            bad += bool(diff)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
