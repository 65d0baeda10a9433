"""``hpcfl bench``: a named workload through the engine and through a bare torch loop, side by side.

    hpcfl bench W                         # layouts 1 x cores and cores x 1
    hpcfl bench vgg11 --layout 2x1 --rounds 3
    hpcfl bench scale --layout 1x2

For each layout (R ranks x T torch threads) it runs, one after the other in this sitting,
the engine and the bare loop (:mod:`hpcfl.bench.bare`) as separate processes (``mpiexec``
for R > 1), then prints per side: steady seconds per round (mean of rounds 2..R) split by
phase, SGD steps per second, start-up before round 1, peak memory per rank, and the ratio
hpcfl / bare of the steady seconds per round (below 1: the engine is faster). After its rounds
the engine writes one checkpoint of its state and reads it back (in a temporary folder), and
the line ``checkpoint:`` gives the state's size, the file's, and rank 0's memory and seconds for
each (docs/performance.md, "Memory"). Figures go to ``--out`` as JSON. Workloads are defined in
docs/workloads.md.

The bare loop's model has the zoo's architecture and initial weights, written with torch's own
layers (``--bare-layers torch``): where the zoo has a faster equivalent of torch layers (the
compiled ReLU + 2 x 2 max pooling and 2 x 2 max pooling of :mod:`hpcfl.models.pool`, bitwise
``nn.ReLU`` + ``nn.MaxPool2d`` and ``nn.MaxPool2d``), the bare loop uses torch's, as hand-written
code would. ``--bare-layers zoo`` gives it the zoo's layers too,
so that the ratio measures the engine alone.

With ``--interleave`` both sides run in one process per layout: after each engine round the
bare loop trains the same round, and the ratio printed is the median of the per-round ratios
over rounds 2..R (of every repeat) with their range, then the ratio of the two sides' total time
over those rounds. Round r of the two sides is the same
cohort and the same steps, seconds apart, so a machine whose speed drifts by 15% over a minute
still gives a steady ratio; start-up and peak memory are then the one process's.

With ``--repeat N`` the two sides run N times as adjacent pairs, the order alternating
(hpcfl first, then bare first, ...), and the ratio printed is the median of the N pair
ratios with their range: on a shared machine one pair can be 15% off either way, and a pair
run back to back shares most of the machine's drift. Each side's line is its median run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile


def add_parser(sub) -> None:
    from .workloads import WORKLOADS

    p = sub.add_parser("bench", help="a benchmark workload through hpcfl and a bare torch loop, as a ratio",
                       description="Run a named workload through the engine and through a bare torch loop doing "
                                   "the same SGD work, one after the other, and print both and their ratio. "
                                   "Workloads: " + "; ".join(f"{k}: {v[0]}" for k, v in WORKLOADS.items()))
    p.add_argument("workload", choices=list(WORKLOADS))
    p.add_argument("--layout", action="append", metavar="RxT",
                   help="R MPI ranks x T threads each, e.g. 2x1 (repeatable); default 1xC and Cx1 for C cores")
    p.add_argument("--rounds", type=int, help="override the workload's rounds (steady figures need 2 or more)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the workload's job for both sides, e.g. data.cache=off")
    p.add_argument("--only", choices=("hpcfl", "bare"), help="run one side only")
    p.add_argument("--bare-layers", choices=("torch", "zoo"), default="torch",
                   help="torch (default): the bare loop's model is written with torch's own layers, as code "
                        "written by hand would be (nn.ReLU + nn.MaxPool2d where hpcfl's zoo has its compiled "
                        "ReLU + 2x2 pooling; the same functions, bitwise); zoo: the zoo's model as it is, so that the ratio shows "
                        "the engine alone")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="run the two sides N times in alternating order and print the median ratio (default 1)")
    p.add_argument("--interleave", action="store_true",
                   help="run the two sides in one process per layout (and repeat), the bare loop's round r right "
                        "after the engine's, and print the median of the per-round ratios: on a machine whose "
                        "speed drifts, the steadiest comparison (start-up and peak memory are then the process's)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="both sides' device (default auto: the engine's choice, cuda:<node-local rank> where "
                        "CUDA is available); the bare loop keeps its data, model and float64 update sum there, "
                        "and both sides' phase times wait for the device")
    p.add_argument("--bare-vmap", action="store_true",
                   help="the bare loop trains each round's clients as one vmapped computation (torch.func), the "
                        "hand-written counterpart of runtime.vectorize = 'on'")
    p.add_argument("--out", help="folder for the JSON figures (default: a temporary folder, removed)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per process (default 3600)")


def _layouts(given, cores: int) -> list[tuple[int, int]]:
    from ..errors import ConfigError

    if not given:
        return [(1, cores), (cores, 1)] if cores > 1 else [(1, 1)]
    out = []
    for text in given:
        try:
            r, t = (int(v) for v in text.lower().split("x"))
            if r < 1 or t < 1:
                raise ValueError
        except ValueError:
            raise ConfigError(f"--layout {text!r}: write RANKSxTHREADS with both at least 1, e.g. 2x1") from None
        out.append((r, t))
    return out


def _command(side: str, a, ranks: int, threads: int, path: str) -> list[str]:
    args = ["--side", side, "--workload", a.workload, "--threads", str(threads), "--json", path]
    if a.rounds:
        args += ["--rounds", str(a.rounds)]
    for o in a.overrides:
        args += ["--set", o]
    if side in ("bare", "both"):
        args += ["--layers", a.bare_layers] + (["--vmap"] if a.bare_vmap else [])
    args += ["--device", a.device]
    if ranks == 1:
        return [sys.executable, "-m", "hpcfl.bench.side", *args]
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        from ..errors import ConfigError

        raise ConfigError("a layout with more than one rank needs mpiexec on PATH (pip install mpich)")
    return [mpiexec, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "hpcfl.bench.side", *args]


def summarize(fig: dict) -> dict:
    """Steady figures of one side: mean over rounds 2.. (round 1 also when it is the only one)."""
    rows = fig["rounds"][1:] or fig["rounds"]
    n = len(rows)
    phases = [k for k in ("decide", "train", "reduce", "server", "eval") if k in rows[0]]
    per_round = sum(r["round_s"] for r in rows) / n
    steps = sum(r["steps"] for r in rows)   # every rank's steps in the steady rounds (both sides record them)
    return {"s_per_round": per_round, "phases": {k: sum(r[k] for r in rows) / n for k in phases},
            "startup_s": fig["startup_s"], "peak_rss_mb": max(fig["peak_rss_mb"]), "total_steps": fig["total_steps"],
            "accuracy": fig["rounds"][-1]["accuracy"], "device": fig.get("device", "cpu"),
            "vmap": bool(fig.get("vmap") or fig.get("vectorize")), "checkpoint": fig.get("checkpoint"),
            "steps_per_s": steps / (per_round * n) if per_round > 0 else float("nan")}


def pair_ratios(hpcfl: list[dict], bare: list[dict]) -> dict:
    """Median and range of hpcfl / bare over adjacent pairs of summaries (:func:`summarize`)."""
    import statistics

    ratios = [h["s_per_round"] / b["s_per_round"] for h, b in zip(hpcfl, bare)]
    return {"ratio": statistics.median(ratios), "ratios": ratios}


def round_ratios(hpcfl: list[dict], bare: list[dict]) -> dict:
    """Median and range of hpcfl / bare over the steady rounds (2..R) of interleaved runs: round r of
    one side against round r of the other, the same cohort and steps, seconds apart; and the ratio
    of the two sides' total time over those rounds (``total_ratio``: rounds that evaluate weigh more)."""
    import statistics

    pairs = [(h["round_s"], b["round_s"]) for fh, fb in zip(hpcfl, bare)
             for h, b in zip(fh["rounds"][1:] or fh["rounds"], fb["rounds"][1:] or fb["rounds"])]
    ratios = [h / b for h, b in pairs]
    return {"ratio": statistics.median(ratios), "ratios": ratios,
            "total_ratio": sum(h for h, _ in pairs) / sum(b for _, b in pairs)}


