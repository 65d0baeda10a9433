"""``hpcfl report`` and the run grouping it shares with ``hpcfl plot`` (hpcfl/analysis/runs.py).

Every expected number below is worked out by hand from the curves written by :func:`write_run`.
"""

import csv
import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcfl import cli
from hpcfl.analysis import runs
from hpcfl.analysis.report import report_text
from hpcfl.errors import HpcflError
from hpcfl.io.results import FinalModel, CLIENT_FIELDS, METRICS, ResultsWriter, load

MODEL = FinalModel(["param:w"], [(1,)], "float32")   # /final's layout

NAN = float("nan")


def config(algorithm="fedavg", seed=0, lr=0.1, model="mlp"):
    """A small resolved-looking job: presets fill ``algorithm.server`` from the name."""
    return {"run": {"name": f"{algorithm}-{seed}", "seed": seed, "rounds": 4},
            "model": {"name": model},
            "algorithm": {"name": algorithm, "lr": lr, "server": "nova" if algorithm == "fednova" else "average"},
            "runtime": {"threads": seed},            # differs, but cannot change results
            "checkpoint": {"every": seed + 1}}


def write_run(directory, cfg, acc, loss=None, sim=None, finished=True):
    """A results file with the given per-round test accuracy, test loss and cumulative sim time."""
    directory.mkdir(parents=True, exist_ok=True)
    w = ResultsWriter(directory / "results.h5", {"config": cfg, "seed": cfg["run"]["seed"], "run_id": "0" * 32},
                      np.ones((2, 3), dtype=np.int64), model=MODEL)
    for r, a in enumerate(acc):
        m = {k: 0.0 for k in METRICS}
        m.update(round=r + 1, test_accuracy=a, test_loss=NAN if loss is None else loss[r],
                 sim_time=0.0 if sim is None else sim[r])
        w.append_round(m, {k: np.zeros(2) for k in CLIENT_FIELDS})
    if finished:
        w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    return directory


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two algorithms x 3 seeds. FedAvg reaches 0.45 at round 4 (sim 20 s), FedNova at round 2 (16 s).

    fedavg finals 0.5, 0.6, 0.7 (round 3 not evaluated); fednova finals 0.6, 0.7, 0.8, best 0.8
    at round 3; fednova seed 2 is still running.
    """
    root = tmp_path_factory.mktemp("sweep")
    for s, f in enumerate((0.5, 0.6, 0.7)):
        write_run(root / f"fedavg-s{s}", config("fedavg", s), [0.2, 0.4, NAN, f], sim=[5, 10, 15, 20])
        write_run(root / f"fednova-s{s}", config("fednova", s), [0.3, 0.5, 0.8, f + 0.1], sim=[8, 16, 24, 32],
                  finished=s != 2)
    return root


def csv_rows(text):
    return {row["group"]: row for row in csv.DictReader(io.StringIO(text))}


# --------------------------------------------------------------------------- one run

def test_run_stats_skip_unevaluated_rounds(tmp_path):
    d = write_run(tmp_path / "r", config(), [0.2, NAN, 0.5, 0.4], sim=[10, 25, 40, 60])
    s = runs.run_stats(load(d), d / "results.h5", target=0.45, last_k=2)
    assert (s.kind, s.final, s.best, s.best_round, s.rounds) == ("accuracy", 0.4, 0.5, 3, 4)
    assert s.last_k == pytest.approx(0.45)              # (0.5 + 0.4) / 2: the NaN row is no evaluation
    assert (s.to_target, s.sim_to_target) == (3, 40)    # round 2 is NaN, not "reached"
    assert runs.run_stats(load(d), d, None, last_k=5).last_k == pytest.approx(1.1 / 3)
    never = runs.run_stats(load(d), d, target=0.9, last_k=5)
    assert np.isnan(never.to_target) and np.isnan(never.sim_to_target)


def test_quality_falls_back_to_loss_when_no_accuracy(tmp_path):
    d = write_run(tmp_path / "q", config(model="quadratic"), [NAN] * 3, loss=[3.0, 2.0, 2.5])
    kind, rounds, values = runs.quality(load(d))
    assert kind == "loss" and rounds.tolist() == [1, 2, 3] and values.tolist() == [3.0, 2.0, 2.5]
    s = runs.run_stats(load(d), d, target=2.2, last_k=5)
    assert (s.best, s.best_round, s.to_target) == (2.0, 2, 2)   # lower is better: 2.0 <= 2.2 at round 2
    assert s.sim_to_target is None                               # no [system]: sim_time all 0


def test_loss_only_report_names_the_loss(tmp_path):
    write_run(tmp_path / "q", config(model="quadratic"), [NAN] * 3, loss=[3.0, 2.0, 2.5])
    text = report_text([tmp_path], target=2.2)
    header = text.splitlines()[0]
    assert "final loss" in header and "best loss" in header and "rounds to 2.2" in header
    assert "sim s to" not in header                              # no simulated clock
    row = csv_rows(report_text([tmp_path], fmt="csv", target=2.2))["all"]
    assert (row["metric"], row["final_mean"], row["best_mean"], row["rounds_to_target_mean"]) == ("loss", "2.5",
                                                                                                   "2", "2")


def test_mixing_accuracy_and_loss_runs_is_refused(tmp_path):
    write_run(tmp_path / "acc", config(), [0.5])
    write_run(tmp_path / "loss", config(model="quadratic"), [NAN], loss=[1.0])
    with pytest.raises(HpcflError, match="report them separately"):
        report_text([tmp_path])


# --------------------------------------------------------------------------- grouping

def fake(cfg):
    return SimpleNamespace(config=cfg)


def test_differing_keys_ignore_replicate_and_bookkeeping_keys():
    a, b = config("fedavg", 0), config("fednova", 1, lr=0.2)
    b["algorithm"]["nova"] = {"value": 1}   # a sub-table only FedNova runs have
    assert runs.differing_keys([a, b]) == ["algorithm.lr", "algorithm.name", "algorithm.nova.value",
                                           "algorithm.server"]
    assert runs.differing_keys([a, config("fedavg", 5)]) == []   # seed, name, threads, checkpoint only


def test_default_groups_are_configurations_with_seeds_together():
    res = [fake(config(a, s)) for a in ("fedavg", "fednova") for s in range(3)]
    groups = runs.group_runs(res)
    # algorithm.server follows from the name: it splits nothing further, so it is not in the label;
    # the labels are the legend's words (issue 38: "name=fedavg" read as run.name or model.name too)
    assert list(groups) == ["FedAvg", "FedNova"]
    assert groups["FedAvg"] == res[:3] and groups["FedNova"] == res[3:]
    grid_runs = [fake(config(a, 0, lr)) for lr in (0.2, 0.1) for a in ("fednova", "fedavg")]
    grid = runs.group_runs(grid_runs)
    assert list(grid) == ["FedNova, lr 0.2", "FedAvg, lr 0.2",   # order of first appearance
                          "FedNova, lr 0.1", "FedAvg, lr 0.1"]
    assert list(runs.group_runs(grid_runs, words=False)) == ["name=fednova, lr=0.2", "name=fedavg, lr=0.2",
                                                            "name=fednova, lr=0.1", "name=fedavg, lr=0.1"]
    assert runs.dotted_labels(grid_runs)["FedAvg, lr 0.1"] == "name=fedavg, lr=0.1"
    assert list(runs.group_runs([fake(config(seed=s)) for s in range(3)])) == ["all"]


def test_colliding_leaves_use_the_dotted_key():
    res = []
    for mu_a, mu_m in ((0.0, 1), (0.1, 1), (0.0, 2)):
        c = config()
        c["algorithm"]["mu"], c["model"]["mu"] = mu_a, mu_m
        res.append(fake(c))
    # words would say "mu = 0, mu = 1": which mu? the dotted keys say
    assert list(runs.group_runs(res)) == ["algorithm.mu=0.0, model.mu=1", "algorithm.mu=0.1, model.mu=1",
                                          "algorithm.mu=0.0, model.mu=2"]


def test_explicit_by_and_unknown_key():
    res = [fake(config(a, s)) for a in ("fedavg", "fednova") for s in range(2)]
    assert list(runs.group_runs(res, by=["lr"])) == ["lr 0.1"]
    # name: the one that differs (algorithm.name), not run.name or model.name
    assert list(runs.group_runs(res, by=["name", "run.seed"])) == [
        "FedAvg, seed = 0", "FedAvg, seed = 1", "FedNova, seed = 0", "FedNova, seed = 1"]
    with pytest.raises(HpcflError) as info:
        runs.group_runs(res, by=["algorithm.lrr"])
    assert "no run has the config key 'algorithm.lrr'" in str(info.value) and "algorithm.lr" in str(info.value)


def test_find_runs_accepts_dirs_files_and_sweeps(tmp_path):
    a = write_run(tmp_path / "sweep" / "a", config(), [0.5])
    b = write_run(tmp_path / "sweep" / "deep" / "b", config(), [0.5])
    write_run(a / "replaced-20240101T000000Z-abcdef", config(), [0.1])   # set aside by --force: not a run
    found = runs.find_runs([str(tmp_path / "sweep"), str(a), str(a / "results.h5")])
    assert found == [(a / "results.h5").resolve(), (b / "results.h5").resolve()]
    (tmp_path / "empty").mkdir()
    with pytest.raises(HpcflError, match="no run found"):
        runs.find_runs([str(tmp_path / "empty")])
    with pytest.raises(HpcflError, match="no such file or directory"):
        runs.find_runs([str(tmp_path / "nope")])


# --------------------------------------------------------------------------- group statistics and formats

def test_csv_mean_std_over_seeds_and_speedup(sweep):
    rows = csv_rows(report_text([sweep], fmt="csv", target=0.45, baseline="algorithm.name=fedavg"))
    avg, nova = rows["FedAvg"], rows["FedNova"]
    assert (avg["n"], nova["n"], nova["running"]) == ("3", "3", "1")
    assert float(avg["final_mean"]) == pytest.approx(0.6) and float(avg["final_std"]) == pytest.approx(0.1)
    assert float(nova["best_mean"]) == pytest.approx(0.8) and float(nova["best_round_mean"]) == 3
    # fedavg seed 1 evaluated 0.2, 0.4, 0.6: mean of the last 5 (all three) is 0.4; over seeds 0.4 +- 1/30
    assert float(avg["last_k_mean"]) == pytest.approx(0.4) and float(avg["last_k_std"]) == pytest.approx(1 / 30)
    assert (avg["rounds_to_target_mean"], nova["rounds_to_target_mean"]) == ("4", "2")
    assert (avg["sim_time_to_target_mean"], nova["sim_time_to_target_mean"]) == ("20", "16")
    assert (float(avg["speedup"]), float(nova["speedup"])) == (1.0, 2.0)    # 4 rounds / 2 rounds
    assert float(nova["sim_speedup"]) == 1.25                                # 20 s / 16 s
    assert (avg["reached"], avg["paper"]) == ("3", "")


def test_text_table_marks_running_and_never_reached(sweep):
    text = report_text([sweep], target=0.75, baseline="name=fedavg")   # the label by keys still names it
    cells = {line.split("  ")[0]: re.split(r"\s{2,}", line) for line in text.splitlines()}
    head = cells["group"]
    assert head == ["group", "n", "final acc", "best acc", "best round", "last-5 acc", "rounds to 0.75",
                    "sim s to 0.75", "speedup", "sim speedup", "Δ final vs FedAvg", "Δ last-5 vs FedAvg", "rounds",
                    "status"]
    avg = dict(zip(head, cells["FedAvg"]))
    nova = dict(zip(head, cells["FedNova"]))
    # std 0.1 to two significant digits (0.10), the mean to the same place (issue 49)
    assert (avg["final acc"], avg["rounds to 0.75"], avg["status"]) == ("0.60 ± 0.10", "- (0/3)", "finished")
    # fednova's finals are fedavg's + 0.1 seed by seed: the paired difference has no spread
    assert (avg["Δ final vs FedAvg"], nova["Δ final vs FedAvg"]) == ("baseline", "+0.1000 ± 0 (3/3 better)")
    assert (nova["rounds to 0.75"], nova["sim s to 0.75"], nova["status"]) == ("3 ± 0", "24 ± 0", "1 running")
    assert (avg["speedup"], nova["speedup"]) == ("-", "-")    # fedavg never reached the target


def test_per_run_rows_and_single_run_std(sweep):
    text = report_text([sweep / "fedavg-s0", sweep / "fednova-s2"], per_run=True)
    rows = [line for line in text.splitlines() if line.startswith("  seed")]
    assert len(rows) == 2 and rows[1].rstrip().endswith("running")
    assert "  0.5000  " in text and "± -" not in text          # one run: the mean alone, no std


def test_a_group_with_a_seed_twice_is_warned_about(sweep, tmp_path, capsys):
    """A copy of fedavg-s0 beside the sweep: group FedAvg has 4 runs, two of seed 0."""
    import shutil

    copy = tmp_path / "copy-of-s0"
    shutil.copytree(sweep / "fedavg-s0", copy)
    text = report_text([sweep, copy])
    (line,) = [x for x in text.splitlines() if x.startswith("warning")]
    assert line.startswith("warning: group 'FedAvg' holds 2 runs of seed 0 (") and str(copy) in line
    assert report_text([sweep]).count("warning") == 0
    report_text([sweep, copy], fmt="csv")
    assert "holds 2 runs of seed 0" in capsys.readouterr().err


def test_json_has_group_and_run_values(sweep):
    data = json.loads(report_text([sweep], fmt="json", target=0.45))
    assert [g["group"] for g in data] == ["FedAvg", "FedNova"]
    assert data[0]["keys"] == {"algorithm.name": "fedavg"} and data[0]["final"]["std"] == pytest.approx(0.1)
    assert [r["final"] for r in data[0]["runs"]] == [0.5, 0.6, 0.7]
    assert [r["status"] for r in data[1]["runs"]] == ["finished", "finished", "running"]
    assert data[1]["runs"][0]["rounds_to_target"] == 2 and data[1]["speedup"] is None   # no baseline


def test_markdown_and_paper_column(sweep):
    text = report_text([sweep], fmt="markdown", paper=["name=fednova=0.81"])   # by keys, as the docs give them
    lines = text.splitlines()
    assert lines[0].startswith("| group | n | final acc | best acc |") and "| paper |" in lines[0]
    assert lines[1].startswith("|:---|---:|")
    assert next(line for line in lines if line.startswith("| FedNova")).count("| 0.81 |") == 1
    words = report_text([sweep], fmt="markdown", paper=["FedNova=0.81"]).splitlines()   # or by the words
    assert next(line for line in words if line.startswith("| FedNova")).count("| 0.81 |") == 1
    with pytest.raises(HpcflError, match="'FedAvg'; 'FedNova'"):
        report_text([sweep], paper=["fedprox=0.7"])


def test_baseline_errors(sweep):
    with pytest.raises(HpcflError, match="no group has algorithm.name = fedprox; its values are fedavg, fednova"):
        report_text([sweep], target=0.45, baseline="algorithm.name=fedprox")
    with pytest.raises(HpcflError, match="matches 2 groups"):
        report_text([sweep], target=0.45, baseline="lr=0.1")
    with pytest.raises(HpcflError, match="--select-seeds needs --best-by"):
        report_text([sweep], select_seeds="0")
    # without --target: the paired differences, no speedup column
    assert "speedup" not in report_text([sweep], baseline="name=fedavg").splitlines()[0]


# --------------------------------------------------------------------------- command line

def test_cli_prints_writes_and_exits_2_on_bad_input(sweep, tmp_path, capsys):
    assert cli.main(["report", str(sweep), "--format", "csv", "--by", "algorithm.name"]) == 0
    assert list(csv_rows(capsys.readouterr().out)) == ["FedAvg", "FedNova"]
    out = tmp_path / "r.md"
    assert cli.main(["report", str(sweep), "--format", "markdown", "--out", str(out), "--last-k", "1"]) == 0
    assert "| last-1 acc |" in out.read_text().splitlines()[0]
    assert cli.main(["report", str(sweep), "--by", "nosuch"]) == 2
    assert "no run has the config key 'nosuch'" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path / "missing")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


def test_a_read_error_in_one_run_skips_it_and_keeps_the_others(monkeypatch):
    """An OSError while reading one run (EIO from failing storage, anywhere in the file) is that
    run's problem: it is skipped with a line naming it, the others are returned (issue 37.4)."""
    import errno

    import hpcfl.io.results as results_io

    def fake_load(path, lazy=False):   # runs.load_runs reads lazily
        if path.name == "bad.h5":
            raise OSError(errno.EIO, "Input/output error")
        return SimpleNamespace(source=path)

    monkeypatch.setattr(results_io, "load", fake_load)
    lines = []
    got = runs.load_runs([Path("a/good.h5"), Path("b/bad.h5"), Path("c/good.h5")], warn=lines.append)
    assert [r.source for r in got] == [Path("a/good.h5"), Path("c/good.h5")]
    assert lines == ["hpcfl: skipped b/bad.h5: it cannot be read (Input/output error)"]
    with pytest.raises(HpcflError, match="no run could be read: b/bad.h5 cannot be read"):
        runs.load_runs([Path("b/bad.h5")], warn=lines.append)
