"""``hpcfl plan`` against measured runs: peak RSS per rank, results.h5 bytes, checkpoint size.

Run from the repository root::

    python bench/plan_check.py [--ranks 1 2 4] [--out /tmp/plan_check] [--jobs quickstart bench_w scale]

For each job, ``hpcfl plan --json`` at each rank count, then the job for 2 rounds under
``mpiexec -n R`` (each rank's peak RSS from ``getrusage(RUSAGE_CHILDREN)`` of a wrapper, as in
bench/w_compare.py), and on 1 rank for 2 and 4 rounds: results.h5 per round is the difference
over 2 rounds. The checkpoint is the 2-round run's newest (its file, or its manifest and shards). Prints a
markdown table (plan / measured, and whether within 25 %). Not a test: figures depend on the
machine and on the dataset cache (run once before, so every run reads the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCALE = ROOT / "bench" / "plan_scale.toml"
JOBS = {"quickstart": (ROOT / "jobs" / "quickstart.toml", []),
        "bench_w": (ROOT / "jobs" / "bench_w.toml", ["runtime.threads=1"]),
        "scale": (SCALE, [])}


def peak_wrap(prefix: str, cmd: list[str]) -> int:
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    rc = subprocess.call(cmd, close_fds=False)
    Path(f"{prefix}.rank{rank}").write_text(f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\n")
    return rc


def sets(extra: list[str]) -> list[str]:
    return [a for s in extra for a in ("--set", s)]


def run(job: Path, extra: list[str], ranks: int, rounds: int, out: Path) -> dict:
    prefix = str(out) + ".peak"
    for old in Path(out).parent.glob(Path(prefix).name + ".rank*"):
        old.unlink()
    cmd = [sys.executable, "-m", "mpi4py", "-m", "hpcfl", "run", str(job), "--out", str(out), "--force",
           "--set", f"run.rounds={rounds}", "--set", "runtime.progress=none", *sets(extra)]
    wrap = [sys.executable, str(Path(__file__).resolve()), "--peak-wrap", prefix, "--", *cmd]
    done = subprocess.run(["timeout", "-s", "KILL", "300", "mpiexec", "-n", str(ranks), *wrap], check=False,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    peaks = [int(p.read_text()) * 1024 for p in Path(out).parent.glob(Path(prefix).name + ".rank*")]
    # the newest checkpoint: its file, or its manifest and every rank's shard (ckpt-<round>.*)
    ckpts = sorted((Path(out) / "checkpoints").glob("ckpt-*.h5"))
    newest = ckpts[-1].name.split(".")[0] if ckpts else None
    return {"peak": max(peaks), "results": (Path(out) / "results.h5").stat().st_size,
            "ckpt": sum(f.stat().st_size for f in ckpts if f.name.split(".")[0] == newest)}


def plan(job: Path, extra: list[str], ranks: int, rounds: int) -> dict:
    p = subprocess.run([sys.executable, "-m", "hpcfl", "plan", str(job), "--ranks", str(ranks), "--json",
                        "--set", f"run.rounds={rounds}", *sets(extra)], check=True, capture_output=True, text=True)
    return json.loads(p.stdout)   # the terms: hpcfl plan JOB --ranks R --json


def ok(plan_v: float, meas: float) -> str:
    return f"{plan_v / meas:.2f}" + ("" if abs(plan_v / meas - 1) <= 0.25 else " (off)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS))
    ap.add_argument("--out", default="/tmp/plan_check")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    print("| job | ranks | peak RSS/rank plan / measured MB (ratio) | results.h5 KB/round plan / measured "
          "| results.h5 4 rounds KB plan / measured | checkpoint MB plan / measured |")
    print("|---|---|---|---|---|---|")
    for name in a.jobs:
        job, extra = JOBS[name]
        r2 = run(job, extra, 1, 2, out / f"{name}_r2")
        r4 = run(job, extra, 1, 4, out / f"{name}_r4")
        p4 = plan(job, extra, 1, 4)
        growth = (r4["results"] - r2["results"]) / 2
        for ranks in a.ranks:
            m = r2 if ranks == 1 else run(job, extra, ranks, 2, out / f"{name}_n{ranks}")
            p = plan(job, extra, ranks, 2)
            (out / f"{name}_plan{ranks}.json").write_text(json.dumps(p, indent=1))
            print(f"| {name} | {ranks} | {p['rank_bytes'] / 1e6:.0f} / {m['peak'] / 1e6:.0f} "
                  f"({ok(p['rank_bytes'], m['peak'])}) | {p['results_round_bytes'] / 1e3:.1f} / {growth / 1e3:.1f} "
                  f"| {p4['results_total_bytes'] / 1e3:.0f} / {r4['results'] / 1e3:.0f} "
                  f"({ok(p4['results_total_bytes'], r4['results'])}) | {p['checkpoint_bytes'] / 1e6:.2f} / "
                  f"{m['ckpt'] / 1e6:.2f} ({ok(p['checkpoint_bytes'], max(m['ckpt'], 1))}) |", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--peak-wrap":
        sys.exit(peak_wrap(sys.argv[2], sys.argv[4:]))
    main()
