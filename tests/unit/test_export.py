"""hpcfl export and Results.to_pandas: every table read back and compared with results.h5; the
TensorBoard events read back with tensorboard's EventAccumulator. Then what export never does
(issue 45): write through a link, delete event files it did not write, overwrite a run it reads
or any HDF5 file, write a format other than the file name says; and ``run --force`` sets the old
run's exports aside with it."""

import json
import os
import shutil

import h5py
import numpy as np
import pandas as pd
import pytest
from runner import job

from hpcfl import cli
from hpcfl.config.tomltext import toml_document
from hpcfl.results import load


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two runs of a tiny job (seeds 0 and 1) under one folder, as a sweep leaves them."""
    d = tmp_path_factory.mktemp("exp")
    for seed in (0, 1):
        table = job(**{"run.seed": seed, "run.rounds": 3, "run.eval_every": 2})
        (d / f"job{seed}.toml").write_text(toml_document(table, "export"))
        assert cli.main(["run", str(d / f"job{seed}.toml"), "--out", str(d / "runs" / f"seed-{seed}")]) == 0
    return d / "runs"


def h5_columns(path, group):
    with h5py.File(path, "r") as f:
        return {k: f[group][k][()] for k in f[group]}


def test_to_pandas_is_the_files_arrays(sweep):
    res = load(sweep / "seed-0")
    df = res.to_pandas()
    m = h5_columns(sweep / "seed-0" / "results.h5", "metrics")
    assert df.index.name == "round" and df.index.tolist() == m["round"].tolist() == [1, 2, 3]
    for k, v in m.items():
        if k != "round":
            np.testing.assert_array_equal(df[k].to_numpy(), v)
    ce = res.to_pandas("client_eval")
    assert len(ce) == 7 * 2 and sorted(set(ce["round"])) == [2, 3]   # evaluated rounds only, 7 clients each


@pytest.mark.parametrize("table", ["metrics", "clients", "client_eval"])
def test_csv_and_parquet_read_back_equal_the_files(sweep, tmp_path, table):
    assert cli.main(["export", str(sweep), "--table", table, "--out", str(tmp_path / "t.csv")]) == 0
    assert cli.main(["export", str(sweep), "--table", table, "--format", "parquet",
                     "--out", str(tmp_path / "t.parquet")]) == 0
    csv = pd.read_csv(tmp_path / "t.csv")
    pq = pd.read_parquet(tmp_path / "t.parquet")
    for seed in (0, 1):
        cols = h5_columns(sweep / f"seed-{seed}" / "results.h5", table)
        for df in (csv, pq):
            part = df[df["seed"] == seed]
            assert set(part["run"]) == {str(sweep / f"seed-{seed}")} and set(part["group"]) == {"all"}
            assert list(part.columns[:4]) == ["run", "group", "seed", "round"]
            for k, v in cols.items():
                got = part[k].to_numpy()
                if df is pq:
                    assert got.tobytes() == v.astype(got.dtype).tobytes() and got.dtype == v.dtype, k
                else:   # CSV: text, each float written so that it reads back to the same double
                    np.testing.assert_array_equal(got, v)


def test_csv_goes_to_stdout_and_parquet_needs_a_file(sweep, capsys):
    assert cli.main(["export", str(sweep / "seed-1")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("run,group,seed,round,") and len(out) == 1 + 3
    assert cli.main(["export", str(sweep), "--format", "parquet"]) == 2
    assert "give --out FILE.parquet" in capsys.readouterr().err


def test_tensorboard_events_read_back(sweep, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert cli.main(["export", str(sweep), "--format", "tensorboard"]) == 0
    assert cli.main(["export", str(sweep), "--format", "tensorboard"]) == 0   # again: replaced, not doubled
    for seed in (0, 1):
        folder = sweep / f"seed-{seed}" / "tensorboard"
        assert len(list(folder.glob("events.out.tfevents.*"))) == 1
        acc = EventAccumulator(str(folder))
        acc.Reload()
        res = load(sweep / f"seed-{seed}")
        tags = acc.Tags()["scalars"]
        assert "metrics/test_accuracy" in tags and "clients/accuracy_jain" in tags
        ev = acc.Scalars("metrics/test_accuracy")
        assert [e.step for e in ev] == [2, 3]
        # TensorBoard keeps float32 scalars
        np.testing.assert_array_equal([e.value for e in ev],
                                      res.metrics["test_accuracy"][1:].astype(np.float32))
        loss = acc.Scalars("metrics/train_loss")
        np.testing.assert_array_equal([e.value for e in loss], res.metrics["train_loss"].astype(np.float32))
        # each point at its round's end: the run's start plus the rounds' times so far
        from hpcfl.analysis.tbevents import start_time
        assert start_time(res) > 0
        np.testing.assert_allclose([e.wall_time for e in loss], start_time(res) + np.cumsum(res.metrics["time_round"]),
                                   rtol=0, atol=1e-6)
        last = res.client_eval["accuracy"][res.client_eval["round"] == 3]
        assert acc.Scalars("clients/accuracy_mean")[-1].value == np.float32(last.mean())
        assert acc.Scalars("clients/accuracy_worst10")[-1].value == np.float32(last.min())   # 1 of 7 clients
    # under --out: each run's path mirrored, so one logdir shows the sweep
    monkeypatch.chdir(sweep.parent)
    assert cli.main(["export", "runs", "--format", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    assert sorted(p.parent.name for p in (tmp_path / "tb").rglob("events.out.tfevents.*")) == ["seed-0", "seed-1"]


def test_tensorboard_points_are_at_their_rounds_end():
    """A round's point is stamped when the round ended: start + the times of rounds 1..r (hand values)."""
    from types import SimpleNamespace

    from hpcfl.analysis.tbevents import scalars, start_time

    res = SimpleNamespace(segments=[{"started": "2024-01-01T00:00:00Z"}], client_eval=None,
                          metrics={"round": np.array([1, 2, 3]), "time_round": np.array([2.0, 3.0, 4.0]),
                                   "train_loss": np.array([0.5, 0.25, np.nan])})
    assert start_time(res) == 1704067200.0
    t0 = 1704067200.0
    got = {(tag, step): wall for tag, step, wall, _ in scalars(res)}
    assert got[("metrics/train_loss", 1)] == t0 + 2.0 and got[("metrics/train_loss", 2)] == t0 + 5.0
    assert ("metrics/train_loss", 3) not in got                       # NaN: no point
    assert [got[("metrics/time_round", r)] for r in (1, 2, 3)] == [t0 + 2.0, t0 + 5.0, t0 + 9.0]