def median_run(runs: list[dict]) -> dict:
    """The summary whose s/round is the median (the lower middle one for an even count)."""
    ordered = sorted(runs, key=lambda r: r["s_per_round"])
    return ordered[(len(ordered) - 1) // 2]


def _line(name: str, s: dict) -> str:
    ph = " ".join(f"{k} {v:.3f}" for k, v in s["phases"].items())
    return (f"  {name:<6} {s['s_per_round']:8.3f} s/round ({ph})  {s['steps_per_s']:8.1f} steps/s  "
            f"start-up {s['startup_s']:5.1f} s  peak {s['peak_rss_mb']:7.0f} MB/rank  acc {s['accuracy']:.4f}"
            f"  [{s.get('device', 'cpu')}{', vmapped' if s.get('vmap') else ''}]")


def checkpoint_line(c: dict) -> str:
    """The engine's checkpoint figures (:func:`hpcfl.bench.side.checkpoint_figures`) in one line."""
    def peak(step):
        if c.get(f"peak_{step}_mb") is None:
            return "peak unknown"
        return f"peak {c[f'peak_{step}_mb']:.0f} MB (+{c[f'peak_{step}_mb'] - c[f'rss_{step}_mb']:.0f})"

    return (f"  checkpoint: state {c['state_mb']:.1f} MB ({c['rows_mb']:.1f} MB of per-client rows), file "
            f"{c['file_mb']:.1f} MB; rank 0 from {c['rss_save_mb']:.0f} MB RSS: save {c['save_s']:.2f} s, "
            f"{peak('save')}; load {c['load_s']:.2f} s, {peak('load')}")


def main(a, comm) -> int:
    from ..errors import HpcflError

    try:
        return _main(a, comm)
    except HpcflError as err:
        print(f"hpcfl bench: {err}", file=sys.stderr)
        return 2
    except subprocess.TimeoutExpired as err:
        print(f"hpcfl bench: a process ran past --timeout {err.timeout:.0f} s and was stopped", file=sys.stderr)
        return 1


def _main(a, comm) -> int:
    from ..errors import ConfigError
    from .workloads import WORKLOADS, workload

    if comm.size > 1:
        raise ConfigError("run `hpcfl bench` without mpiexec: it starts the ranks of each layout itself")
    workload(a.workload)   # an unknown name fails here, before anything runs
    if a.repeat < 1:
        raise ConfigError(f"--repeat {a.repeat}: give at least 1")
    if a.interleave and a.only:
        raise ConfigError(f"--interleave runs both sides in one process; drop --only {a.only}, or --interleave")
    layouts = _layouts(a.layout, os.cpu_count() or 1)
    out_dir = a.out or tempfile.mkdtemp(prefix="hpcfl-bench-")
    os.makedirs(out_dir, exist_ok=True)
    sides = [a.only] if a.only else ["hpcfl", "bare"]
    print(f"hpcfl bench {a.workload}: {WORKLOADS[a.workload][0]}", flush=True)
    results = []
    try:
        for ranks, threads in layouts:
            figs = {side: [] for side in sides}
            for rep in range(a.repeat):
                order = ["both"] if a.interleave else sides if rep % 2 == 0 else sides[::-1]   # alternate who goes first
                for side in order:
                    suffix = f"_r{rep + 1}" if a.repeat > 1 else ""
                    path = os.path.join(out_dir, f"{a.workload}_{side}_{ranks}x{threads}{suffix}.json")
                    cmd = _command(side, a, ranks, threads, path)
                    print(f"  running {side} on {ranks} x {threads}: {' '.join(cmd)}", flush=True)
                    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
                    proc = subprocess.run(cmd, env=env, timeout=a.timeout, capture_output=True, text=True)
                    if proc.returncode != 0:
                        print(proc.stdout[-2000:] + proc.stderr[-4000:], file=sys.stderr)
                        print(f"hpcfl bench: the {side} process failed (exit {proc.returncode})", file=sys.stderr)
                        return 1
                    with open(path) as f:
                        fig = json.load(f)
                    for name, one in (fig.items() if side == "both" else [(side, fig)]):
                        figs[name].append(one)
            runs = {side: [summarize(f) for f in fs] for side, fs in figs.items()}
            summary = {side: median_run(r) for side, r in runs.items()}
            print(f"{ranks} rank(s) x {threads} thread(s):" + (f" (median of {a.repeat} runs each)" if a.repeat > 1 else ""))
            for side, s in summary.items():
                print(_line(side, s))
                if s.get("checkpoint"):
                    print(checkpoint_line(s["checkpoint"]))
            if a.interleave:
                print("  (interleaved in one process: start-up and peak memory are the process's, both sides')")
            if len(summary) == 2:
                summary.update(round_ratios(figs["hpcfl"], figs["bare"]) if a.interleave
                               else pair_ratios(runs["hpcfl"], runs["bare"]))
                ratio = summary["ratio"]
                extra = ", vectorised blocks" if figs["hpcfl"][0].get("vectorize") else ""
                dealt = "dealt by work" if figs["hpcfl"][0].get("dealt") else "home blocks"
                spread = (f"; median of {a.repeat} pairs, range {min(summary['ratios']):.3f}-"
                          f"{max(summary['ratios']):.3f}" if a.repeat > 1 else "")
                if a.interleave:
                    spread = (f"; median of {len(summary['ratios'])} interleaved rounds, range "
                              f"{min(summary['ratios']):.3f}-{max(summary['ratios']):.3f}; "
                              f"total time of those rounds {summary['total_ratio']:.3f}x")
                print(f"  ratio hpcfl / bare (s per round): {ratio:.3f}x  ({1 / ratio:.2f}x the bare loop's speed; "
                      f"hpcfl clients {dealt}{extra}; bare model with {a.bare_layers} layers{spread})", flush=True)
                summary["bare_layers"] = a.bare_layers
            results.append({"ranks": ranks, "threads": threads, **summary})
        with open(os.path.join(out_dir, f"{a.workload}_summary.json"), "w") as f:
            json.dump(results, f, indent=1)
        if a.out:
            print(f"figures: {out_dir}")
    finally:
        if not a.out:
            shutil.rmtree(out_dir, ignore_errors=True)
    return 0
