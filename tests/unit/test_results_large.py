"""results.h5 for large cohorts: /clients compressed and chunked by round, a resume that copies in
bounded slabs, and ``results.clients = "none"`` (metrics only) read by load, report, plot and export."""

import os

import h5py
import numpy as np
import pytest

from hpcfl import cli
from hpcfl.errors import HpcflError
from hpcfl.io import results_h5
from hpcfl.io.results import FinalModel, CLIENT_FIELDS, METRICS, ResultsWriter, load
from hpcfl.io.schema import CHUNK

MODEL = FinalModel(["param:w"], [(1,)], "float32")   # /final's layout

ATTRS = {"config": {"run": {"name": "big", "seed": 0, "rounds": 3}, "model": {"name": "mlp"},
                    "algorithm": {"name": "fedavg"}},
         "config_sha256": "x", "versions": {"hpcfl": "t"}, "world_size": 1, "devices": ["cpu"], "seed": 0,
         "run_id": "0" * 32}
N = 100_000


def cohort_round(r, n=N, seed=0):
    """Round ``r`` of a cohort of ``n``: what a run records (steps vary, losses are noisy floats)."""
    rng = np.random.default_rng([r, seed])
    steps = rng.integers(5, 50, n)
    m = {k: float(r) for k in METRICS}
    m["round"] = r
    c = {"round": np.full(n, r), "client": np.arange(n), "steps": steps, "weight": np.full(n, 1 / n),
         "train_loss": rng.normal(2.3, 0.1, n), "anorm": steps.astype(float), "anorm2": steps.astype(float),
         "alast": np.ones(n), "sim_time": np.zeros(n), "dropped": (rng.random(n) < 0.01).astype(np.int8)}
    assert set(c) == set(CLIENT_FIELDS)
    return m, c


class Reads:
    """The largest 1-D read from /metrics or /clients while installed (h5py.Dataset.__getitem__ spied)."""

    def __init__(self, monkeypatch):
        self.largest = 0
        real = h5py.Dataset.__getitem__

        def spy(ds, key):
            out = real(ds, key)
            if ds.ndim == 1 and ds.name.split("/")[1] in ("metrics", "clients", "client_eval"):
                self.largest = max(self.largest, int(np.size(out)))
            return out

        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)


def test_a_100k_cohort_is_written_compressed_resumed_in_slabs_and_read(tmp_path, monkeypatch):
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((N, 2), dtype=np.int64), cohort=N)
    for r in (1, 2, 3):
        w.append_round(*cohort_round(r))
    w.close()
    with h5py.File(path, "r") as f:
        ds = f["clients/train_loss"]
        assert ds.chunks == (N,) and ds.compression == "gzip" and ds.shuffle   # a round is one chunk
        assert f["metrics/train_loss"].chunks == (CHUNK,) and f["metrics/train_loss"].compression is None
        stored = sum(f["clients"][k].id.get_storage_size() for k in f["clients"]) / 3
    raw = sum(np.dtype(f.dtype).itemsize for f in CLIENT_FIELDS.values()) * N   # 7.3 MB a round uncompressed
    assert raw == 7_300_000 and stored < raw / 5, stored   # measured 0.93 MB a round (docs/results.md)

    monkeypatch.setattr(results_h5, "SLAB", 30_000)   # slabs smaller than a round: several per column
    reads = Reads(monkeypatch)
    w = ResultsWriter(path, {**ATTRS, "world_size": 2}, None, resume_at=2, cohort=N, model=MODEL)
    assert reads.largest == 30_000   # no column read whole: a round at most, here a slab
    again = cohort_round(3, seed=1)   # the resumed round 3 records other values than the lost one
    w.append_round(*again)
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    monkeypatch.undo()

    res = load(tmp_path)
    assert res.metrics["round"].tolist() == [1, 2, 3] and len(res.clients["round"]) == 3 * N
    for r, (_, c) in zip((1, 2, 3), (cohort_round(1), cohort_round(2), again)):
        for name in CLIENT_FIELDS:
            got = res.clients[name][(r - 1) * N: r * N]
            assert got.dtype == CLIENT_FIELDS[name].dtype and np.array_equal(got, c[name]), (r, name)
    with h5py.File(path, "r") as f:
        assert f["clients/steps"].chunks == (N,) and f["clients/steps"].compression == "gzip"


def test_small_cohorts_keep_uncompressed_chunks_that_appends_fill(tmp_path):
    """A compressed chunk rewritten by the next round's append takes new room in a SWMR file (10 rows a
    round, 1,000 rounds, gzip chunks of 1,024 rows: FIGURE), so small cohorts keep the old layout."""
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((10, 2), dtype=np.int64), cohort=10)
    for r in (1, 2, 3):
        w.append_round(*cohort_round(r, n=10))
    w.close()
    with h5py.File(path, "r") as f:
        for name in CLIENT_FIELDS:
            assert f["clients"][name].chunks == (CHUNK,) and f["clients"][name].compression is None, name
    assert load(tmp_path).clients["steps"].tolist() == [c for r in (1, 2, 3) for c in cohort_round(r, n=10)[1]["steps"]]


