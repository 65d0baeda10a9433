"""A run's results.h5 takes the cohort's layout and ``results.clients`` from the job: /clients of a
2,000-client cohort chunked by round and compressed, kept so on resume; "none" keeps the metrics only,
and a resume cannot switch it (tests/unit/test_results_large.py covers 100k-row rounds)."""

import h5py
import pytest

import hpcfl
from hpcfl.errors import HpcflError

JOB = {"run": {"name": "cohort", "seed": 0, "rounds": 2, "eval_every": 1},
       "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2000,
                "quadratic": {"num_clients": 2000, "dim": 2, "std": 0.1}},
       "model": {"name": "quadratic"},
       "algorithm": {"name": "fedavg", "lr": 0.05, "batch_size": 1},
       "runtime": {"dtype": "float64", "threads": 1, "progress": "none", "vectorize": "on"},
       "checkpoint": {"every": 1}}


def test_the_cohorts_layout_and_results_clients_come_from_the_job(tmp_path):
    out = tmp_path / "all"
    hpcfl.run(JOB, out=out)
    res = hpcfl.run(JOB, out=out, overrides={"run.rounds": 3})   # resumed: the file is rebuilt, same layout
    assert res.clients["round"].tolist() == [1] * 2000 + [2] * 2000 + [3] * 2000
    with h5py.File(out / "results.h5", "r") as f:
        assert f["clients/steps"].chunks == (2000,) and f["clients/steps"].compression == "gzip"
        assert f.attrs["clients_recorded"] == "all"
    with pytest.raises(HpcflError, match='differs in results.clients "all" -> "none"'):
        hpcfl.run(JOB, out=out, overrides={"run.rounds": 4, "results.clients": "none"})

    res = hpcfl.run(JOB, out=tmp_path / "none", overrides={"results.clients": "none"})
    assert res.metrics["round"].tolist() == [1, 2] and res.metrics["clients_participating"].tolist() == [2000, 2000]
    assert len(res.clients["round"]) == 0 and res.attrs["clients_recorded"] == "none"
