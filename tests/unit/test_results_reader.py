"""hpcfl.results' reader beyond the round tables (hpcfl/io/reader.py): the trained model and its
state dict, the status and diverged-round probes, the closing summary's rows, the lazy per-client
columns, and the checks of /final and /controller_events, each refusal naming the file."""

import pickle
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

import hpcfl
from hpcfl.errors import HpcflError
from hpcfl.io import h5check, reader
from hpcfl.io.reader import Results
from hpcfl.io.results import FinalModel, ResultsWriter, load
from hpcfl.state import Field
from test_results_file import ATTRS, _schema1_file, row
from test_results_hostile import crafted

MODEL = FinalModel(["param:w", "buffer:b"], [(2, 2), (3,)], "float32", (2,), 2)   # /final's layout
MODEL2 = FinalModel(["param:w"], [(1,)], "float32")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished 2-round run of the digits MLP (7 clients), through hpcfl.run."""
    out = tmp_path_factory.mktemp("run") / "out"
    hpcfl.run(job(**{"run.rounds": 2}), out=out)
    return out


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good" / "results.h5"
    path.parent.mkdir()
    w = ResultsWriter(path, {**ATTRS, "run_id": "abc"}, np.ones((2, 3), dtype=np.int64), model=MODEL)
    for r in (1, 2, 3):
        w.append_round(*row(r))
    w.write_final(np.arange(7, dtype=np.float32))
    w.close()
    return path


# ---- the model ----------------------------------------------------------------------------------------

def test_the_model_is_the_final_parameters_in_eval_mode_and_the_runs_dtype(run):
    import torch

    res = load(run)
    net = res.model()
    assert not net.training
    assert all(p.dtype == torch.float32 for p in net.parameters())
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    assert flat.tobytes() == res.final_params.tobytes()


def test_a_float64_run_gives_a_float64_model(tmp_path):
    import torch

    res = hpcfl.run(job(**{"run.rounds": 1, "runtime.dtype": "float64"}), out=tmp_path / "o")
    net = load(tmp_path / "o").model()
    assert res.final_params.dtype == np.float64 and all(p.dtype == torch.float64 for p in net.parameters())


def test_a_model_is_refused_before_the_end_for_old_files_and_when_it_does_not_fit(run):
    res = load(run)
    res.final_params = None
    with pytest.raises(HpcflError, match=r"^this run has no final model yet \(it is still running, or was "
                                         r"stopped\); load it again once the run has finished$"):
        res.model()
    res = load(run)
    res.input_shape = None
    with pytest.raises(HpcflError, match=r"^this results file predates stored input shapes \(schema 1\); rebuild "
                                         r"the model with hpcfl\.models\.build_model\(\.\.\.\) and load "
                                         r"\.state_dict\(\) into it$"):
        res.model()
    res = load(run)
    res.param_names = [n.replace("param:", "param:x") for n in res.param_names]   # names the model lacks
    with pytest.raises(HpcflError, match=r"^the stored model does not fit mlp: missing \[.+\], unexpected \[.+\]$"):
        res.model()


def test_state_dict_cuts_the_flat_vector_by_the_shapes_in_order():
    res = Results(metrics={}, clients={}, config={}, attrs={}, class_counts=np.zeros((1, 1)),
                  final_params=np.arange(7, dtype=np.float32), param_names=["param:w", "buffer:b:c"],
                  param_shapes=[(2, 2), (3,)])
    sd = res.state_dict()
    assert list(sd) == ["w", "b:c"]                   # only the "param:"/"buffer:" prefix is cut
    assert sd["w"].tolist() == [[0, 1], [2, 3]] and sd["b:c"].tolist() == [4, 5, 6]


# ---- probes -----------------------------------------------------------------------------------------------

def test_status_gives_the_status_the_job_and_the_run_id(good, tmp_path):
    st, cfg, rid = reader.status(good)
    assert (st, rid) == ("finished", "abc") and cfg == ATTRS["config"]
    assert reader.status(tmp_path / "none.h5") is None
    old = crafted(good, tmp_path, "old", lambda f, t: (f.attrs.__delitem__("run_id"), f.attrs.__delitem__("status")))
    assert reader.status(old) == ("running", ATTRS["config"], None)   # no status yet: running; no id: None
    link = tmp_path / "dangling.h5"
    link.symlink_to(tmp_path / "nowhere.h5")
    with pytest.raises(h5check.BadFile, match=str(link)):        # a link is never "no file"
        reader.status(link)
    no_metrics = crafted(good, tmp_path, "nometrics", lambda f, t: f.__delitem__("metrics"))
    with pytest.raises(h5check.BadFile, match=f"^{no_metrics}"):
        reader.status(no_metrics)


def test_diverged_round_and_the_summary_rows(good, tmp_path):
    assert reader.diverged_round(good) is None
    d = crafted(good, tmp_path, "div", lambda f, t: f.attrs.__setitem__("diverged_round", np.int64(4)))
    assert reader.diverged_round(d) == 4 and type(reader.diverged_round(d)) is int
    bad = crafted(good, tmp_path, "badround", lambda f, t: f.attrs.__setitem__("diverged_round", "x"))
    with pytest.raises(h5check.BadFile, match=str(bad)):
        reader.diverged_round(bad)
    rows = reader.metric_rows(good)
    assert [r["round"] for r in rows] == [1, 2, 3] and rows[1]["train_loss"] == 2.0
    assert all(type(v) in (int, float) for r in rows for v in r.values())


# ---- the lazy per-client columns ----------------------------------------------------------------------

def test_lazy_columns_read_once_and_pickle_without_their_data(good):
    res = load(good, lazy=True)
    cols = res.clients
    assert isinstance(cols, reader.Columns) and cols.rows == 6 and cols._data is None
    assert cols["client"].tolist() == [1, 4] * 3
    assert cols._data is not None
    with pytest.raises(KeyError):
        cols["nothing"]
    again = pickle.loads(pickle.dumps(cols))
    assert again._data is None and again.live is False and again["round"].tolist() == [1, 1, 2, 2, 3, 3]


def test_a_lazy_table_with_a_column_that_is_not_one_dimensional_has_no_rows(good, tmp_path):
    def two_d(f, t):
        del f["clients/train_loss"]
        f["clients"].create_dataset("train_loss", data=np.zeros((6, 2)))
    path = crafted(good, tmp_path, "twod", two_d)
    cols = load(path, lazy=True).clients
    assert cols.rows == 0
    with pytest.raises(h5check.BadFile, match=f"^{path}.*dimension"):
        cols["train_loss"]


def test_a_lazy_load_names_the_file_of_a_bad_member(good, tmp_path):
    path = crafted(good, tmp_path, "lazygroup", lambda f, t: f["clients"].__setitem__("x", h5py.SoftLink("/metrics")))
    with pytest.raises(h5check.BadFile, match=f"^{path}.*SoftLink"):
        load(path, lazy=True)
    path = crafted(good, tmp_path, "noround", lambda f, t: f.__delitem__("clients/round"))
    with pytest.raises(h5check.BadFile, match=f"^{path}: /clients/round is missing$"):
        load(path, lazy=True)


# ---- /final -----------------------------------------------------------------------------------------------

def _final_attr(name, value):
    return lambda f, t: f["final"].attrs.__setitem__(name, value)


def _final_set(name, data):
    def edit(f, t):
        del f["final"][name]
        f["final"].create_dataset(name, data=data)
    return edit


FINAL = {   # name: (edit, the message after the path)
    "zero_dim_is_fine": (lambda f, t: (_final_attr("shapes", "[[2, 2], [3], [0]]")(f, t), _final_set(
        "param_names", np.array(["param:w", "buffer:b", "param:e"], dtype=h5py.string_dtype()))(f, t)), None),
    "negative_dim": (_final_attr("shapes", "[[2, 2], [-3]]"), "shapes attribute does not list one shape"),
    "shape_not_list": (_final_attr("shapes", "[[2, 2], 3]"), "shapes attribute does not list one shape"),
    "float_dim": (_final_attr("shapes", "[[2, 2], [3.0]]"), "shapes attribute does not list one shape"),
    "shapes_not_list": (_final_attr("shapes", '{"a": 1}'), "shapes attribute does not list one shape"),
    "one_shape_short": (_final_attr("shapes", "[[2, 2]]"), "shapes attribute does not list one shape"),
    "sizes_differ": (_final_attr("shapes", "[[2, 2], [4]]"), "/final/params has 7 values"),
    # 2**62 * 4 wraps to 0 in int64: counted in float64, the shapes cannot pass for 7 values
    "overflowing_shape": (_final_attr("shapes", f"[[{2**62}, 4], [7]]"), "/final/params has 7 values"),
    "no_prefix": (_final_set("param_names", np.array(["param:w", "b"], dtype=h5py.string_dtype())),
                  "/final/param_names holds names without"),
    "params_strings": (_final_set("params", np.array(["a"] * 7, dtype=h5py.string_dtype())), "expected floats"),
    "names_numbers": (_final_set("param_names", np.arange(2)), "param_names"),
    "params_a_group": (lambda f, t: (f["final"].__delitem__("params"), f["final"].create_group("params")),
                       "is not a dataset"),
    "input_zero": (_final_attr("input_shape", "[2, 0]"), "input_shape attribute is not a list of positive"),
    "input_text": (_final_attr("input_shape", '"2"'), "input_shape attribute is not a list of positive"),
    "input_float": (_final_attr("input_shape", "[2.5]"), "input_shape attribute is not a list of positive"),
    "classes_text": (_final_attr("num_classes", "many"), "num_classes"),
}


@pytest.mark.parametrize("name", sorted(FINAL))
def test_final_is_checked_and_every_refusal_names_the_file(good, tmp_path, name):
    edit, words = FINAL[name]
    path = crafted(good, tmp_path, name, edit)
    if words is None:
        res = load(path)
        assert res.param_shapes == [(2, 2), (3,), (0,)]
        return
    with pytest.raises(h5check.BadFile) as info:
        load(path)
    assert str(info.value).startswith(f"{path}") and words in str(info.value), str(info.value)


def test_a_good_final_group_reads_back(good):
    res = load(good)
    assert res.final_params.tolist() == list(range(7)) and res.param_names == ["param:w", "buffer:b"]
    assert res.param_shapes == [(2, 2), (3,)] and res.input_shape == (2,) and res.num_classes == 2


# ---- /controller_events --------------------------------------------------------------------------------

def _events(dtype):
    def edit(f, t):
        f.create_dataset("controller_events", data=np.zeros(2, dtype=dtype))
    return edit


EVENTS_OK = [("round", "i8"), ("old_tau", "i8"), ("new_tau", "u4"), ("reason", "S16")]


def test_a_table_of_events_reads_back(good, tmp_path):
    def edit(f, t):
        data = np.array([(3, 8, 4, b"uptick"), (7, 4, 2, b"uptick")], dtype=EVENTS_OK)
        f.create_dataset("controller_events", data=data)
    res = load(crafted(good, tmp_path, "events", edit))
    assert res.events["round"].tolist() == [3, 7] and res.events["reason"].tolist() == [b"uptick"] * 2


@pytest.mark.parametrize("dtype", [
    [("round", "f8"), ("old_tau", "i8"), ("new_tau", "i8"), ("reason", "S16")],    # a float round
    [("round", "i8"), ("old_tau", "i8"), ("new_tau", "f4"), ("reason", "S16")],    # a float tau
    [("round", "i8"), ("old_tau", "i8"), ("new_tau", "i8"), ("reason", "i8")],     # a number for the reason
    [("round", "i8"), ("old_tau", "i8"), ("new_tau", "i8"), ("why", "S16")],       # another name
], ids=["float_round", "float_tau", "int_reason", "renamed"])
def test_events_of_another_layout_are_refused_naming_the_file(good, tmp_path, dtype):
    path = crafted(good, tmp_path, "ev", _events(dtype))
    with pytest.raises(h5check.BadFile, match=rf"^{path}: /controller_events is not a table of \(round, "
                                              rf"old_tau, new_tau, reason\)$"):
        load(path)


def test_events_that_are_not_a_dataset_are_refused_naming_the_file(good, tmp_path):
    path = crafted(good, tmp_path, "evgroup", lambda f, t: f.create_group("controller_events"))
    with pytest.raises(h5check.BadFile, match=f"^{path}.*is not a dataset"):
        load(path)


def test_a_copy_of_the_file_elsewhere_is_read_from_its_own_path(good, tmp_path):
    other = tmp_path / "moved" / "results.h5"
    other.parent.mkdir()
    shutil.copyfile(good, other)
    res = load(other.parent)
    assert res.source == other


# ---- the rest of a loaded file ---------------------------------------------------------------------------

def test_units_class_counts_and_per_client_summaries_read_back(tmp_path):
    counts = np.arange(15, dtype=np.int64).reshape(5, 3)
    score = {"score": Field(np.float64, "1", "a per-client score", summary="mean")}
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, counts, client_fields=score, model=MODEL2)
    for r in (1, 2):
        m, c = row(r)
        w.append_round(m, {**c, "score": np.array([r, 2.0 * r])})
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    res = load(tmp_path)
    assert res.class_counts.tolist() == counts.tolist()
    assert res.units["metrics"]["train_loss"] == "loss" and res.units["clients"]["steps"] == "steps"
    assert list(res.summaries) == ["score_mean"]
    assert np.array_equal(res.summaries["score_mean"], [np.nan, 1.5, np.nan, np.nan, 3.0], equal_nan=True)
    assert isinstance(res.clients, dict) and not isinstance(res.clients, reader.Columns)   # not lazy: arrays


@pytest.mark.parametrize("edit, words", [
    (lambda f, t: f["clients_summary"].create_group("bad"), "is not a dataset"),
    (lambda f, t: f["clients_summary"].create_dataset("bad", data=np.array(["a"], dtype=h5py.string_dtype())),
     "expected floats"),
    (lambda f, t: (f.__delitem__("partition"), f.create_dataset("partition", data=np.zeros(2))), "is not a group"),
    (lambda f, t: (f["partition"].__delitem__("class_counts"),
                   f["partition"].create_dataset("class_counts", data=np.zeros((2, 3)))), "expected integers"),
], ids=["summary_group", "summary_strings", "partition_dataset", "counts_floats"])
def test_bad_summaries_and_counts_are_refused_naming_the_file(tmp_path, edit, words):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((5, 3), dtype=np.int64),
                      client_fields={"s": Field(np.float64, "1", "s", summary="median")}, model=MODEL2)
    m, c = row(1)
    w.append_round(m, {**c, "s": np.zeros(2)})
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    path = crafted(tmp_path / "results.h5", tmp_path, "bad", edit)
    with pytest.raises(h5check.BadFile) as info:
        load(path)
    assert str(info.value).startswith(str(path)) and words in str(info.value), str(info.value)


def test_an_old_file_reads_its_client_rounds_from_1_even_when_asked_lazily(tmp_path):
    _schema1_file(tmp_path / "results.h5", 2)               # rows of rounds 0, 1
    for lazy in (False, True):
        res = load(tmp_path, lazy=lazy)
        assert isinstance(res.clients, dict)                 # converted: read at once
        assert res.clients["round"].tolist() == [1, 1, 2, 2] and res.metrics["round"].tolist() == [1, 2]


def test_to_pandas_names_the_tables_it_has(good):
    with pytest.raises(HpcflError, match=r"^table 'nope': choose one of metrics, clients, client_eval$"):
        load(good).to_pandas("nope")
    with pytest.raises(HpcflError, match=rf"^{good}: has no /client_eval \(per-client evaluation is "
                                         rf"run\.eval_clients\)$"):
        load(good).to_pandas("client_eval")


def test_a_lazy_column_that_is_not_there_is_a_key_error_naming_it(good):
    with pytest.raises(KeyError, match="nothing"):
        load(good, lazy=True).clients["nothing"]
    assert list(load(good, lazy=True).clients) == list(load(good).clients)
