"""``hpcfl sweep``: the grid, point names, skip and resume, --list/--only, errors, and the
safety of running several points in one process (signals, watchdog, locks)."""

import fcntl
import re
import signal
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest

from clirun import ROOT, assert_same_run, hpcfl, kill_group, start
from hpcfl.cli import sweep
from hpcfl.config import RUN_NAME
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.results import load

QUICKSTART = (ROOT / "jobs" / "quickstart.toml").read_text()
ONE_THREAD = ["--set", "runtime.threads=1"]   # 2 torch threads on a busy 2-core machine crawl
# a component's name stands alone in a point's name (issue 38: "name-fedavg" read as run.name or model.name)
GRID_NAMES = ["fedavg_seed-0", "fedavg_seed-1", "fedavg_seed-2", "fednova_seed-0", "fednova_seed-1", "fednova_seed-2"]


def sweep_job(tmp_path: Path, grid: str, name: str = "sw") -> Path:
    """The quickstart job with another run.name, one torch thread and ``grid`` as its [sweep] table."""
    text = (QUICKSTART.replace('name = "quickstart"', f'name = "{name}"') + "\n[runtime]\nthreads = 1\n"
            + f"\n[sweep]\n{grid}\n")
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def table_of(stdout: str) -> list[str]:
    """The report table's lines: from its one "group" header to the end of stdout."""
    heads = [i for i, line in enumerate(stdout.splitlines()) if line.startswith("group ")]
    assert len(heads) == 1, f"expected exactly one report table:\n{stdout}"
    return stdout.splitlines()[heads[0]:]


