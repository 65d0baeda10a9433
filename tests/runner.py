"""Shared test helpers: small jobs and an in-memory run (no files)."""

import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from hpcfl import config
from hpcfl.engine import simulation

SMALL = {
    "run": {"name": "t", "seed": 3, "rounds": 3, "eval_every": 1},
    "data": {"dataset": "digits", "partition": "dirichlet", "num_clients": 7, "dirichlet": {"alpha": 0.5}},
    "model": {"name": "mlp", "mlp": {"hidden": [16]}},
    "algorithm": {"name": "fedavg", "clients_per_round": 5, "lr": 0.1, "batch_size": 16, "local_steps": 4},
    "runtime": {"threads": 1, "progress": "none"},
}

# hpcfl plan's tests (unit and e2e): 7 clients of 10 samples, 3 classes of 4 features, logreg with
# P = 4 * 3 + 3 = 15 parameters.
PLAN_TINY = """
[run]
name = "tiny"
seed = 0
rounds = 4
eval_every = 2
[data]
dataset = "gaussian_mixture"
partition = "iid"
num_clients = 7
[data.gaussian_mixture]
num_train = 70
num_test = 60
num_classes = 3
dim = 4
[model]
name = "logreg"
[algorithm]
name = "scaffold"
clients_per_round = 3
lr = 0.05
batch_size = 5
local_steps = 1
[runtime]
threads = 1
progress = "none"
"""


def job(**overrides):
    """SMALL with dotted-key overrides, e.g. job(**{"algorithm.name": "fedprox"})."""
    d = json.loads(json.dumps(SMALL))
    return config.apply_overrides(d, [f"{k}={json.dumps(v)}" for k, v in overrides.items()])


def run_memory(table, comm):
    """Run a job on ``comm``; returns (final model, metrics rows, client rows) on rank 0."""
    from hpcfl.engine.setup import release_tables, share_tables

    cfg = config.from_dict(table)
    setup = simulation.prepare(cfg, comm)
    share_tables(setup, comm)   # as a run does: the node's ranks read one copy of the read-only tables
    metrics, clients = [], []

    def on_round(m, c):
        metrics.append({k: v for k, v in m.items() if not k.startswith("time_")})
        clients.append(c)

    x = simulation.run(setup, on_round=on_round)
    release_tables(setup)
    return np.asarray(x), metrics, clients


RESULT = "@@run_parallel "   # marks a worker's result line on its stdout


def run_parallel(tables, workers=2):
    """Run in-memory jobs in ``workers`` subprocesses (the machine's two cores).

    Returns, per table in order, (final model, metrics rows). Each worker is this file run as
    a script: job tables in as JSON on stdin, one JSON line per run out. Floats survive the
    trip exactly (JSON writes the shortest repr that reads back to the same double).
    """
    import subprocess
    import sys

    chunks = [list(range(i, len(tables), workers)) for i in range(workers)]
    procs = [subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for c in chunks if c]
    for proc, chunk in zip(procs, chunks):
        proc.stdin.write(json.dumps([tables[i] for i in chunk]))
        proc.stdin.close()
    out = [None] * len(tables)
    for proc, chunk in zip(procs, chunks):
        # the runs' own notices (hpcfl: ...) share stdout: only the marked lines are results
        lines = [ln[len(RESULT):] for ln in proc.stdout.read().splitlines() if ln.startswith(RESULT)]
        err = proc.stderr.read()
        assert proc.wait() == 0, err[-3000:]
        assert len(lines) == len(chunk), err[-3000:]
        for i, line in zip(chunk, lines):
            got = json.loads(line)
            out[i] = (np.array(got["x"]), got["metrics"])
    return out


if __name__ == "__main__":   # a run_parallel worker
    import sys

    from mpi4py import MPI

    for table in json.loads(sys.stdin.read()):
        x, metrics, _ = run_memory(table, MPI.COMM_SELF)
        rows = [{k: (float(v) if isinstance(v, (int, float, np.floating, np.integer)) else None)
                 for k, v in m.items()} for m in metrics]
        print(RESULT + json.dumps({"x": x.tolist(), "metrics": rows}), flush=True)


@contextlib.contextmanager
def rank0_folder(comm, prefix: str):
    """A temporary folder that rank 0 makes and every rank of ``comm`` gets; rank 0 removes it once
    every rank is done with it."""
    path = Path(comm.bcast(tempfile.mkdtemp(prefix=prefix) if comm.rank == 0 else None, root=0))
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)
