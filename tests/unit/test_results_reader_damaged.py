"""The reader on a live file, a damaged file and a model of the user's own (hpcfl/io/reader.py):

- a live writer's file (SWMR flag in the superblock) may hold one column a round ahead of another:
  ``load``, ``load(lazy=True)`` and ``metric_rows`` cut every column to the shortest, and the same
  file, closed, is refused; only the SWMR bit (0x04) counts as live, not the write bit (0x01);
- every refusal of a damaged member or attribute starts with the file's path;
- ``Results.model()`` of a plug-in model finds the module where the run imported it from (the file's
  ``plugins`` attribute), and refuses a stored model that lacks a parameter.
"""

import os
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path

import h5py
import numpy as np
import pytest
from test_results_file import ATTRS, row
from test_results_hostile import crafted

from hpcfl.errors import HpcflError
from hpcfl.io import h5check, reader
from hpcfl.io.results import FinalModel, ResultsWriter, load


MODEL = FinalModel(["param:w", "buffer:b"], [(2, 2), (3,)], "float32", (2,), 2)


def _writer(path: Path, rounds=(1, 2, 3), attrs=ATTRS, model=MODEL) -> ResultsWriter:
    w = ResultsWriter(path, attrs, np.ones((2, 3), dtype=np.int64), model=model)
    for r in rounds:
        w.append_round(*row(r))
    return w


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good" / "results.h5"
    path.parent.mkdir()
    w = _writer(path)
    w.write_final(np.arange(7, dtype=np.float32))
    w.close()
    return path


# ---- a live file's columns ------------------------------------------------------------------------------

def test_a_live_files_columns_are_cut_to_the_shortest_and_the_closed_file_is_refused(tmp_path):
    """The writer has one metric a round ahead (4 rows against 3) and one client column a row ahead
    (7 against 6): while it has the file open, every reader cuts to 3 rounds and 6 client rows;
    once closed, the uneven columns are damage and are refused."""
    path = tmp_path / "results.h5"
    w = _writer(path)
    w.file["metrics/train_loss"].resize((4,))
    w.file["metrics/train_loss"][3] = 9.0
    w.file["clients/round"].resize((7,))
    w.file.flush()
    assert h5check.superblock(path)["flags"] & 0x04
    res = load(path)
    assert {len(v) for v in res.metrics.values()} == {3} and res.metrics["train_loss"].tolist() == [1.0, 2.0, 3.0]
    assert {len(v) for v in res.clients.values()} == {6} and res.clients["round"].tolist() == [1, 1, 2, 2, 3, 3]
    assert [r["train_loss"] for r in reader.metric_rows(path)] == [1.0, 2.0, 3.0]
    lazy = load(path, lazy=True).clients
    assert lazy.rows == 6 and lazy["round"].tolist() == [1, 1, 2, 2, 3, 3] and len(lazy["client"]) == 6
    w.close()
    for read in (load, reader.metric_rows):
        with pytest.raises(h5check.BadFile, match=rf"^{path}: the columns of /metrics have different lengths \[3, 4\]$"):
            read(path)


def _old_format_copy(good: Path, tmp_path: Path) -> Path:
    """``good`` copied into a version-0 superblock (no checksum, flags read but not enforced by HDF5),
    with /metrics/train_loss one row longer than the other metrics."""
    old = tmp_path / "old.h5"
    with h5py.File(good, "r") as src, h5py.File(old, "w", libver="earliest") as dst:
        for k in src:
            src.copy(src[k], dst, k)
        for k, v in src.attrs.items():
            dst.attrs[k] = v
        dst["metrics/train_loss"].resize((4,))
    assert h5check.superblock(old)["version"] == 0
    return old


@pytest.mark.parametrize("flags, live", [(0, False), (1, False), (4, True), (5, True)])
def test_only_the_swmr_bit_makes_a_file_live(good, tmp_path, flags, live):
    """Bit 0 (open for write) alone is a writer that never allowed readers in: its uneven columns
    are refused; bit 2 (SWMR write) is a live file, cut to the shortest."""
    path = tmp_path / f"flags{flags}.h5"
    shutil.copyfile(_old_format_copy(good, tmp_path), path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 20, flags)   # a version-0 superblock's consistency flags
    path.write_bytes(bytes(data))
    if live:
        assert len(load(path).metrics["train_loss"]) == 3 and len(reader.metric_rows(path)) == 3
    else:
        for read in (load, reader.metric_rows):
            with pytest.raises(h5check.BadFile, match=f"^{path}: the columns of /metrics have different"):
                read(path)


