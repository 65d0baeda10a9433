"""Every preset runs on the quickstart job as given, with the defaults of its paper or its
documented rule (docs/algorithms/README.md, "Presets"): ``--set algorithm.name=X`` and nothing else."""

import math

import numpy as np
import pytest
from clirun import ROOT

from hpcfl import config
from hpcfl.engine import simulation
from hpcfl.algorithms import registry
from hpcfl.parallel.comm import world

QUICKSTART = ROOT / "jobs" / "quickstart.toml"


def run(name: str, rounds: int):
    cfg = config.load(QUICKSTART, [f"algorithm.name={name}", f"run.rounds={rounds}", "runtime.progress=none"])
    setup = simulation.prepare(cfg, world())
    metrics, clients = [], []
    simulation.run(setup, on_round=lambda m, c: (metrics.append(m), clients.append(c)))
    return cfg, setup, metrics, clients


@pytest.mark.parametrize("name", [p for p in registry.PRESETS if p != "afl"])
def test_preset_runs_on_the_quickstart_job(name):
    """Three rounds: finite losses, and well above chance (0.1) on the 10 digits."""
    cfg, setup, metrics, clients = run(name, 3)
    assert [m["round"] for m in metrics] == [1, 2, 3]
    assert all(math.isfinite(m["train_loss"]) for m in metrics)
    assert metrics[-1]["test_accuracy"] > 0.3, (name, metrics[-1]["test_accuracy"])
    epochs_worth = registry.epochs_worth(2, 16, "ceil", setup.sizes)   # the job: local_epochs 2, batch 16
    if name == "fedprox":
        assert cfg.algorithm.mu == 0.01
    if name in ("gift", "adacomm"):        # tau0: two epochs' steps, averaged over the 20 clients
        assert [m["tau_used"] for m in metrics] == [epochs_worth] * 3
        assert setup.algo.notes and f"tau0 = {epochs_worth} local steps" in setup.algo.notes[0]
    if name == "fedgsnr":                  # E_const: each round's cohort of 10 shares 10 x E_const steps
        assert [int(np.sum(c["steps"])) for c in clients] == [10 * epochs_worth] * 3


def test_afl_decides_its_tau_on_the_quickstart_job_without_a_clock():
    """Ten trial rounds at tau0, then tau* from the bound with time counted in local
    iterations (c = 1, b = tau0, the documented default without [system])."""
    cfg, setup, metrics, _ = run("afl", 11)
    tau0 = registry.epochs_worth(2, 16, "ceil", setup.sizes)
    assert [m["tau_used"] for m in metrics[:10]] == [tau0] * 10
    assert 1 <= metrics[10]["tau_used"] <= 100 and metrics[9]["tau_next"] == metrics[10]["tau_used"]
    assert any("c = 1 per iteration, b = tau0" in n for n in setup.algo.notes)


def test_epochs_worth_is_the_mean_of_what_epochs_would_give():
    """Sizes 10, 33, 64 at B = 16, E = 2: ceil gives 2, 6, 8 steps (mean 5.33 -> 5); floor
    gives floor(20/16) = 1, floor(66/16) = 4, floor(128/16) = 8 (mean 4.33 -> 4)."""
    sizes = np.array([10, 33, 64])
    assert registry.epochs_worth(2, 16, "ceil", sizes) == 5
    assert registry.epochs_worth(2, 16, "floor", sizes) == 4
    assert registry.epochs_worth(1, 64, "ceil", np.array([3, 3])) == 1
