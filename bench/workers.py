"""Run job tables in parallel subprocesses of a bench script (``script --worker``).

Shared by bench/gift_small.py and bench/fidelity_figures.py: each starts itself with ``--worker``,
feeds it a share of the job tables as JSON on stdin and reads back one JSON line per table.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def run_in_workers(script: str, tables: list[dict], chunks: list[list[int]]) -> list:
    """One ``script --worker`` process per non-empty chunk of table indices; each table's result.

    Parameters
    ----------
    script : path of the bench script (its ``--worker`` mode reads a JSON list of job tables on
        stdin and prints one JSON line, a list or an object, per table, in order)
    tables : the job tables
    chunks : indices into ``tables``, one list per worker (the caller decides the order)

    Returns the decoded line of every table, indexed as ``tables``. A worker that fails, or prints
    fewer result lines than it was given tables, stops the bench with its stderr's tail, after the
    other workers are killed (none is left running the rest of its share).
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = [(subprocess.Popen([sys.executable, script, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env), chunk) for chunk in chunks if chunk]
    for proc, chunk in jobs:
        proc.stdin.write(json.dumps([tables[i] for i in chunk]))
        proc.stdin.close()
    out: list = [None] * len(tables)
    for proc, chunk in jobs:
        lines = [ln for ln in proc.stdout.read().splitlines() if ln.startswith(("[", "{"))]
        err = proc.stderr.read()
        if proc.wait() != 0 or len(lines) != len(chunk):
            for other, _ in jobs:
                other.kill()
            raise SystemExit(f"a worker failed:\n{err[-3000:]}")
        for i, line in zip(chunk, lines):
            out[i] = json.loads(line)
    return out
