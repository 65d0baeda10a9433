"""Start-up and per-round cost at 1,000,000 clients on one rank, before and after.

Run from the repository root::

    python bench/million_clients_bench.py [--tree OLD_CHECKOUT] [--tree .] [--clients 1000000] [--rounds 30]
                                          [--eval-clients on|off]

Logistic regression on a Gaussian mixture (2 training samples per client, 20 features), FedAvg
with 100 clients per round, 5 local steps, ``runtime.vectorize = "off"`` (the compiled group
kernel's compile time is another matter, docs/performance.md). Each source tree (``--tree``,
default: this one) runs the job twice with a fresh dataset cache: a miss (the data generated and
cached) then a hit (mapped). Prints per run the start-up ``hpcfl run`` reports (everything before
round 1: imports, data, partition, class counts, held-out rows, model), and the steady seconds per
round with its decide phase, from the run's closing summary; then the CPU seconds of the imports
and of ``simulation.prepare`` on a cache miss and a cache hit, each in a fresh process, which a
loaded machine inflates much less than wall time. Per-client evaluation (``run.eval_clients``)
is on, as hpcfl's default; ``--eval-clients off`` times the job without it. Not a test: the
figures depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

JOB = """
[run]
name = "million"
seed = 0
rounds = {rounds}
eval_every = 0
eval_clients = {eval_clients}
[data]
dataset = "gaussian_mixture"
partition = "iid"
num_clients = {clients}
[data.gaussian_mixture]
num_train = {samples}
num_test = 10000
[model]
name = "logreg"
[algorithm]
name = "fedavg"
clients_per_round = 100
lr = 0.05
batch_size = 10
local_steps = 5
[runtime]
threads = 1
progress = "none"
vectorize = "off"
[checkpoint]
every = 0
"""


def run(tree: Path, job: Path, out: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "HPCFL_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-m", "hpcfl", "run", str(job), "--out", str(out)], cwd=tree, env=env,
                       capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    startup = float(re.search(r"startup ([0-9.]+) s", p.stdout).group(1))
    m = re.search(r"seconds per round\s*\|\s*([0-9.]+) \(decide ([0-9.]+)", p.stdout)
    return {"startup": startup, "round_ms": float(m.group(1)) * 1e3, "decide_ms": float(m.group(2)) * 1e3}


CPU = """
import sys, time
t0 = time.process_time()
from mpi4py import MPI
from hpcfl import config
from hpcfl.engine import simulation
t1 = time.process_time()
cfg = config.load(sys.argv[1], [])
s = simulation.prepare(cfg, MPI.COMM_SELF)
t2 = time.process_time()
print(f"@@ {t1 - t0:.2f} {t2 - t1:.2f}")
"""


def cpu(tree: Path, job: Path, cache: Path) -> tuple[float, float]:
    """CPU seconds of (imports, ``simulation.prepare``) in a fresh process: what start-up costs on
    an idle core, much less sensitive to a loaded machine than wall time."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HPCFL_CACHE_DIR": str(cache)}
    p = subprocess.run([sys.executable, "-c", CPU, str(job)], cwd=tree, env=env, capture_output=True, text=True,
                       check=False)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    imports, prepare = re.search(r"@@ ([0-9.]+) ([0-9.]+)", p.stdout).groups()
    return float(imports), float(prepare)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", type=Path, help="a source tree to time (repeatable)")
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--eval-clients", choices=("on", "off"), default="on",
                    help="run.eval_clients (default on, as hpcfl's own default)")
    args = ap.parse_args()
    trees = [t.resolve() for t in (args.tree or [Path(__file__).resolve().parents[1]])]
    print(f"{args.clients:,} clients, logreg, 100 per round, 1 rank, vectorize off, {args.rounds} rounds, "
          f"eval_clients {args.eval_clients}; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as d:
        job = Path(d) / "job.toml"
        job.write_text(JOB.format(rounds=args.rounds, clients=args.clients, samples=2 * args.clients,
                                  eval_clients=str(args.eval_clients == "on").lower()))
        for i, tree in enumerate(trees):
            cache = Path(d) / f"cache{i}"
            for what in ("cache miss", "cache hit"):
                r = run(tree, job, Path(d) / f"out{i}-{what[-4:].strip()}", cache)
                print(f"  {tree!s:<24} {what:<10} start-up {r['startup']:5.1f} s, {r['round_ms']:6.1f} ms/round "
                      f"(decide {r['decide_ms']:.2f} ms)")
            for what, where in (("miss", Path(d) / f"cpu-cache{i}"), ("hit", cache)):   # a fresh cache, then warm
                imports, prepare = cpu(tree, job, where)
                print(f"  {tree!s:<24} {'CPU time':<10} imports {imports:.2f} s + prepare (cache {what}) "
                      f"{prepare:.2f} s = start-up {imports + prepare:.2f} s of one core")


if __name__ == "__main__":
    main()
