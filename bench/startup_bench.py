"""Start-up of a run with ``runtime.vectorize = "auto"`` against ``"off"``, in fresh processes.

    python bench/startup_bench.py [--repeat 5] [--tree PATH]

Runs ``jobs/papers/fednova_synthetic.toml`` (logistic regression: ``"auto"`` takes the compiled
group kernel of :mod:`hpcfl.client.fused`, C where a compiler is found; ``HPCFL_NO_CC=1`` in the
environment times numba's form) for one round, as ``python -m hpcfl run`` in a new
process each time, with a fresh ``HPCFL_CACHE_DIR``: one warm-up run of each mode first (it
fills the dataset and kernel caches, as a user's first run does), then ``repeat`` runs of each
mode alternated. Prints the start-up the run reports (``startup X s``: from the process's start
to round 1), the process's wall and CPU time (user + system: much less sensitive than wall time
to other jobs on a shared machine), per mode, and auto - off.

``--tree`` runs the hpcfl found in another source tree (PYTHONPATH), e.g. an export of an older
commit, for a before/after comparison in one sitting: issue 36.3's kernel was compiled again in
every run (its numba cache never matched), which was most of the gap; then loading numba was the
rest, until the kernel's C form.
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "jobs" / "papers" / "fednova_synthetic.toml"


def once(tree: Path, cache: Path, out: Path, mode: str) -> tuple[float, float, float]:
    """(start-up reported by the run, wall seconds, CPU seconds of the process) for one run in ``mode``."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "HPCFL_NO_NUMBA")}
    env.update(PYTHONPATH=str(tree), HPCFL_CACHE_DIR=str(cache))
    t, cpu = time.perf_counter(), _children_cpu()
    p = subprocess.run([sys.executable, "-m", "hpcfl", "run", str(JOB), "--out", str(out), "--force",
                        "--set", "run.rounds=1", "--set", "runtime.progress=none", "--set", f"runtime.vectorize={mode}"],
                       env=env, cwd=out.parent, capture_output=True, text=True, check=False)   # not the repo:
    # python -m puts the working folder first on sys.path, which would shadow --tree
    wall, cpu = time.perf_counter() - t, _children_cpu() - cpu
    found = re.search(r"startup ([0-9.]+) s", p.stdout + p.stderr)
    if p.returncode != 0 or not found:
        sys.exit(f"run failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return float(found.group(1)), wall, cpu


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tree", type=Path, default=REPO, help="source tree holding the hpcfl package to time")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="startup-bench-") as tmp:
        cache, out = Path(tmp) / "cache", Path(tmp) / "run"
        for mode in ("auto", "off"):   # warm-up: the caches a first run fills
            once(a.tree, cache, out, mode)
        got = {"auto": [], "off": []}
        for _ in range(a.repeat):
            for mode in ("off", "auto"):
                got[mode].append(once(a.tree, cache, out, mode))
        print(f"start-up of a second run, {a.repeat} runs per mode, hpcfl from {a.tree.resolve()}")
        for mode, runs in got.items():
            s, w, c = ([r[i] for r in runs] for i in range(3))
            print(f"  vectorize = {mode!r:7} start-up median {statistics.median(s):5.2f} s (best {min(s):5.2f}, worst "
                  f"{max(s):5.2f}); process wall {statistics.median(w):5.2f} s, CPU {statistics.median(c):5.2f} s "
                  f"(best {min(c):5.2f})")
        for i, what in ((0, "start-up (wall)"), (2, "process CPU")):
            gap = statistics.median(r[i] for r in got["auto"]) - statistics.median(r[i] for r in got["off"])
            best = min(r[i] for r in got["auto"]) - min(r[i] for r in got["off"])
            print(f"  auto - off, {what}: {gap:+.2f} s on the medians, {best:+.2f} s on the best runs")


if __name__ == "__main__":
    main()
