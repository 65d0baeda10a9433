"""hpcfl versus the bare PyTorch loop on workload W (docs/workloads.md), in one sitting.

    python bench/w_compare.py [--out runs/w_compare] [--no-float] [--timeout 900]
    python bench/w_compare.py --report-only [--out runs/w_compare]   # table again, no runs

Runs, one after another (nothing else of ours in parallel):

1. bare  1 rank x 2 threads   python bench/bare_w.py --threads 2
2. hpcfl 1 rank x 2 threads   python -m hpcfl run jobs/bench_w.toml --set runtime.threads=2
3. bare  2 ranks x 1 thread   mpiexec -n 2 python -m mpi4py bench/bare_w.py --threads 1
4. hpcfl 2 ranks x 1 thread   mpiexec -n 2 python -m mpi4py -m hpcfl run jobs/bench_w.toml --set runtime.threads=1
5. hpcfl 2 x 1, float reduce  ... --set runtime.reduce=float   (the exact reduction's cost)

with ``OMP_NUM_THREADS`` set to the thread count. Every rank is started through this
script's ``--peak-wrap`` mode, which runs the real command as a child and records the
child's peak RSS (``getrusage(RUSAGE_CHILDREN).ru_maxrss``) per rank; the exact command
lines, with and without the wrapper, are printed.

Figures (rounds 2-20 are the steady rounds; evaluation rounds 5, 10, 15, 20 included):

* steady s/round, engine clock: hpcfl's ``time_round`` metric (rank 0, cohort to end of
  evaluation; excludes the results-file write and the progress line), bare_w's same span;
* steady s/round, line to line: (arrival of the "round 20" line - "round 1" line) / 19,
  timed here; includes everything a round costs, recording included;
* start-up before round 1: launch -> arrival of the line each prints just before its loop
  ("hpcfl: ..." / "bare_w: ..."), so interpreter start, imports, MPI start, data
  generation, partition and model build are all included, the same way for both;
* whole-process wall time: launch -> exit of the launched process (mpiexec included);
* peak RSS per rank; final test accuracy; local steps (same work check).

Ratios are hpcfl / bare of steady s/round per layout, and hpcfl exact / float at 2 x 1,
from the means, the medians, and the median of per-round ratios (both runs train the
same cohort in the same round, so pairing rounds cancels most of the work's variation
and a load burst moves only the rounds it hits).
Logs and the JSON of every figure go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve()
START_RE = re.compile(r"^(hpcfl: |bare_w: )")
ROUND_RE = re.compile(r"^round\s+(\d+)/(\d+)")


def peak_wrap(prefix: str, cmd: list[str]) -> int:
    """Run ``cmd`` as a child (inheriting MPI's PMI fd) and write its peak RSS (KiB)."""
    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    rc = subprocess.call(cmd, close_fds=False)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    Path(f"{prefix}.rank{rank}").write_text(f"{peak}\n")
    return rc


def launch(name: str, cmd: list[str], threads: int, out: Path, timeout: float) -> dict:
    """Run one configuration; returns the externally measured figures."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    log_path = out / f"{name}.log"
    for old in out.glob(f"{name}.peak.rank*"):
        old.unlink()
    t_launch = time.perf_counter()
    t_start, t_round = None, {}
    with open(log_path, "w") as log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                     stderr=subprocess.STDOUT, text=True, bufsize=1) as p:
        deadline = t_launch + timeout
        for line in p.stdout:
            now = time.perf_counter()
            log.write(line)
            if t_start is None and START_RE.match(line):
                t_start = now
            m = ROUND_RE.match(line)
            if m:
                t_round[int(m.group(1))] = now
                print(f"    {name}: {line.rstrip()}", flush=True)
            if now > deadline:
                p.kill()
                raise SystemExit(f"{name} ran past --timeout {timeout} s; see {log_path}")
        rc = p.wait()
    t_end = time.perf_counter()
    if rc != 0:
        raise SystemExit(f"{name} failed (exit {rc}); see {log_path}:\n" + log_path.read_text()[-3000:])
    rounds = sorted(t_round)
    peaks = sorted(out.glob(f"{name}.peak.rank*"), key=lambda p: int(p.name.rsplit("rank", 1)[1]))
    return {
        "wall_ext_s": t_end - t_launch,
        "startup_ext_s": (t_start - t_launch) if t_start is not None else float("nan"),
        "steady_line_s": ((t_round[rounds[-1]] - t_round[rounds[0]]) / (len(rounds) - 1)
                          if len(rounds) > 1 else float("nan")),
        "peak_rss_mib": [int(p.read_text()) / 1024 for p in peaks],
        "line_times": [t_round[r] - t_launch for r in rounds],
        "log": str(log_path),
    }


def hpcfl_figures(run_dir: Path, log: str) -> dict:
    import numpy as np

    from hpcfl.results import load

    res = load(run_dir)
    m = res.metrics
    steady = slice(1, None)
    acc = np.asarray(m["test_accuracy"], dtype=float)
    text = Path(log).read_text()
    startup = re.search(r"startup ([0-9.]+) s", text)
    wall = re.search(r"wall time\s*\|\s*([0-9.]+) s", text)
    return {
        "round_times": [float(t) for t in m["time_round"]],
        "steady_s_per_round": float(np.mean(m["time_round"][steady])),
        "steady_median_s": float(np.median(m["time_round"][steady])),
        "steady_train_s": float(np.mean(m["time_train"][steady])),
        "steady_reduce_s": float(np.mean(m["time_reduce"][steady])),
        "steady_reduce_min_s": float(np.min(m["time_reduce"][steady])),
        "steady_server_s": float(np.mean(m["time_server"][steady])),
        "steady_eval_s": float(np.mean(m["time_eval"][steady])),
        "eval_total_s": float(np.sum(m["time_eval"])),   # W's 4 evaluations of 10,000 test images
        "final_test_accuracy": float(acc[~np.isnan(acc)][-1]),
        "local_steps": int(np.sum(res.clients["steps"])),
        "startup_self_s": float(startup.group(1)) if startup else float("nan"),
        "wall_self_s": float(wall.group(1)) if wall else float("nan"),
    }


def bare_figures(path: Path) -> dict:
    d = json.loads(path.read_text())
    d["round_times"] = [r["time_round"] for r in d["rounds"]]
    d["steady_server_s"] = float("nan")  # bare's update is inside "reduce"
    d["steady_reduce_min_s"] = min(r["time_reduce"] for r in d["rounds"][1:] or d["rounds"])
    d["startup_self_s"] = d["startup_s"]
    d["wall_self_s"] = d["wall_s"]
    return d


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--peak-wrap":
        sep = sys.argv.index("--")
        return peak_wrap(sys.argv[2], sys.argv[sep + 1 :])

    ap = argparse.ArgumentParser(description="hpcfl vs bare torch on workload W, one sitting")
    ap.add_argument("--out", default="runs/w_compare")
    ap.add_argument("--job", default="jobs/bench_w.toml")
    ap.add_argument("--no-float", action="store_true", help="skip the 2 x 1 run with runtime.reduce=float")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    ap.add_argument("--mpiexec", default="mpiexec")
    ap.add_argument("--rounds", type=int, default=0, help="smoke tests only: fewer rounds than W's 20")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: rebuild the table from --out (w_compare.json, logs, results)")
    a = ap.parse_args()
    out = (ROOT / a.out).resolve() if not Path(a.out).is_absolute() else Path(a.out)
    if a.report_only:
        saved = json.loads((out / "w_compare.json").read_text())
        results, loads = (saved["runs"], saved["loads"]) if "runs" in saved else (saved, [])
        for name, fig in results.items():   # re-derive the in-run figures from the files
            fig.update(hpcfl_figures(out / name, fig["log"]) if fig["kind"] == "hpcfl"
                       else bare_figures(out / f"{name}.json"))
        report(results, loads, out, len(next(iter(results.values()))["round_times"]))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable

    def hpcfl_cmd(name, threads, mpi, extra=()):
        return ([py, "-m", "mpi4py"] if mpi else [py]) + [
            "-m", "hpcfl", "run", a.job, "--out", str(out / name), "--force",
            "--set", f"runtime.threads={threads}", *extra] + (
            ["--set", f"run.rounds={a.rounds}"] if a.rounds else [])

    def bare_cmd(name, threads, mpi):
        return ([py, "-m", "mpi4py"] if mpi else [py]) + [
            "bench/bare_w.py", "--threads", str(threads), "--json", str(out / f"{name}.json")] + (
            ["--rounds", str(a.rounds)] if a.rounds else [])

    runs = [  # name, label, ranks, threads, kind, command
        ("bare_1x2", "bare 1x2", 1, 2, "bare", bare_cmd("bare_1x2", 2, False)),
        ("hpcfl_1x2", "hpcfl 1x2", 1, 2, "hpcfl", hpcfl_cmd("hpcfl_1x2", 2, False)),
        ("bare_2x1", "bare 2x1", 2, 1, "bare", bare_cmd("bare_2x1", 1, True)),
        ("hpcfl_2x1", "hpcfl 2x1", 2, 1, "hpcfl", hpcfl_cmd("hpcfl_2x1", 1, True)),
    ]
    if not a.no_float:
        runs.append(("hpcfl_2x1_float", "hpcfl 2x1 float", 2, 1, "hpcfl",
                     hpcfl_cmd("hpcfl_2x1_float", 1, True, ("--set", "runtime.reduce=float"))))

    print(f"w_compare: {len(runs)} runs in one sitting, output in {out}")
    print(f"machine: {os.cpu_count()} CPUs, load average at start {os.getloadavg()[0]:.2f} "
          f"(shared machine: absolute times are noisy, compare the ratios)")
    print("exact commands (run from the repository root; OMP_NUM_THREADS and MKL_NUM_THREADS = threads):")
    full = []
    for name, label, ranks, threads, kind, cmd in runs:
        plain = cmd
        wrapped = [py, str(HERE), "--peak-wrap", str(out / f"{name}.peak"), "--", *cmd]
        if ranks > 1:
            plain = [a.mpiexec, "-n", str(ranks), *cmd]
            wrapped = [a.mpiexec, "-n", str(ranks), *wrapped]
        print(f"  {label:<16} OMP_NUM_THREADS={threads} {shlex.join(plain)}")
        full.append((name, label, ranks, threads, kind, wrapped))
    print("  (each actually launched as: " + shlex.join(full[-1][5][:6]) + " ... -- <command>, "
          "which records every rank's peak RSS)")

    # untimed: load the interpreter, torch, mpi4py and hpcfl once so the first timed run
    # does not pay for a cold page cache alone
    subprocess.run([py, "-c", "import torch, mpi4py.MPI, hpcfl.engine.simulation, hpcfl.cli"], cwd=ROOT, check=True)

    results = {}
    loads = []
    for name, label, ranks, threads, kind, cmd in full:
        loads.append(os.getloadavg()[0])
        print(f"-- {label}: starting (load average {loads[-1]:.2f})", flush=True)
        fig = launch(name, cmd, threads, out, a.timeout)
        fig.update(hpcfl_figures(out / name, fig["log"]) if kind == "hpcfl" else bare_figures(out / f"{name}.json"))
        fig.update(label=label, ranks=ranks, threads=threads, kind=kind)
        results[name] = fig
        print(f"-- {label}: done, wall {fig['wall_ext_s']:.1f} s", flush=True)
    loads.append(os.getloadavg()[0])
    (out / "w_compare.json").write_text(json.dumps({"runs": results, "loads": loads}, indent=1, default=float))
    report(results, loads, out, a.rounds or 20)
    return 0


def report(results: dict, loads: list, out: Path, num_rounds: int) -> None:
    """Print the table and the ratios."""
    import numpy as np

    # ---- one table: a column per run
    cols = list(results)
    def f3(v):
        return f"{v:.3f}" if v == v else "-"
    def f1(v):
        return f"{v:.1f}" if v == v else "-"
    rows = [
        ("steady s/round, engine clock", lambda r: f3(r["steady_s_per_round"])),
        ("  median", lambda r: f3(r["steady_median_s"])),
        ("  train", lambda r: f3(r["steady_train_s"])),
        ("  reduce (bare: + update)", lambda r: f3(r["steady_reduce_s"])),
        ("  reduce, min over rounds", lambda r: f3(r["steady_reduce_min_s"])),
        ("  server + broadcast", lambda r: f3(r["steady_server_s"])),
        ("  eval (amortised)", lambda r: f3(r["steady_eval_s"])),
        ("evaluation in all: 4 x 10,000 images (s)", lambda r: f3(r.get("eval_total_s", float("nan")))),
        ("steady s/round, line to line", lambda r: f3(r["steady_line_s"])),
        ("start-up before round 1 (s)", lambda r: f1(r["startup_ext_s"])),
        ("  start-up, self-reported", lambda r: f1(r["startup_self_s"])),
        ("whole-process wall (s)", lambda r: f1(r["wall_ext_s"])),
        ("peak RSS per rank (MiB)", lambda r: "/".join(f"{m:.0f}" for m in r["peak_rss_mib"])),
        ("final test accuracy", lambda r: f"{r['final_test_accuracy']:.4f}"),
        ("local steps (all clients)", lambda r: str(r["local_steps"])),
    ]
    w0 = max(len(k) for k, _ in rows)
    widths = [max(len(results[c]["label"]), max(len(fn(results[c])) for _, fn in rows)) for c in cols]
    line = "-" * (w0 + sum(w + 3 for w in widths))
    print()
    print(line)
    head = f"W, rounds 2-{num_rounds} steady"
    print(f"{head:<{w0}}" + "".join(f" | {results[c]['label']:>{w}}" for c, w in zip(cols, widths)))
    print(line)
    for k, fn in rows:
        print(f"{k:<{w0}}" + "".join(f" | {fn(results[c]):>{w}}" for c, w in zip(cols, widths)))
    print(line)

    def ratio(a_, b_, key):
        return results[a_][key] / results[b_][key]

    def paired(a_, b_):
        """Median over the steady rounds of the per-round time ratio (same cohort, same work)."""
        ta, tb = np.asarray(results[a_]["round_times"]), np.asarray(results[b_]["round_times"])
        return float(np.median(ta[1:] / tb[1:]))

    pairs = [("hpcfl / bare, 1x2", "hpcfl_1x2", "bare_1x2"), ("hpcfl / bare, 2x1", "hpcfl_2x1", "bare_2x1"),
             ("bare 2x1 / bare 1x2", "bare_2x1", "bare_1x2"), ("hpcfl 2x1 / hpcfl 1x2", "hpcfl_2x1", "hpcfl_1x2")]
    if "hpcfl_2x1_float" in results:
        pairs.append(("hpcfl 2x1 exact / float", "hpcfl_2x1", "hpcfl_2x1_float"))
    print(f"{'ratios of steady s/round':<28} | {'mean':>7} | {'line':>7} | {'median':>7} | {'paired':>7}")
    print(f"{'':<28} | {'engine':>7} | {'to line':>7} | {'engine':>7} | {'median':>7}")
    for label, a_, b_ in pairs:
        print(f"{label:<28} | {ratio(a_, b_, 'steady_s_per_round'):>6.3f}x | {ratio(a_, b_, 'steady_line_s'):>6.3f}x | "
              f"{ratio(a_, b_, 'steady_median_s'):>6.3f}x | {paired(a_, b_):>6.3f}x"
              + ("   (reference: about 0.78x)" if label.startswith("bare 2x1") else ""))
    print("  (paired median: median over rounds 2-N of t_a(r) / t_b(r); both runs train the same cohort in "
          "round r, so this is the figure least moved by load bursts)")
    if "hpcfl_2x1_float" in results:
        e, fl = results["hpcfl_2x1"], results["hpcfl_2x1_float"]
        print(f"  reduce phase, exact vs float (2x1): mean {e['steady_reduce_s'] * 1e3:.1f} vs "
              f"{fl['steady_reduce_s'] * 1e3:.1f} ms, min {e['steady_reduce_min_s'] * 1e3:.1f} vs "
              f"{fl['steady_reduce_min_s'] * 1e3:.1f} ms per round (mean includes waiting for the slower rank);\n"
              f"    final accuracy {e['final_test_accuracy']:.4f} vs {fl['final_test_accuracy']:.4f}")
    print("  note: hpcfl's time_train ends after the guard agreement (an allgather when guard.policy = 'stop', the "
          "default),\n  so at 2 ranks rank 0's wait for the slower rank is counted as train, not reduce")
    print(line)
    print("load average (1 min) before each run and at the end (our own runs add 1-2): "
          + (", ".join(f"{v:.2f}" for v in loads) if loads else "not recorded"))
    print(f"measured on a shared {os.cpu_count()}-CPU machine; absolute seconds are noisy, ratios within "
          f"this sitting are the figures to quote. Figures: {out / 'w_compare.json'}")


if __name__ == "__main__":
    sys.exit(main())
