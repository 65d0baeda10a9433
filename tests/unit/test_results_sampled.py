"""results.clients = "sampled": the panel (hpcfl.io.panel), the job's keys, the writer that keeps the
panel's rows only and the readers that say so (tests/e2e/test_results_sampled.py runs jobs)."""

import math

import h5py
import numpy as np
import pytest

from hpcfl import cli, config, rng
from hpcfl.errors import ConfigError, HpcflError
from hpcfl.io.panel import PanelFilter, client_panel, panel_size
from hpcfl.io.results import CLIENT_FIELDS, FinalModel, ResultsWriter, load

from test_results_large import ATTRS, cohort_round

JOB = {"run": {"rounds": 1}, "data": {"dataset": "quadratic"}, "model": {"name": "quadratic"}}


def test_the_panel_is_the_clients_with_the_smallest_keys_by_hand():
    # the ten keys of seed 0, stream CLIENT_PANEL (printed once, rounded):
    # 0.499 0.205 0.617 0.322 0.613 0.022 0.195 0.997 0.139 0.257 -> smallest: 5, 8, 6, then 1, 9
    keys = rng.numpy_rng(0, rng.CLIENT_PANEL).random(10)
    assert np.round(keys, 3).tolist() == [0.499, 0.205, 0.617, 0.322, 0.613, 0.022, 0.195, 0.997, 0.139, 0.257]
    assert client_panel(0, 10, 0.3).tolist() == [5, 6, 8]   # ceil(0.3 * 10) = 3, increasing ids
    assert client_panel(0, 10, 0.5).tolist() == [1, 5, 6, 8, 9]
    assert client_panel(0, 10, 0.01).tolist() == [5]   # ceil(0.1) = 1: never an empty panel
    assert client_panel(0, 10, 1.0).tolist() == list(range(10))
    assert client_panel(0, 10, 0.3).dtype == np.int64


def test_the_panel_is_deterministic_its_size_exact_and_smaller_panels_nested():
    assert [panel_size(100, f) for f in (0.07, 0.01, 0.001, 1.0)] == [7, 1, 1, 100]   # 0.07 * 100 = 7.000000000000001
    assert [panel_size(150, 0.01), panel_size(10_000, 0.01), panel_size(99_999, 0.01)] == [2, 100, 1000]
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError):
            panel_size(10, bad)
    a = client_panel(7, 10_000, 0.01)
    assert len(a) == 100 and np.array_equal(a, client_panel(7, 10_000, 0.01))
    assert np.all(np.diff(a) > 0) and a.min() >= 0 and a.max() < 10_000
    assert set(a) <= set(client_panel(7, 10_000, 0.05))     # the 1 % inside the 5 %
    assert not np.array_equal(a, client_panel(8, 10_000, 0.01))   # another seed, another panel
    # a client's key does not depend on N: the first N draws of one stream
    keys20 = rng.numpy_rng(0, rng.CLIENT_PANEL).random(20)
    assert np.array_equal(keys20[:10], rng.numpy_rng(0, rng.CLIENT_PANEL).random(10))


def test_the_filter_keeps_the_panels_rows_of_any_cohort():
    f = PanelFilter(np.array([1, 5, 6]))
    assert f.rows([0, 1, 2, 5, 6, 7, 100, 5]).tolist() == [False, True, False, True, True, False, False, True]
    assert f.rows(np.array([], dtype=np.int64)).tolist() == []


def test_the_jobs_keys_and_their_refusals():
    cfg = config.from_dict({**JOB, "results": {"clients": "sampled"}})
    assert cfg.results.client_sample is None and cfg.results.sample_fraction == 0.01
    assert "client_sample" not in cfg.to_dict()["results"]   # unset: other jobs' digests are unchanged
    cfg = config.from_dict({**JOB, "results": {"clients": "sampled", "client_sample": 0.25}})
    assert cfg.results.sample_fraction == 0.25
    for value in (0.0, 1.5, -0.01):
        with pytest.raises(ConfigError, match=rf"results.client_sample = {value!r} must be a fraction of the "
                                              r"clients in \(0, 1\], e.g. results.client_sample = 0.01"):
            config.from_dict({**JOB, "results": {"clients": "sampled", "client_sample": value}})
    with pytest.raises(ConfigError, match="results.client_sample = 0.1 is used only with results.clients = "
                                          "'sampled' \\(this job has 'all'\\); set results.clients = 'sampled' or "
                                          "leave results.client_sample out"):
        config.from_dict({**JOB, "results": {"client_sample": 0.1}})
    assert not config.is_safe_change("results.client_sample") and not config.is_safe_change("results.clients")


