"""What a resume copies into the rebuilt results.h5, the rows of a round, and the HDF5 helpers under
the writer (hpcfl/io/results.py, results_h5.py).

A resume rebuilds the file from the rows it keeps (:meth:`ResultsWriter._reopen`): every kept column
must stay appendable in the same chunks, keep its unit and description, and a column the old file
lacks is filled with "unknown" (NaN, or 0 for integers), not with made-up values. The per-client
evaluation rows of the checkpointed round itself are kept (the resumed run does not evaluate that
round again), the attempt's own attributes replace the old ones one by one, and the status goes back
to "running". The last writes and a failed write's messages: test_results_last_writes.py."""

import calendar
import json
import re
import time

import h5py
import numpy as np
import pytest

from hpcfl.io import results_h5
from hpcfl.io.results import FinalModel, CLIENT_FIELDS, METRICS, ResultsWriter, load
from hpcfl.io.schema import CHUNK, CLIENT_EVAL
from hpcfl.state import Field
from test_results_file import ATTRS, _schema1_file, row

MODEL = FinalModel(["param:w"], [(2,)], "float32")   # /final's layout

COUNTS = np.arange(6, dtype=np.int64).reshape(2, 3)


def _run(path, rounds, client_eval=False, **kw):
    w = ResultsWriter(path, ATTRS, COUNTS, client_eval=client_eval, **kw)
    for r in range(1, rounds + 1):
        w.append_round(*row(r))
        if client_eval:   # two clients evaluated each round
            w.append_client_eval(r, np.array([0.5, 0.25]) + r, np.array([1.0, 2.0]) * r, np.array([3, 4]))
    w.close()


def _assert_appendable(ds):
    assert ds.maxshape == (None,) and ds.chunks == (CHUNK,), (ds.name, ds.maxshape, ds.chunks)

# ---- the rows and columns a resume keeps ---------------------------------------------------------

def test_a_resume_keeps_the_client_eval_rows_of_the_checkpointed_round_and_drops_later_ones(tmp_path):
    path = tmp_path / "results.h5"
    _run(path, 4, client_eval=True)
    w = ResultsWriter(path, ATTRS, None, resume_at=2, client_eval=True)
    with h5py.File(path, "r", swmr=True) as f:
        g = f["client_eval"]
        assert g["round"][()].tolist() == [1, 1, 2, 2]                         # round 2 itself is kept
        assert g["accuracy"][()].tolist() == [1.5, 1.25, 2.5, 2.25]
        for name, fld in CLIENT_EVAL.items():                                  # dtypes, units as written
            assert g[name].dtype == np.dtype(fld.dtype), name
            assert g[name].attrs["unit"] == fld.unit and g[name].attrs["description"] == fld.description
            _assert_appendable(g[name])
    w.append_client_eval(3, np.array([0.75]), np.array([9.0]), np.array([5]))   # the copy takes new rows
    w.close()
    with h5py.File(path, "r") as f:
        assert f["client_eval/round"][()].tolist() == [1, 1, 2, 2, 3]
        assert f["client_eval/accuracy"][()].tolist() == [1.5, 1.25, 2.5, 2.25, 0.75]


def test_a_resume_that_starts_evaluating_clients_gets_an_empty_client_eval_group(tmp_path):
    path = tmp_path / "results.h5"
    _run(path, 3, client_eval=False)
    w = ResultsWriter(path, ATTRS, None, resume_at=2, client_eval=True)
    w.append_client_eval(3, np.array([0.5]), np.array([1.0]), np.array([7]))
    w.close()
    with h5py.File(path, "r") as f:
        assert f["client_eval/round"][()].tolist() == [3] and f["client_eval/samples"][()].tolist() == [7]
    _run(tmp_path / "b.h5", 3)
    ResultsWriter(tmp_path / "b.h5", ATTRS, None, resume_at=2).close()   # not evaluating: no group
    with h5py.File(tmp_path / "b.h5", "r") as f:
        assert "client_eval" not in f