# --------------------------------------------------------------------------- what export never does

@pytest.fixture
def run(sweep, tmp_path):
    """A copy of one run of the sweep (without its exports), to plant links and files in."""
    dst = tmp_path / "run"
    shutil.copytree(sweep / "seed-0", dst, ignore=shutil.ignore_patterns("tensorboard"))
    return dst


def tensorboard(*args):
    return cli.main(["export", *map(str, args), "--format", "tensorboard"])


def test_tensorboard_never_follows_a_planted_link(run, tmp_path, capsys, monkeypatch):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "events.out.tfevents.1.theirs").write_bytes(b"their events")
    (run / "tensorboard").symlink_to(victim)
    assert tensorboard(run) == 2
    err = capsys.readouterr().err
    assert f"{run / 'tensorboard'} is a symbolic link (to {victim})" in err and "Remove the link" in err
    assert os.listdir(victim) == ["events.out.tfevents.1.theirs"]
    assert (victim / "events.out.tfevents.1.theirs").read_bytes() == b"their events"
    (run / "tensorboard").unlink()
    (run / "tensorboard").symlink_to(tmp_path / "nowhere")   # dangling: nothing is created at its target
    assert tensorboard(run) == 2 and not os.path.lexists(tmp_path / "nowhere")
    assert "is a symbolic link" in capsys.readouterr().err
    # under --out: the folder itself, and each folder export creates under it (the run's path mirrored)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tblink").symlink_to(victim)
    assert tensorboard(run, "--out", tmp_path / "tblink") == 2
    assert f"{tmp_path / 'tblink'} is a symbolic link" in capsys.readouterr().err
    (tmp_path / "tb").mkdir()
    (tmp_path / "tb" / "run").symlink_to(victim)
    assert tensorboard(run, "--out", tmp_path / "tb") == 2
    assert f"{tmp_path / 'tb' / 'run'} is a symbolic link" in capsys.readouterr().err
    assert os.listdir(victim) == ["events.out.tfevents.1.theirs"]
    assert (victim / "events.out.tfevents.1.theirs").read_bytes() == b"their events"