# ---- damaged members and attributes: the path first ----------------------------------------------------

def _replace_with(name, make):
    def edit(f, t):
        parent, _, leaf = name.rpartition("/")
        del f[name]
        make(f[parent or "/"], leaf)
    return edit


def _dataset(g, name):
    g.create_dataset(name, data=np.zeros(3))


def _group(g, name):
    g.create_group(name)


DAMAGE = {   # name: (edit, reader call, words after the path)
    "final_a_dataset": (_replace_with("final", _dataset), load, ": /final is not a group"),
    "names_a_group": (_replace_with("final/param_names", _group), load, ": /final/param_names is not a dataset"),
    "final_attr_array": (lambda f, t: f["final"].attrs.__setitem__("x", np.zeros(2)), load,
                         ": attribute 'x' is an array"),
    "counts_a_group": (_replace_with("partition/class_counts", _group), load,
                       ": /partition/class_counts is not a dataset"),
    "summary_a_dataset": (lambda f, t: f.create_dataset("clients_summary", data=np.zeros(2)), load,
                          ": /clients_summary is not a group"),
    "schema_text": (lambda f, t: f.attrs.__setitem__("schema_version", "two"), load,
                    ": attribute 'schema_version' = 'two' is not an integer"),
    "clients_lazy": (_replace_with("clients", _dataset), lambda p: load(p, lazy=True), ": /clients is not a group"),
    "status_attr_array": (lambda f, t: f.attrs.__setitem__("x", np.zeros(2)), reader.status,
                          ": attribute 'x' is an array"),
    "status_no_config": (lambda f, t: f.attrs.__delitem__("config"), reader.status,
                         " has no config attribute, so it is not an hpcfl results file"),
    "diverged_attr_array": (lambda f, t: f.attrs.__setitem__("x", np.zeros(2)), reader.diverged_round,
                            ": attribute 'x' is an array"),
    "metric_a_group": (_replace_with("metrics/train_loss", _group), load, ": /metrics/train_loss is not a dataset"),
    "no_round_column": (lambda f, t: f.__delitem__("metrics/round"), load, ": /metrics/round is missing"),
}


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_every_damaged_member_is_refused_naming_the_file_first(good, tmp_path, name):
    edit, call, words = DAMAGE[name]
    path = crafted(good, tmp_path, name, edit)
    with pytest.raises(h5check.BadFile) as info:
        call(path)
    assert str(info.value).startswith(f"{path}{words}"), str(info.value)


# ---- Results.model() ---------------------------------------------------------------------------------

PLUGIN = "from torch import nn\n\n\ndef tiny(input_shape, num_classes):\n" \
         "    return nn.Sequential(nn.Flatten(), nn.Linear(4, num_classes))\n"


@pytest.fixture
def plugin(tmp_path):
    """A plug-in module under a name no test imported before (so sys.modules cannot supply it),
    in a folder not on sys.path; its name, and the job and records a run of it would store."""
    name = f"readernets_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "plug"
    folder.mkdir()
    (folder / f"{name}.py").write_text(PLUGIN)
    config = {"run": {"rounds": 3}, "model": {"name": f"{name}:tiny"}}
    records = {"model.name": {"name": f"{name}:tiny", "file": str(folder / f"{name}.py")}}
    yield name, config, records
    sys.modules.pop(name, None)


def _plugin_run(tmp_path, config, records, names=("param:1.weight", "param:1.bias"), shapes=((3, 4), (3,))):
    path = tmp_path / "out" / "results.h5"
    path.parent.mkdir()
    w = _writer(path, (1,), {**ATTRS, "config": config, "plugins": records},
                FinalModel(list(names), list(shapes), "float32", (4,), 3))
    size = sum(int(np.prod(s)) for s in shapes)
    w.write_final(np.arange(size, dtype=np.float32))
    w.close()
    return load(path)


def test_the_model_of_a_plugin_is_built_from_the_recorded_module(tmp_path, plugin):
    """Not imported, not on sys.path: the module is found through the file's plugins attribute."""
    name, config, records = plugin
    assert name not in sys.modules and str(tmp_path / "plug") not in sys.path
    net = _plugin_run(tmp_path, config, records).model()
    assert type(net).__name__ == "Sequential" and not net.training
    assert net[1].weight.detach().numpy().ravel().tolist() == list(range(12))
    assert net[1].bias.detach().numpy().tolist() == [12.0, 13.0, 14.0]