def test_an_older_uncompressed_file_resumes_into_the_new_layout(tmp_path):
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((2000, 2), dtype=np.int64))   # cohort unknown: the old layout
    for r in (1, 2, 3):
        w.append_round(*cohort_round(r, n=2000))
    w.close()
    with h5py.File(path, "r+") as f:   # as an hpcfl before results.clients wrote it
        del f.attrs["clients_recorded"]
        assert f["clients/steps"].chunks == (CHUNK,) and f["clients/steps"].compression is None
    w = ResultsWriter(path, ATTRS, None, resume_at=2, cohort=2000)
    w.append_round(*cohort_round(3, n=2000))
    w.close()
    res = load(tmp_path)
    assert res.clients["round"].tolist() == [1] * 2000 + [2] * 2000 + [3] * 2000
    assert np.array_equal(res.clients["train_loss"][:2000], cohort_round(1, n=2000)[1]["train_loss"])
    with h5py.File(path, "r") as f:
        assert f["clients/steps"].chunks == (2000,) and f["clients/steps"].compression == "gzip"
        assert f.attrs["clients_recorded"] == "all"


def none_run(directory, rounds=3):
    directory.mkdir(parents=True, exist_ok=True)
    w = ResultsWriter(directory / "results.h5", ATTRS, np.ones((N, 2), dtype=np.int64), cohort=N, clients="none", model=MODEL)
    for r in range(1, rounds + 1):
        m, c = cohort_round(r)
        m["test_accuracy"] = 0.1 * r
        w.append_round(m, c)
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    return directory


def test_clients_none_keeps_the_metrics_and_no_client_rows(tmp_path, capsys):
    run = none_run(tmp_path / "run")
    counts = 16 * N   # /partition/class_counts: (N, 2) int64
    # 3 rounds of a 100k cohort: metrics only (their chunks, 230 kB), no rows (0.93 MB a round with them)
    assert os.path.getsize(run / "results.h5") < counts + 400_000
    res = load(run)
    assert res.attrs["clients_recorded"] == "none" and res.attrs["status"] == "finished"
    assert res.metrics["round"].tolist() == [1, 2, 3] and res.metrics["test_accuracy"].tolist() == [0.1, 0.2,
                                                                                                      0.30000000000000004]
    assert set(res.clients) == set(CLIENT_FIELDS) and all(len(v) == 0 for v in res.clients.values())
    assert 'results.clients = "none": none kept' in repr(res)
    with pytest.raises(HpcflError, match='kept no per-client rows \\(results.clients = "none"'):
        res.to_pandas("clients")
    assert res.to_pandas()["test_accuracy"].tolist() == [0.1, 0.2, 0.30000000000000004]

    assert cli.main(["report", str(run), "--format", "csv"]) == 0   # report reads metrics only
    assert "0.3" in capsys.readouterr().out
    assert cli.main(["plot", str(run), "--kind", "clients", "--out", str(tmp_path / "h.png")]) == 2
    assert 'kept no per-client rows (results.clients = "none"' in capsys.readouterr().err
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "c.png")]) == 0 and (tmp_path / "c.png").exists()
    assert cli.main(["export", str(run), "--table", "clients", "--out", str(tmp_path / "c.csv")]) == 2
    assert 'results.clients = \\"all\\" for /clients' in capsys.readouterr().err.replace('"', '\\"')
    assert cli.main(["export", str(run), "--out", str(tmp_path / "m.csv")]) == 0
    assert len((tmp_path / "m.csv").read_text().splitlines()) == 4   # header and three rounds


def test_a_resume_keeps_the_files_choice_of_results_clients(tmp_path):
    run = none_run(tmp_path / "run", rounds=2)
    before = (run / "results.h5").read_bytes()
    with pytest.raises(HpcflError, match="records results.clients = 'none' and this run asks for 'all'.*"
                                         "--set results.clients=none"):
        ResultsWriter(run / "results.h5", ATTRS, None, resume_at=1, cohort=N, clients="all")
    assert (run / "results.h5").read_bytes() == before and not list(run.glob(".*tmp"))   # left as it was
    w = ResultsWriter(run / "results.h5", ATTRS, None, resume_at=1, cohort=N, clients="none")
    w.append_round(*cohort_round(2))
    w.close()
    res = load(run)
    assert res.metrics["round"].tolist() == [1, 2] and len(res.clients["round"]) == 0


def test_results_clients_takes_all_sampled_or_none():
    with pytest.raises(HpcflError, match="results.clients = 'some': choose one of all, sampled, none"):
        ResultsWriter("unused.h5", ATTRS, np.ones((1, 1)), clients="some")
    from hpcfl import config
    with pytest.raises(HpcflError, match="some"):
        config.from_dict({"run": {"rounds": 1}, "data": {"dataset": "quadratic"}, "model": {"name": "quadratic"},
                          "results": {"clients": "some"}})


def test_report_and_curves_read_the_metrics_and_not_the_client_rows(tmp_path, monkeypatch, capsys):
    """On a large cohort's file /clients is nearly all of it (36 GB over 5,000 rounds of 100k clients):
    report and plot's curves read /metrics only; plot --kind clients reads /clients when asked."""
    from hpcfl.io import reader
    run = tmp_path / "run"
    run.mkdir()
    w = ResultsWriter(run / "results.h5", ATTRS, np.ones((2000, 2), dtype=np.int64), cohort=2000)
    for r in (1, 2):
        w.append_round(*cohort_round(r, n=2000))
    w.close()
    reads = []
    real = reader._columns
    monkeypatch.setattr(reader, "_columns", lambda f, group, *a: reads.append(group) or real(f, group, *a))
    assert cli.main(["report", str(run), "--format", "csv"]) == 0
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "c.png")]) == 0
    assert reads == ["metrics", "metrics"]
    assert cli.main(["plot", str(run), "--kind", "clients", "--out", str(tmp_path / "h.png")]) == 0
    assert reads == ["metrics", "metrics", "metrics", "clients"] and (tmp_path / "h.png").exists()