def test_resumed_columns_stay_appendable_with_their_units(tmp_path):
    path = tmp_path / "results.h5"
    _run(path, 3)
    w = ResultsWriter(path, ATTRS, None, resume_at=2)
    w.append_round(*row(3))
    w.close()
    with h5py.File(path, "r") as f:
        for group, fields in (("metrics", METRICS), ("clients", CLIENT_FIELDS)):
            for name, fld in fields.items():
                ds = f[group][name]
                _assert_appendable(ds)
                assert ds.attrs["unit"] == fld.unit and ds.attrs["description"] == fld.description
        counts = f["partition/class_counts"]
        assert counts[()].tolist() == COUNTS.tolist()
        assert counts.attrs["unit"] == "samples"
        assert counts.attrs["description"] == "training samples of each class held by each client (clients, classes)"


def test_a_column_the_old_file_lacks_is_unknown_in_the_kept_rows(tmp_path):
    """A field this version records and the old writer did not: NaN for floats, 0 for integers, in
    the kept rows only, described as declared, and the resumed rounds fill it."""
    path = tmp_path / "results.h5"
    _run(path, 3)
    extra_m = {"gap": Field("float32", "1", "a float metric added later")}
    extra_c = {"hits": Field("int32", "count", "an integer client field added later")}
    w = ResultsWriter(path, ATTRS, None, resume_at=2, metric_fields=extra_m, client_fields=extra_c)
    m, c = row(3)
    w.append_round({**m, "gap": 0.5}, {**c, "hits": np.array([7, 8])})
    w.close()
    with h5py.File(path, "r") as f:
        gap, hits = f["metrics/gap"], f["clients/hits"]
        assert gap.dtype == np.float32 and hits.dtype == np.int32
        assert np.isnan(gap[:2]).all() and gap[2] == 0.5
        assert hits[()].tolist() == [0, 0, 0, 0, 7, 8]
        assert gap.attrs["unit"] == "1" and gap.attrs["description"] == "a float metric added later"
        assert hits.attrs["unit"] == "count" and hits.attrs["description"] == "an integer client field added later"
        _assert_appendable(gap)
        _assert_appendable(hits)


def test_a_schema1_resume_describes_its_shifted_round_column_in_rounds(tmp_path):
    path = tmp_path / "results.h5"
    _schema1_file(path, 3)
    ResultsWriter(path, ATTRS, None, resume_at=2).close()
    with h5py.File(path, "r") as f:
        assert f["metrics/round"].attrs["unit"] == "round" and f["clients/round"].attrs["unit"] == "round"


# ---- the attributes of the attempt ------------------------------------------------------------------

def test_a_resume_takes_each_of_the_attempts_own_attributes_and_keeps_the_others(tmp_path):
    path = tmp_path / "results.h5"
    _run(path, 3)
    with h5py.File(path, "r+") as f:
        f.attrs["run_id"], f.attrs["plugins"] = "old-id", json.dumps(["old"])
    new = {k: v for k, v in ATTRS.items() if k != "world_size"}   # world_size absent: the old one stays
    new.update(devices=["cuda:0", "cuda:1"], versions={"hpcfl": "2"}, run_id="new-id", plugins=["p"])
    ResultsWriter(path, new, None, resume_at=2).close()
    res = load(tmp_path)
    a = res.attrs
    assert a["status"] == "running" and a["resumed_at_round"] == 2
    assert a["world_size"] == 1                                   # not in the attempt's attrs: kept
    assert a["devices"] == ["cuda:0", "cuda:1"] and a["versions"] == {"hpcfl": "2"}
    assert a["run_id"] == "new-id" and a["plugins"] == ["p"]
    with h5py.File(path, "r") as f:                              # lists and dicts as JSON text
        assert json.loads(f.attrs["devices"]) == ["cuda:0", "cuda:1"]


def test_a_resume_of_a_finished_file_is_running_again(tmp_path):
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, COUNTS, model=MODEL)
    for r in (1, 2):
        w.append_round(*row(r))
    w.write_final(np.zeros(2, dtype=np.float32))
    w.close()
    ResultsWriter(path, ATTRS, None, resume_at=1, model=MODEL).close()
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == b"running" and np.isnan(f["final/params"][()]).all()   # to be written again
    assert load(path).final_params is None