def test_plugins_that_are_not_a_table_are_not_looked_in(tmp_path, plugin):
    """A plugins attribute that is not a table (a list here) is ignored, so the module is not found:
    the job's own refusal, not a crash on the attribute."""
    name, config, records = plugin
    res = _plugin_run(tmp_path, config, list(records.values()))
    with pytest.raises(HpcflError, match=name):
        res.model()


def test_a_stored_model_that_lacks_a_parameter_is_refused(tmp_path, plugin):
    """Only the weight stored (the bias missing): loading it would leave the bias at its random init."""
    name, config, records = plugin
    res = _plugin_run(tmp_path, config, records, names=("param:1.weight",), shapes=((3, 4),))
    with pytest.raises(HpcflError, match=rf"^the stored model does not fit {name}:tiny: missing \['1.bias'\], "
                                         r"unexpected \[\]$"):
        res.model()


# ---- /client_eval ---------------------------------------------------------------------------------------

def test_per_client_evaluation_reads_back_with_its_units_and_a_live_one_is_cut(tmp_path):
    """/client_eval (run.eval_clients) read back with units, whole or lazily; while the writer has
    it open with one column a row ahead, cut to the shortest like /metrics."""
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((2, 3), dtype=np.int64), client_eval=True)
    w.append_round(*row(1))
    w.append_client_eval(1, np.array([0.5, 0.25]), np.array([1.0, 2.0]), np.array([4, 8]))
    w.file["client_eval/loss"].resize((3,))
    w.file.flush()
    for res in (load(path), load(path, lazy=True)):
        ce = res.client_eval
        assert list(ce["round"]) == [1, 1] and list(ce["client"]) == [0, 1] and len(ce["loss"]) == 2
        assert list(ce["accuracy"]) == [0.5, 0.25] and list(ce["samples"]) == [4, 8]
        assert res.units["client_eval"]["samples"] == "samples" and res.units["client_eval"]["loss"] == "loss"
    w.close()
    with pytest.raises(h5check.BadFile, match=rf"^{path}: the columns of /client_eval have different lengths"):
        load(path)


# ---- /segments -------------------------------------------------------------------------------------------

def _strings_set(name, values):
    def edit(f, t):
        del f[name]
        f.create_dataset(name, data=np.array(values, dtype=object), dtype=h5py.string_dtype())
    return edit


SEGMENT_DAMAGE = {   # name: (edit, words after the path)
    "a_dataset": (_replace_with("segments", _dataset), ": /segments is not a group"),
    "column_a_group": (_replace_with("segments/world_size", _group), ": /segments/world_size is not a dataset"),
    "uneven": (lambda f, t: (f.__delitem__("segments/world_size"),
                             f["segments"].create_dataset("world_size", data=np.array([1, 1]))),
               ": the columns of /segments have different lengths"),
    "devices_not_json": (_strings_set("segments/devices", [b"[cpu"]), ": the /segments/devices attribute is not valid JSON"),
}


@pytest.mark.parametrize("name", sorted(SEGMENT_DAMAGE))
def test_damaged_segments_are_refused_naming_the_file_first(good, tmp_path, name):
    edit, words = SEGMENT_DAMAGE[name]
    path = crafted(good, tmp_path, name, edit)
    with pytest.raises(h5check.BadFile) as info:
        load(path)
    assert str(info.value).startswith(f"{path}{words}"), str(info.value)


def test_segment_text_that_is_empty_or_not_utf8_still_reads(good, tmp_path):
    """An empty devices entry stays empty (not parsed as JSON); bytes that are no UTF-8 in the free
    text column read as U+FFFD instead of failing the whole file."""
    path = crafted(good, tmp_path, "odd", lambda f, t: (_strings_set("segments/devices", [b""])(f, t),
                                                         _strings_set("segments/started", [b"\xff2026"])(f, t)))
    seg, = load(path).segments
    assert seg["devices"] == "" and seg["started"] == "\ufffd2026" and seg["versions"] == {"hpcfl": "t"}