def test_tensorboard_leaves_event_files_it_did_not_write(run, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(run, other)
    tb = run / "tensorboard"
    tb.mkdir()
    theirs = tb / "events.out.tfevents.2.someone"
    theirs.write_bytes(b"theirs")
    (tb / "notes.txt").write_text("keep")
    assert tensorboard(other, run) == 2
    err = capsys.readouterr().err
    assert f"{tb} holds TensorBoard event files that hpcfl export did not write ({theirs.name})" in err
    assert "Move them away" in err
    assert sorted(os.listdir(tb)) == [theirs.name, "notes.txt"] and theirs.read_bytes() == b"theirs"
    assert not (other / "tensorboard").exists()   # every folder is checked before any run is written
    theirs.rename(run / "moved-away")
    assert tensorboard(run) == 0
    written = [n for n in os.listdir(tb) if "tfevents" in n]
    assert len(written) == 1 and written[0].startswith("events.out.tfevents.")
    record = tb / ".hpcfl-export"
    assert json.loads(record.read_text())["files"] == written
    first = (tb / written[0]).read_bytes()
    # a rerun replaces what the record lists (an earlier export's file too), and nothing else
    (tb / "events.out.tfevents.0000000001.hpcfl").write_bytes(b"an earlier export")
    record.write_text(json.dumps({"files": sorted(written + ["events.out.tfevents.0000000001.hpcfl"])}))
    assert tensorboard(run) == 0
    assert sorted(os.listdir(tb)) == sorted([".hpcfl-export", "notes.txt"] + written)
    assert (tb / written[0]).read_bytes() == first and (tb / "notes.txt").read_text() == "keep"
    assert json.loads(record.read_text())["files"] == written


def test_a_table_never_overwrites_a_run_it_reads_or_any_hdf5_file(run, tmp_path, capsys):
    h5 = run / "results.h5"
    before = h5.read_bytes()
    alias = tmp_path / "alias.h5"
    os.link(h5, alias)
    (tmp_path / "via").symlink_to(run)
    assert cli.main(["export", str(run), "--out", str(h5)]) == 2   # as the attacker typed it
    for out in (h5, alias, tmp_path / "via" / "results.h5"):   # the same file by another path
        assert cli.main(["export", str(run), "--format", "csv", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} is {h5}, the results of a run being exported" in err, err
    assert h5.read_bytes() == before
    res = load(run)
    np.testing.assert_array_equal(res.metrics["train_loss"], h5_columns(h5, "metrics")["train_loss"])
    assert res.metrics["round"].tolist() == [1, 2, 3]
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.arange(3)
    assert cli.main(["export", str(run), "--format", "csv", "--out", str(other)]) == 2
    assert f"--out {other} is an HDF5 file" in capsys.readouterr().err
    with h5py.File(other, "r") as f:
        assert f["x"][()].tolist() == [0, 1, 2]


def test_a_table_never_follows_a_link(run, tmp_path, capsys):
    target = tmp_path / "target.csv"
    dangling = tmp_path / "dangling.csv"
    dangling.symlink_to(target)
    assert cli.main(["export", str(run), "--out", str(dangling)]) == 2
    assert f"--out {dangling} is a symbolic link (to {target})" in capsys.readouterr().err
    assert not os.path.lexists(target) and dangling.is_symlink()
    target.write_text("mine\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert cli.main(["export", str(run), "--out", str(link)]) == 2
    assert target.read_text() == "mine\n" and link.is_symlink()


def test_the_format_is_the_file_names(run, tmp_path, capsys):
    assert cli.main(["export", str(run), "--out", str(tmp_path / "t.parquet")]) == 0
    assert (tmp_path / "t.parquet").read_bytes()[:4] == b"PAR1"
    assert pd.read_parquet(tmp_path / "t.parquet")["round"].tolist() == [1, 2, 3]
    assert cli.main(["export", str(run), "--out", str(tmp_path / "t.csv")]) == 0
    assert (tmp_path / "t.csv").read_text().startswith("run,group,seed,round,")
    capsys.readouterr()
    assert cli.main(["export", str(run), "--out", str(tmp_path / "t.txt")]) == 2
    err = capsys.readouterr().err
    assert "hpcfl export knows .csv, .parquet, not '.txt'" in err and not (tmp_path / "t.txt").exists()
    assert cli.main(["export", str(run), "--format", "csv", "--out", str(tmp_path / "x.parquet")]) == 2
    assert "ends in .parquet, which says parquet" in capsys.readouterr().err
    assert not (tmp_path / "x.parquet").exists()


def test_force_sets_the_old_runs_exports_aside(tmp_path):
    import hpcfl

    out, table = tmp_path / "run", job(**{"run.rounds": 2})
    hpcfl.run(table, out=out)
    assert tensorboard(out) == 0
    old = {p.name: p.read_bytes() for p in (out / "tensorboard").iterdir()}
    seen = {}

    def look(event):   # the set-aside folder is deleted once the new run has a checkpoint: looked at first
        if isinstance(event, hpcfl.Start):
            aside = next(out.glob("replaced-*"))
            seen.update(beside=os.path.lexists(out / "tensorboard"),
                        aside={p.name: p.read_bytes() for p in (aside / "tensorboard").iterdir()})

    hpcfl.run(table, out=out, force=True, callbacks=[look])
    assert seen == {"beside": False, "aside": old} and any("tfevents" in name for name in old)
    assert not os.path.lexists(out / "tensorboard") and (out / "results.h5").is_file()
