"""Where a round's time goes: torch.profiler over the engine's rounds of a ``hpcfl bench`` workload.

    python bench/profile_round.py [--workload vgg11] [--rounds 3] [--set KEY=VALUE ...]

Runs the workload through ``simulation.prepare`` and ``run`` on this machine's device and
profiles the last round (CPU and, where there is one, CUDA activity); prints the operations
by total CPU time and by device time, and the round's phase times.
"""

import argparse

from torch.profiler import ProfilerActivity, profile

from hpcfl import config
from hpcfl.engine import simulation
from hpcfl.bench.workloads import workload
from hpcfl.parallel.comm import world
from hpcfl.config import apply_overrides


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="vgg11")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--rows", type=int, default=25)
    a = ap.parse_args()
    job = apply_overrides(workload(a.workload, a.rounds), a.overrides)
    s = simulation.prepare(config.from_dict(job), world())
    cuda = s.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities)
    phases = []

    def on_round(m, clients):
        phases.append({k: round(v, 4) for k, v in m.items() if k.startswith("time_")})
        if len(phases) == a.rounds - 1:
            prof.start()            # the last round only: the first ones warm up (and compile)

    simulation.run(s, on_round=on_round)
    prof.stop()
    print(f"device {s.device}; phases of the profiled round: {phases[-1]}")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=a.rows))
    if cuda:
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=a.rows))


if __name__ == "__main__":
    main()