def test_a_file_older_than_segments_gives_its_one_start_from_the_root_attributes(good, tmp_path):
    old = crafted(good, tmp_path, "old", lambda f, t: (f.__delitem__("segments"),
                                                       f.attrs.__setitem__("resumed_at_round", 2)))
    seg, = load(old).segments
    assert seg == {"start_round": 3, "world_size": 1, "devices": ["cpu"], "versions": {"hpcfl": "t"}, "started": ""}
    with h5py.File(old, "r") as f:
        assert reader.read_segments(f, old)[0]["devices"] == '["cpu"]'      # the root attributes read here
    bad = crafted(old, tmp_path, "oldbad", lambda f, t: f.attrs.__setitem__("x", np.zeros(2)))
    with h5py.File(bad, "r") as f, pytest.raises(h5check.BadFile, match=f"^{bad}: attribute 'x' is an array"):
        reader.read_segments(f, bad)
    text = crafted(old, tmp_path, "oldtext", lambda f, t: f.attrs.__setitem__("resumed_at_round", "two"))
    with pytest.raises(h5check.BadFile, match=f"^{text}: attribute 'resumed_at_round' = 'two' is not an integer"):
        load(text)


def test_a_file_older_than_segments_without_its_run_attributes_starts_at_round_1_on_no_known_ranks(good, tmp_path):
    """No resumed_at_round, world_size, devices or versions at the root: one segment from round 1, world
    size 0 (not known), devices "[]" and versions "{}" (JSON text, as the /segments column holds it); a
    world_size that is no integer is refused naming the file."""
    bare = crafted(good, tmp_path, "bare", lambda f, t: (f.__delitem__("segments"), *(
        f.attrs.__delitem__(k) for k in ("world_size", "devices", "versions") if k in f.attrs)))
    with h5py.File(bare, "r") as f:
        assert "resumed_at_round" not in f.attrs
        assert reader.read_segments(f, bare) == [
            {"start_round": 1, "world_size": 0, "devices": "[]", "versions": "{}", "started": ""}]
    text = crafted(bare, tmp_path, "bare_text", lambda f, t: f.attrs.__setitem__("world_size", "two"))
    with h5py.File(text, "r") as f, pytest.raises(
            h5check.BadFile, match=f"^{text}: attribute 'world_size' = 'two' is not an integer$"):
        reader.read_segments(f, text)


# ---- units ---------------------------------------------------------------------------------------------------

def test_units_read_as_text_whatever_their_storage_and_missing_or_unreadable_as_empty(good, tmp_path):
    """A unit attribute stored as bytes is decoded (not "b's'"), bytes that are no UTF-8 read as U+FFFD,
    a column without one has the unit "", and so has one whose attribute cannot be read."""
    def edit(f, t):
        f["metrics/train_loss"].attrs["unit"] = np.bytes_(b"nats")
        f["metrics/test_loss"].attrs["unit"] = np.bytes_(b"n\xffts")
        del f["metrics/test_accuracy"].attrs["unit"]
    path = crafted(good, tmp_path, "units", edit)
    for res in (load(path), load(path, lazy=True)):
        units = res.units["metrics"]
        assert (units["train_loss"], units["test_loss"], units["test_accuracy"]) == ("nats", "n\ufffdts", "")
    class Unreadable:   # HDF5 raises OSError on an attribute message it cannot decode
        class attrs:
            @staticmethod
            def get(name, default=None):
                raise OSError("Unable to read attribute")
    assert reader._unit(Unreadable()) == ""


# HDF5 reads HDF5_USE_FILE_LOCKING once, when the library starts (h5py's import, before any test runs)
LOCKING_OFF_AT_START = os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() in ("FALSE", "0")


@pytest.mark.skipif(LOCKING_OFF_AT_START, reason="HDF5_USE_FILE_LOCKING=FALSE: this process's HDF5 never locks")
def test_a_file_another_process_holds_for_writing_opens_only_where_locking_is_off(tmp_path, monkeypatch):
    """hpcfl.io.results.configure() turns locking off where a file system cannot lock; the reader must pass
    that on: with a writer in another process holding the file, a locking open is refused (EAGAIN) and a
    non-locking one reads it."""
    path = tmp_path / "held.h5"
    code = ("import h5py, sys, time\n"
            f"f = h5py.File({str(path)!r}, 'w'); f.create_dataset('x', data=[1]); f.flush()\n"
            "print('open', flush=True); sys.stdin.read()\n")
    writer = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "open\n"
        monkeypatch.setitem(reader.LOCKING, "locking", True)
        with pytest.raises(h5check.BadFile, match=f"^{path} cannot be opened as HDF5 .*unable to lock file"):
            reader.open_results(path)
        monkeypatch.setitem(reader.LOCKING, "locking", False)
        with reader.open_results(path) as f:
            assert list(f["x"][:]) == [1]
    finally:
        writer.communicate("", timeout=30)
