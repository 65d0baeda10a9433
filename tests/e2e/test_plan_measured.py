"""``hpcfl plan`` against real runs: results.h5's growth per round and a run's peak RSS, within 25 %."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from runner import PLAN_TINY as TINY

from hpcfl import api, config
from hpcfl.engine import plan
from hpcfl.io.schema import CLIENT_FIELDS

ROOT = Path(__file__).resolve().parents[2]


def _growth(tmp_path, over):
    """results.h5's size after 2 and 4 rounds of TINY with ``over``: (growth per round, size after 4)."""
    size = {}
    for rounds in (2, 4):
        api.run(TINY, out=tmp_path / str(rounds), overrides=over + [f"run.rounds={rounds}"], force=True)
        size[rounds] = (tmp_path / str(rounds) / "results.h5").stat().st_size
    return (size[4] - size[2]) / 2, size[4]


@pytest.mark.parametrize("cohort", [1000, 3000])
def test_results_file_growth_per_round_matches_a_run(tmp_path, cohort):
    """3000 clients, 1000 or all 3000 trained each round: the plan's bytes per round against the file's
    growth from 2 to 4 rounds. 1000 rows a round (under io.schema.COMPRESS_FROM) are stored as they
    are: within 25 %; 3000 are compressed, and the plan's figures are then an upper bound."""
    sets = {"data.num_clients": 3000, "data.gaussian_mixture.num_train": 6000, "algorithm.clients_per_round": cohort,
            "run.eval_every": 0, "run.eval_clients": "false", "algorithm.name": "fedavg"}
    over = [f"{k}={v}" for k, v in sets.items()]
    growth, size = _growth(tmp_path, over)
    p = plan.estimate(config.load(TINY, over + ["run.rounds=4"]), ranks=1, base=0)
    assert p.results_compressed == (cohort == 3000)
    if cohort == 1000:
        assert p.results_round_bytes == pytest.approx(growth, rel=0.25)
        assert p.results_total_bytes == pytest.approx(size, rel=0.25)
    else:
        assert growth < p.results_round_bytes and size < p.results_total_bytes
    with h5py.File(tmp_path / "4" / "results.h5") as f:   # what the plan counts is what the file holds
        assert f["clients/round"].shape == (4 * cohort,)
        assert set(CLIENT_FIELDS) <= set(f["clients"])


def _peak_of(cmd: list[str]) -> int:
    """Peak RSS (bytes) of ``cmd``, from a fresh parent's RUSAGE_CHILDREN (ours keeps every child's maximum)."""
    wrap = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, capture_output=True); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    return int(subprocess.run([sys.executable, "-c", wrap, *cmd], check=True, capture_output=True, text=True,
                              cwd=ROOT).stdout) * 1024


def test_memory_within_25_percent_of_a_runs_peak(tmp_path):
    """50,000 clients with SCAFFOLD's rows of P = 603 floats (121 MB), then the same job with FedAvg:
    each peak within 25 % of the plan, and so is the difference (the rows and the checkpoint block)."""
    job = tmp_path / "big.toml"
    job.write_text(TINY.replace("num_clients = 7", "num_clients = 50000").replace("num_train = 70", "num_train = 100000")
                   .replace("dim = 4", "dim = 200"))
    hpcfl = [sys.executable, "-m", "hpcfl"]
    planned, peak = {}, {}
    for name in ("fedavg", "scaffold"):
        sets = ["--set", f"algorithm.name={name}", "--set", "run.rounds=2"]
        out = subprocess.run(hpcfl + ["plan", str(job), "--json", *sets], check=True, capture_output=True, text=True,
                             cwd=ROOT).stdout
        planned[name] = json.loads(out)["rank_bytes"]
        peak[name] = _peak_of(hpcfl + ["run", str(job), "--out", str(tmp_path / name), *sets])
        assert planned[name] == pytest.approx(peak[name], rel=0.25)
    assert planned["scaffold"] - planned["fedavg"] == pytest.approx(peak["scaffold"] - peak["fedavg"], rel=0.25)


