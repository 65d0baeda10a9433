"""hpcfl export and Results.to_pandas: every table read back and compared with results.h5; the
TensorBoard events read back with tensorboard's EventAccumulator; and ``run --force`` sets the old
run's exports aside with it."""

import os

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
        last = res.client_eval["accuracy"][res.client_eval["round"] == 3]
        assert acc.Scalars("clients/accuracy_mean")[-1].value == np.float32(last.mean())
        assert acc.Scalars("clients/accuracy_worst10")[-1].value == np.float32(last.min())   # 1 of 7 clients
    # under --out: each run's path mirrored, so one logdir shows the sweep
    monkeypatch.chdir(sweep.parent)
    assert cli.main(["export", "runs", "--format", "tensorboard", "--out", str(tmp_path / "tb")]) == 0
    assert sorted(p.parent.name for p in (tmp_path / "tb").rglob("events.out.tfevents.*")) == ["seed-0", "seed-1"]


def tensorboard(*args):
    return cli.main(["export", *map(str, args), "--format", "tensorboard"])


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
