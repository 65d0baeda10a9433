"""Issue 37 (items 5, 7, 9): where a traceback or a misleading exit code came, a clear message and the
documented exit code, before anything is written when the problem can be known then.

* divergence in round 1: exit 4 and a clean summary (was IndexError in the summary, exit 1);
* a NaN or Inf pixel, a scalar x in an npz: exit 2 naming the file, the array and the index (was a
  "lower the learning rate" divergence, exit 3 blaming the clients, an IndexError);
* HPCFL_FAULT: a malformed value exits 2 naming the format before --out is created (was a traceback
  after results.h5 and checkpoints/ were made); a valid one warns at start-up and says when it fires;
* a folder at a temporary name of results.h5: exit 2 at start (was 74, the full-disk code, after training).
"""

import numpy as np
import pytest

from hpcfl.results import load

from clirun import digits_job, hpcfl

JOB = digits_job("clear", 3, 2, "[checkpoint]\nevery = 1\n")


def job(tmp_path, text=JOB):
    (tmp_path / "job.toml").write_text(text)
    return str(tmp_path / "job.toml")


def test_divergence_in_round_1_exits_4_with_a_clean_summary(tmp_path):
    out = tmp_path / "out"
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "algorithm.lr=1e6")
    assert p.returncode == 4, p.stderr[-2000:]
    assert "Traceback" not in p.stderr and "diverged" in p.stderr and "round 1" in p.stderr, p.stderr
    assert "rounds" in p.stdout and "0 (none recorded)" in p.stdout, p.stdout
    assert load(out).attrs["status"] == "diverged"


def npz_run(tmp_path, x, y):
    """The run's arguments for ``JOB`` on an npz holding ``x`` and ``y``."""
    np.savez(tmp_path / "d.npz", x=x, y=y)
    return ("run", job(tmp_path), "--set", "data.dataset=npz", "--set", f"data.root={tmp_path}",
            "--set", "data.npz.file=d.npz")


@pytest.mark.parametrize("bad, said", [(np.nan, "x[57, 3] = nan is not finite")])   # more in test_data_values.py
def test_a_bad_value_in_a_data_file_exits_2_before_anything_is_written(tmp_path, bad, said):
    rows = np.random.default_rng(0).normal(size=(120, 8)).astype(np.float32)
    rows[57, 3] = bad
    out = tmp_path / "out"
    p = hpcfl(*npz_run(tmp_path, rows, np.arange(120) % 3), "--out", str(out))
    assert p.returncode == 2, p.stderr[-2000:]
    assert said in p.stderr and "d.npz" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "algorithm.lr" not in p.stderr and not out.exists()


@pytest.mark.parametrize("spec", ["1"])   # the other malformed forms: tests/unit/test_run_control.py
def test_a_malformed_fault_spec_exits_2_naming_the_format_before_out_is_created(tmp_path, spec):
    out = tmp_path / "out"
    p = hpcfl("run", job(tmp_path), "--out", str(out), env={"HPCFL_FAULT": spec})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert f"HPCFL_FAULT={spec!r} is not a fault to inject" in p.stderr and "RANK:PHASE:ROUND:KIND" in p.stderr
    assert not out.exists()


def test_fault_injection_warns_at_start_up_and_says_when_it_fires(tmp_path):
    p = hpcfl("run", job(tmp_path), "--out", str(tmp_path / "out"), env={"HPCFL_FAULT": "0:train:1:exit"})
    assert p.returncode == 1, p.stderr[-2000:]   # not 3, the guard's code
    lines = p.stderr.splitlines()
    assert lines[0].startswith("hpcfl: WARNING: fault injection is ON (HPCFL_FAULT=0:train:1:exit)"), p.stderr
    assert "rank 0 will exit in phase 'train' of round 2" in lines[0]
    assert "hpcfl: HPCFL_FAULT: injecting 'exit' on rank 0 in phase 'train' of round 2" in p.stderr
    assert "round 1/2" in p.stdout and "round 2/2" not in p.stdout


@pytest.mark.parametrize("name", [".results.h5.resume-tmp"])   # each name: tests/unit/test_run_control.py
def test_a_folder_at_a_temporary_results_name_exits_2_before_training(tmp_path, name):
    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    (out / name / "keep.txt").write_text("mine")
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert f"{out / name} is a folder" in p.stderr and "move it away" in p.stderr, p.stderr
    assert "round 1" not in p.stdout and not (out / "results.h5").exists()
    assert (out / name / "keep.txt").read_text() == "mine"


def test_a_finished_run_resumes_for_more_rounds_and_ends_in_place(tmp_path):
    """Since schema 3 the end of a run writes into results.h5 in place: no copy, so a folder at the old copy's
    name (results.h5.final) is no longer in the way and is left alone; the resumed run finishes again."""
    out = tmp_path / "out"
    assert hpcfl("run", job(tmp_path), "--out", str(out)).returncode == 0
    (out / "results.h5.final").mkdir()
    (out / "results.h5.final" / "keep.txt").write_text("mine")
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "run.rounds=4", "--allow-change", "run.rounds")
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    res = load(out)
    assert res.status == "finished" and res.metrics["round"].tolist() == [1, 2, 3, 4] and res.final_params is not None
    assert (out / "results.h5.final" / "keep.txt").read_text() == "mine"