def wait_for(predicate, proc, what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert proc.poll() is None, f"sweep ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def locked(folder: Path) -> bool:
    """Whether some process holds the run lock of ``folder``."""
    with open(folder / ".hpcfl-lock", "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


# ---- the grid without training ----------------------------------------------------------------

def test_points_of_the_quickstart_sweep():
    s = sweep.expand(ROOT / "jobs" / "sweep_quickstart.toml")
    assert s.out == Path("runs/sweep_quickstart")
    assert [p.name for p in s.points] == GRID_NAMES   # first key outermost
    assert s.points[4].sets == ("algorithm.name=fednova", "run.seed=1")
    t = s.points[4].table
    assert (t["algorithm"]["name"], t["run"]["seed"], t["run"]["name"]) == ("fednova", 1, "fednova_seed-1")
    assert "sweep" not in t and t["algorithm"]["lr"] == 0.05 and t["run"]["rounds"] == 30


def test_names_values_and_collisions(tmp_path):
    job = sweep_job(tmp_path, '"algorithm.lr" = [0.01, 1e-05]\n"model.mlp.hidden" = [[64, 32]]\n'
                              '"algorithm.momentum" = [0.5]')
    s = sweep.expand(job, ["run.rounds=2"], out=tmp_path / "o")
    assert [p.name for p in s.points] == ["lr-0.01_hidden-64-32_momentum-0.5", "lr-1e-05_hidden-64-32_momentum-0.5"]
    assert s.points[1].sets == ("algorithm.lr=1e-05", "model.mlp.hidden=[64, 32]", "algorithm.momentum=0.5")
    assert s.points[1].table["run"]["rounds"] == 2 and s.out == tmp_path / "o"
    # components' names alone (the same leaf under two sections); unsafe characters become '-'
    job = sweep_job(tmp_path, '"algorithm.name" = ["fedavg"]\n"model.name" = ["mlp"]\n'
                              '"data.root" = ["/a b/c", "x:y"]', name="collide")
    assert [p.name for p in sweep.expand(job).points] == [
        "fedavg_mlp_root-a-b-c", "fedavg_mlp_root-x-y"]
    # a string that reads as TOML when plain is written quoted, so --set gives it back as a string
    assert sweep.set_text("data.root", "true") == 'data.root="true"'
    assert sweep.set_text("data.root", "/x y") == "data.root=/x y"


def test_a_sweep_begun_under_the_earlier_names_keeps_its_folders(tmp_path):
    """Points named name-fedavg_seed-0 by an earlier hpcfl versions keep those folders (their finished
    runs are skipped, not run again under the new names); a fresh sweep gets the new names."""
    job = sweep_job(tmp_path, '"algorithm.name" = ["fedavg", "fednova"]\n"run.seed" = [0]', name="old")
    out = tmp_path / "o"
    assert [p.name for p in sweep.expand(job, out=out).points] == ["fedavg_seed-0", "fednova_seed-0"]
    (out / "name-fedavg_seed-0").mkdir(parents=True)
    (out / "name-fedavg_seed-0" / "results.h5").write_bytes(b"")
    s = sweep.expand(job, out=out)
    assert [p.name for p in s.points] == ["name-fedavg_seed-0", "name-fednova_seed-0"]
    assert s.points[1].table["run"]["name"] == "name-fednova_seed-0" and "earlier names" in s.notes[0]


def test_values_alike_once_made_file_safe_get_their_own_folders(tmp_path):
    """"a/b" and "a:b" both read "a-b"; the index appended to tell them apart made the first "a-b_1",
    which a third value "a-b_1" already was: two points shared a folder, one's job.toml was overwritten
    and the sweep exited 2 forever. Names differing only in case would share a folder on macOS."""
    job = sweep_job(tmp_path, '"data.root" = ["a/b", "a:b", "a-b_1", "A-B_1"]', name="alike")
    names = [p.name for p in sweep.expand(job).points]
    assert len({n.casefold() for n in names}) == 4, names
    assert names[0] == "root-a-b_0"                                      # unchanged where it was unique
    assert all(RUN_NAME.fullmatch(n) for n in names)
    s = sweep.expand(job, out=tmp_path / "o")
    for p in s.points:
        sweep.write_point_job(s, p)
    jobs = {p.name: tomllib.loads((tmp_path / "o" / p.name / "job.toml").read_text()) for p in s.points}
    assert [jobs[p.name]["data"]["root"] for p in s.points] == ["a/b", "a:b", "a-b_1", "A-B_1"]


def test_point_job_file_reads_back_as_the_point(tmp_path):
    table = {"run": {"name": "p", "seed": 3, "rounds": 2}, "data": {"num_clients": 4, "dirichlet": {"alpha": 0.5}},
             "model": {"mlp": {"hidden": [8, 4]}}, "system": {"x": float("inf"), "s": 'q"\\\u00e9'}}
    text = sweep.toml_document(table, "header")
    assert text.startswith("# header\n\n[run]\nname = \"p\"\n")
    assert "[data.dirichlet]\nalpha = 0.5" in text and "[model.mlp]\nhidden = [8, 4]" in text
    assert tomllib.loads(text) == table


@pytest.mark.parametrize("grid, message", [
    ('"run.seed" = []', "sweep.'run.seed' is an empty list"),
    ('"run.seed" = 3', "sweep.'run.seed' = 3 must be a list of values"),
    ('"algorithm.bogus" = [1, 2]', "config error: [sweep] point 0 (bogus-1): unknown key algorithm.bogus"),
    ('"run.name" = ["a"]', "sweep key 'run.name' cannot be swept: each point's run.name is its point name"),
    ('seed = [1]', "sweep key 'seed' must be a dotted config key"),
])
def test_grid_errors_name_the_key(tmp_path, grid, message):
    with pytest.raises(ConfigError) as err:
        sweep.expand(sweep_job(tmp_path, grid))
    assert message in str(err.value)


def test_set_of_a_swept_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"--set 'run.seed=4' sets run.seed, which the \[sweep\] table varies"):
        sweep.expand(sweep_job(tmp_path, '"run.seed" = [0, 1]'), ["run.seed=4"])


def test_job_without_sweep_table_is_refused():
    with pytest.raises(ConfigError, match=r"has no \[sweep\] table; .* or run it with hpcfl run"):
        sweep.expand(ROOT / "jobs" / "quickstart.toml")


# ---- the CLI ---------------------------------------------------------------------------------

def test_cli_input_errors_exit_2(tmp_path):
    p = hpcfl("sweep", str(sweep_job(tmp_path, '"run.seed" = []')), "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "sweep.'run.seed' is an empty list" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()
    p = hpcfl("run", "jobs/sweep_quickstart.toml", "--out", str(tmp_path / "o"))
    assert p.returncode == 2 and "hpcfl sweep" in p.stderr, p.stderr   # the advice (from config validation)


def test_list_and_only(tmp_path):
    out = tmp_path / "grid"
    p = hpcfl("sweep", "jobs/sweep_quickstart.toml", "--list", "--out", str(out))
    assert p.returncode == 0, p.stderr
    rows = [line.split() for line in p.stdout.splitlines() if re.match(r"\s+\d+\s", line)]
    assert [r[:2] for r in rows] == [[str(i), n] for i, n in enumerate(GRID_NAMES)]
    assert rows[5][2:] == ["--set", "algorithm.name=fednova", "--set", "run.seed=2"]
    assert "JOB=jobs/sweep_quickstart.toml HPCFL_SWEEP=grid sbatch --array=0-5 slurm/array_sweep.sbatch" in p.stdout
    assert not out.exists(), "--list runs nothing"

    p = hpcfl("sweep", "jobs/sweep_quickstart.toml", "--only", "4", "--out", str(out), "--set", "run.rounds=2",
              *ONE_THREAD)
    assert p.returncode == 0, p.stderr
    assert sorted(d.name for d in out.iterdir()) == ["fednova_seed-1"]
    r = load(out / "fednova_seed-1")
    assert r.attrs["status"] == "finished" and list(r.metrics["round"]) == [1, 2]
    assert (r.config["algorithm"]["name"], r.config["run"]["seed"]) == ("fednova", 1)
    assert "group " not in p.stdout, "an array task prints no table"
    # --only beyond the grid: exit 2 (tests/e2e/test_slurm.py runs it), naming the range
    with pytest.raises(HpcflError, match=r"--only 6: .* has 6 sweep point\(s\), 0 to 5 .* --array=0-5\)"):
        sweep.select(sweep.expand(ROOT / "jobs" / "sweep_quickstart.toml"), 6)


def test_a_set_that_switches_a_component_says_what_it_drops(tmp_path):
    """As ``hpcfl run`` does: --set data.partition=pareto leaves [data.dirichlet] out, and says so."""
    job = ROOT / "jobs" / "sweep_quickstart.toml"
    sw = sweep.expand(job, ["data.partition=pareto"])
    assert sw.notes == ("[data.dirichlet] is left out: after --set data.partition=pareto no chosen component "
                        "reads it",)
    assert all("dirichlet" not in p.table["data"] for p in sw.points)
    assert sweep.expand(job).notes == ()
    p = hpcfl("sweep", str(job), "--list", "--set", "data.partition=pareto", "--out", str(tmp_path / "o"))
    assert p.returncode == 0, p.stderr
    assert "hpcfl sweep: note: [data.dirichlet] is left out: after --set data.partition=pareto" in p.stdout


def test_grid_runs_every_point_then_skips_them(tmp_path):
    """jobs/sweep_quickstart.toml as shipped: 2 algorithms x 3 seeds, 30 rounds each."""
    out = tmp_path / "grid"
    p = hpcfl("sweep", "jobs/sweep_quickstart.toml", "--out", str(out), *ONE_THREAD, timeout=240)
    assert p.returncode == 0, p.stderr
    assert sorted(d.name for d in out.iterdir()) == GRID_NAMES
    finals = []
    for name in GRID_NAMES:
        alg, seed = name.split("_")[0], int(name[-1])
        r = load(out / name)
        assert r.attrs["status"] == "finished"
        assert (r.config["algorithm"]["name"], r.config["run"]["seed"], r.config["run"]["name"]) == (alg, seed, name)
        assert r.config["algorithm"]["lr"] == 0.05 and r.config["data"]["num_clients"] == 20
        assert list(r.metrics["round"]) == list(range(1, 31))
        finals.append(r.final_params)
    assert all(not np.array_equal(a, b) for i, a in enumerate(finals) for b in finals[i + 1:])
    assert p.stdout.count("hpcfl sweep: point ") == 6
    table = table_of(p.stdout)
    # the groups in the legend's words
    assert [sum(line.startswith(f"{g} ") for line in table) for g in ("FedAvg", "FedNova")] == [1, 1]
    assert [re.search(r"Fed(Avg|Nova)\s+(\d+)\s", line).group(2) for line in table if "Fed" in line] == ["3", "3"]

    before = {n: ((out / n / "results.h5").stat().st_mtime_ns, load(out / n).attrs["run_id"]) for n in GRID_NAMES}
    p = hpcfl("sweep", "jobs/sweep_quickstart.toml", "--out", str(out), *ONE_THREAD, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [line for line in p.stdout.splitlines() if "already finished" in line] == [
        f"hpcfl: {out / n} is already finished (30 rounds); nothing to do" for n in GRID_NAMES]
    assert not any(line.startswith(("round ", "hpcfl sweep: point")) for line in p.stdout.splitlines())
    assert {n: ((out / n / "results.h5").stat().st_mtime_ns, load(out / n).attrs["run_id"])
            for n in GRID_NAMES} == before
    assert len(table_of(p.stdout)) >= 4


def test_killed_sweep_continues_where_it_stopped(tmp_path):
    job = sweep_job(tmp_path, '"run.seed" = [0, 1, 2]')
    sets = ["--set", "run.rounds=15", "--set", "checkpoint.every=1"]
    out = tmp_path / "out"
    proc = start("sweep", str(job), "--out", str(out), *sets)
    try:
        wait_for(lambda: any((out / "seed-1" / "checkpoints").glob("ckpt-*.h5")), proc, "point 1's checkpoint")
        # mid point 1: point 0's lock was released, point 1 holds its own
        held = (locked(out / "seed-0"), locked(out / "seed-1"))
    finally:
        kill_group(proc)
        proc.communicate()
    assert held == (False, True)
    assert load(out / "seed-1").attrs["status"] == "running" and not (out / "seed-2").exists()

    p = hpcfl("sweep", str(job), "--out", str(out), *sets)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert f"hpcfl: {out / 'seed-0'} is already finished (15 rounds); nothing to do" in lines
    at = [i for i, line in enumerate(lines) if line.startswith(("hpcfl sweep: point", "hpcfl: resuming from"))]
    assert [lines[i].split(":")[1].split()[0] for i in at] == ["point", "resuming", "point"]
    assert "seed-1" in lines[at[0]] and "seed-2" in lines[at[2]]
    assert load(out / "seed-1").attrs["resumed_at_round"] >= 1
    assert load(out / "seed-2").attrs["status"] == "finished"
    ref = tmp_path / "ref"
    p = hpcfl("run", "jobs/quickstart.toml", "--set", "run.seed=1", *sets, *ONE_THREAD, "--out", str(ref))
    assert p.returncode == 0, p.stderr
    assert_same_run(out / "seed-1", ref)


def test_stop_signal_during_a_later_point_checkpoints_and_exits_75(tmp_path):
    """cmd_run ignores stop signals once a point has finished: the next point must listen again."""
    job = sweep_job(tmp_path, '"run.seed" = [0, 1]')
    out = tmp_path / "out"
    proc = start("sweep", str(job), "--out", str(out), "--set", "run.rounds=30", "--set", "checkpoint.every=1")
    try:
        wait_for(lambda: any((out / "seed-1" / "checkpoints").glob("ckpt-*.h5")), proc, "point 1's checkpoint")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 75, err
    assert "resumable: run the same command again to continue" in err


def test_a_finished_points_watchdog_does_not_abort_the_next(tmp_path):
    """watchdog.timeout_s = 2: a watchdog left running after point 0 (2 rounds) would abort the
    process at most 3.5 s later (2 s, its 0.5 s wake-up, its 1 s pause), during point 1 (500 rounds:
    about 10 s on an idle 2-core machine; 120 rounds took 2.4 s there, too short to catch a leak)."""
    job = sweep_job(tmp_path, '"run.rounds" = [2, 500]')
    out = tmp_path / "out"
    p = hpcfl("sweep", str(job), "--out", str(out), "--set", "watchdog.timeout_s=2")
    assert p.returncode == 0, p.stderr
    assert "watchdog" not in p.stderr
    assert [load(out / n).attrs["status"] for n in ("rounds-2", "rounds-500")] == ["finished", "finished"]
    ends = [(out / n / "results.h5").stat().st_mtime for n in ("rounds-2", "rounds-500")]
    assert ends[1] - ends[0] > 3.5, "point 1 too short to catch a leaked watchdog: raise its run.rounds"