# ---- the rows of a round ---------------------------------------------------------------------------

def test_a_round_missing_a_metric_or_a_client_field_is_refused_naming_both(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS)
    m, c = row(1)
    del m["train_loss"]
    with pytest.raises(KeyError, match=r"round records missing \['train_loss'\]"):
        w.append_round(m, c)
    m, c = row(1)
    del m["test_loss"], c["steps"]
    with pytest.raises(KeyError, match=r"round records missing \['steps', 'test_loss'\]"):
        w.append_round(m, c)


def test_client_rows_are_flat_copies_taken_when_the_round_is_added(tmp_path):
    """Column vectors are flattened, and a caller reusing its arrays before the write changes nothing."""
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS, batch_rows=100, batch_seconds=3600)
    m, c = row(1)
    c = {k: np.asarray(v).reshape(-1, 1) for k, v in c.items()}   # (2, 1) each
    w.append_round(m, c)
    for v in c.values():
        v[...] = 99                                                # reused before the batch is written
    w.append_round(*row(2))
    w.close()
    res = load(tmp_path)
    assert res.clients["client"].tolist() == [1, 4, 1, 4] and res.clients["steps"].tolist() == [1, 1, 2, 2]


# ---- the helpers under the writer ------------------------------------------------------------------

def test_the_space_a_copy_needs_is_the_size_plus_two_percent_and_at_least_64_kib():
    assert results_h5._with_margin(0) == 64 << 10
    assert results_h5._with_margin(1000) == 1000 + (64 << 10)
    assert results_h5._with_margin(10_000_049) == 10_000_049 + 200_000           # whole bytes: floor of 2 %
    assert type(results_h5._with_margin(10_000_049)) is int


def test_append_flattens_and_casts_to_the_datasets_dtype(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        ds = f.create_dataset("x", shape=(1,), maxshape=(None,), dtype=np.int64)
        results_h5._append(ds, np.array([[2.0], [3.0]]))            # a column of floats
        assert ds[()].tolist() == [0, 2, 3] and ds.dtype == np.int64


def test_a_segment_without_the_attempts_attributes_records_empty_json_and_utc_time(tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")                  # UTC+14: local time is another date
    time.tzset()
    try:
        with h5py.File(tmp_path / "s.h5", "w") as f:
            results_h5._segments(f, [], {}, 5)
            g = f["segments"]
            seg = {k: g[k][()][0] for k in g}
        assert seg["start_round"] == 5 and seg["world_size"] == 0
        assert seg["devices"] == b"[]" and seg["versions"] == b"{}"
        with h5py.File(tmp_path / "t.h5", "w") as f:
            results_h5._segments(f, [], {"world_size": 3, "devices": ["cpu"] * 3, "versions": {"hpcfl": "9"}}, 1)
            assert f["segments/versions"][0] == b'{"hpcfl": "9"}' and f["segments/world_size"][0] == 3
            assert f["segments/devices"][0] == b'["cpu", "cpu", "cpu"]'
        started = seg["started"].decode()
        # UTC, not the local time (14 hours ahead here), in ISO form with a Z
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z", started), started
        assert abs(calendar.timegm(time.strptime(started, "%Y-%m-%dT%H:%M:%SZ")) - time.time()) < 120
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_a_resume_of_an_old_file_with_other_client_eval_dtypes_writes_the_declared_ones(tmp_path):
    path = tmp_path / "results.h5"
    _run(path, 2, client_eval=True)
    with h5py.File(path, "r+") as f:                                  # an older writer's float32 accuracy
        acc = f["client_eval/accuracy"][()].astype(np.float32)
        del f["client_eval/accuracy"]
        f["client_eval"].create_dataset("accuracy", data=acc, maxshape=(None,), chunks=(CHUNK,))
    ResultsWriter(path, ATTRS, None, resume_at=2, client_eval=True).close()
    with h5py.File(path, "r") as f:
        assert f["client_eval/accuracy"].dtype == np.float64