N = 2000
PANEL = client_panel(0, N, 0.01)   # 20 clients


def sampled_run(directory, rounds=3, cohort_of=None):
    """A results file of ``rounds`` rounds of a 2,000-client cohort kept as PANEL's rows; returns the rounds."""
    directory.mkdir(parents=True, exist_ok=True)
    w = ResultsWriter(directory / "results.h5", ATTRS, np.ones((N, 2), dtype=np.int64), cohort=len(PANEL),
                      clients="sampled", panel=PANEL, model=FinalModel(["param:w"], [(1,)], np.float32))
    written = [cohort_round(r, n=N) for r in range(1, rounds + 1)]
    for m, c in written:
        w.append_round(m, c)
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    return written


def test_the_writer_keeps_the_panels_rows_bitwise(tmp_path):
    written = sampled_run(tmp_path / "run")
    res = load(tmp_path / "run")
    assert res.attrs["clients_recorded"] == "sampled" and res.panel.tolist() == PANEL.tolist()
    assert len(res.clients["round"]) == 3 * len(PANEL) == 60
    for name in CLIENT_FIELDS:   # what the file holds: the full rounds' rows restricted to the panel
        want = np.concatenate([np.asarray(c[name])[np.isin(c["client"], PANEL)] for _, c in written])
        assert res.clients[name].tobytes() == want.astype(CLIENT_FIELDS[name].dtype).tobytes(), name
    with h5py.File(tmp_path / "run" / "results.h5", "r") as f:
        assert f["clients_panel"].attrs["unit"] == "client"
        assert f["clients/steps"].chunks == (1024,) and f["clients/steps"].compression is None   # 20 < 1,024
    assert "panel and round (20 of 2000 clients, .panel" in repr(res)


def test_a_resume_keeps_the_panel_and_refuses_another(tmp_path):
    run = tmp_path / "run"
    sampled_run(run, rounds=2)
    before = (run / "results.h5").read_bytes()
    other = client_panel(1, N, 0.01)
    with pytest.raises(HpcflError, match="holds a panel of 20 clients and this run's panel "
                                         r"\(results.client_sample, run.seed\) is 20 other clients"):
        ResultsWriter(run / "results.h5", ATTRS, None, resume_at=1, cohort=20, clients="sampled", panel=other)
    with pytest.raises(HpcflError, match="records results.clients = 'sampled' and this run asks for 'all'"):
        ResultsWriter(run / "results.h5", ATTRS, None, resume_at=1, cohort=20)
    assert (run / "results.h5").read_bytes() == before and not list(run.glob(".*tmp"))   # left as it was
    w = ResultsWriter(run / "results.h5", ATTRS, None, resume_at=1, cohort=20, clients="sampled", panel=PANEL)
    w.append_round(*cohort_round(2, n=N, seed=1))
    w.close()
    res = load(run)
    assert res.clients["round"].tolist() == [1] * 20 + [2] * 20 and res.panel.tolist() == PANEL.tolist()
    assert res.clients["client"].tolist() == PANEL.tolist() * 2


def test_sampled_needs_a_panel_and_only_it_takes_one():
    with pytest.raises(HpcflError, match="'sampled' needs a panel"):
        ResultsWriter("unused.h5", ATTRS, np.ones((1, 1)), clients="sampled")
    with pytest.raises(HpcflError, match="'all' takes no panel"):
        ResultsWriter("unused.h5", ATTRS, np.ones((1, 1)), panel=np.array([0]))


def test_plot_export_and_pandas_say_the_rows_are_a_panels(tmp_path, capsys):
    sampled_run(tmp_path / "run")
    res = load(tmp_path / "run")
    df = res.to_pandas("clients")
    assert sorted(set(df["client"])) == PANEL.tolist()
    out = tmp_path / "c.csv"
    assert cli.main(["export", str(tmp_path / "run"), "--table", "clients", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "note:" in err and "a panel of 20 of 2000 clients only (results.clients = \"sampled\"" in err
    assert len(out.read_text().splitlines()) == 1 + 60
    from hpcfl.analysis.heatmap import client_matrix
    rows, rounds, values, member = client_matrix(res, "steps")
    assert rows.tolist() == PANEL.tolist() and member.all()   # the panel's clients, each in every round
    assert cli.main(["plot", str(tmp_path / "run"), "--kind", "clients", "--out", str(tmp_path / "h.png")]) == 0
    assert cli.main(["report", str(tmp_path / "run"), "--format", "csv"]) == 0
    assert math.isfinite(res.metrics["train_loss"][-1])
