"""Reading results files: :func:`load` (``hpcfl.results.load``), :func:`status` and friends.

A results file may be a live run's, a killed run's, a damaged one or a crafted one. Every
read goes through :mod:`.h5check`: no hang on a truncated file, no external or virtual
storage, no link out of the file, every dataset's rank, type and size checked against the
layout (``hpcfl.io.results``) before it is read. Anything wrong raises
:class:`~hpcfl.io.h5check.BadFile` naming the file and the problem.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import h5py
import numpy as np

from ..errors import HpcflError
from .attrs import _int_attr, _json, job_config, root_attrs  # noqa: F401  (read here by the results' readers)
from .h5check import BadFile, member, open_read, read, superblock
from .schema import CLIENT_EVAL, CLIENT_FIELDS, METRICS
from .summary import summary

SEGMENT_COLUMNS = ("start_round", "world_size", "devices", "versions", "started")
SEGMENT_KINDS = {"start_round": "iu", "world_size": "iu", "devices": "O", "versions": "O", "started": "O"}
EVENT_FIELDS = ("round", "old_tau", "new_tau", "reason")
LOCKING = {"locking": True}   # set by hpcfl.io.results.configure(); False where files cannot be locked


def open_results(path: Path) -> h5py.File:
    return open_read(path, locking=LOCKING["locking"])


def no_client_rows(res) -> str | None:
    """Why ``res`` has no per-client rows when its run kept none (``results.clients = "none"``), else None."""
    if str(res.attrs.get("clients_recorded", "all")) != "none":
        return None
    return (f"{res.source}: this run kept no per-client rows (results.clients = \"none\"; its metrics are all "
            f"there); run it again with results.clients = \"all\" for /clients")


def sampled_rows(res) -> str | None:
    """What ``res``'s per-client rows are when its run kept a panel's only (``results.clients = "sampled"``),
    else None: a sentence for the readers that show or export them."""
    if str(res.attrs.get("clients_recorded", "all")) != "sampled":
        return None
    held = len(res.class_counts) if res.class_counts is not None else "?"
    size = len(res.panel) if res.panel is not None else "?"
    return (f"{res.source}: /clients holds the rows of a panel of {size} of {held} clients only (results.clients = "
            f"\"sampled\"; their ids: .panel, /clients_panel); statistics over its rows are the panel's, not the "
            f"cohort's (the cohort-wide figures are in /metrics)")


@dataclass(repr=False)
class Results:
    """Plain-array view of a results file (see hpcfl.io.schema for the layout)."""

    metrics: dict[str, np.ndarray]
    clients: dict[str, np.ndarray]
    config: dict
    attrs: dict
    class_counts: np.ndarray
    final_params: np.ndarray | None = None
    param_names: list[str] = dc_field(default_factory=list)
    param_shapes: list[tuple] = dc_field(default_factory=list)
    summaries: dict[str, np.ndarray] = dc_field(default_factory=dict)
    events: np.ndarray | None = None   # /controller_events (finished runs of an adaptive-tau policy)
    segments: list[dict] = dc_field(default_factory=list)   # one dict per start or resume
    units: dict = dc_field(default_factory=dict)   # {"metrics": {name: unit}, "clients": {...}}
    input_shape: tuple | None = None
    num_classes: int | None = None
    source: Path | None = None   # the file it was read from
    client_eval: dict[str, np.ndarray] = dc_field(default_factory=dict)   # /client_eval (run.eval_clients)
    panel: np.ndarray | None = None   # /clients_panel: whose rows /clients keeps (results.clients = sampled)
    # How the hpcfl.run call that returned these results ended: "finished", "diverged" (this call's
    # rounds diverged), "already finished" or "already diverged" (nothing to do); None from load().
    outcome: str | None = None

    @property
    def status(self) -> str:
        """The run's status in the file: "running" (or stopped, killed), "finished" or "diverged"."""
        return str(self.attrs.get("status", "running"))

    def __repr__(self) -> str:   # a few lines about the run, not every array (hpcfl.results.summary)
        return summary(self)

    def to_pandas(self, table: str = "metrics"):
        """One table of the run as a pandas DataFrame (needs pandas: ``pip install hpcfl[export]``).

        ``table``: ``"metrics"`` (one row per round, indexed by ``round``), ``"clients"`` (one row
        per cohort member and round) or ``"client_eval"`` (one row per client and evaluated round).
        Each column is the file's array, unchanged::

            from hpcfl.results import load
            df = load("runs/quickstart").to_pandas()
            df[["test_accuracy", "train_loss"]].dropna().tail()
        """
        import pandas as pd

        tables = {"metrics": self.metrics, "clients": self.clients, "client_eval": self.client_eval}
        if table not in tables:
            raise HpcflError(f"table {table!r}: choose one of {', '.join(tables)}")
        if table == "clients" and no_client_rows(self):
            raise HpcflError(no_client_rows(self))
        if not tables[table]:
            raise HpcflError(f"{self.source}: has no /{table} (per-client evaluation is run.eval_clients)")
        df = pd.DataFrame(dict(tables[table]))
        return df.set_index("round") if table == "metrics" else df

    def model(self):
        """The trained model as a torch module in eval mode, in the run's dtype, on the CPU.

        Built from the stored job's model section, one sample's shape and the class count,
        then loaded with the final parameters and buffers: evaluating it on the job's test
        set gives the recorded final test accuracy.
        """
        import torch

        from .. import models
        from ..config import from_dict

        if self.final_params is None:
            raise HpcflError("this run has no final model yet (it is still running, or was stopped); load it "
                             "again once the run has finished")
        if self.input_shape is None:
            raise HpcflError("this results file predates stored input shapes (schema 1); rebuild the model with "
                             "hpcfl.models.build_model(...) and load .state_dict() into it")
        from ..plugins import folders_of

        # a model of your own is looked for where the run imported it from, too (the plugins attribute)
        records = self.attrs.get("plugins")
        cfg = from_dict(self.config, folders_of(records if isinstance(records, dict) else {}))
        module = models.build_model(cfg.model.name, cfg.model_options, self.input_shape, self.num_classes)
        module = module.to(torch.float64 if self.final_params.dtype == np.float64 else torch.float32)
        # every buffer is stored: no model the engine builds has an integer buffer (the zoo drops
        # BatchNorm's num_batches_tracked, a plug-in with one is refused), so nothing may be missing
        missing, unexpected = module.load_state_dict(self.state_dict(), strict=False)
        if unexpected or missing:
            raise HpcflError(f"the stored model does not fit {cfg.model.name}: missing {missing}, unexpected "
                             f"{unexpected}")
        return module.eval()

    def state_dict(self) -> dict:
        """The final model as ``{module path: torch.Tensor}`` for ``model.load_state_dict(..., strict=False)``."""
        import torch

        out, offset = {}, 0
        for name, shape in zip(self.param_names, self.param_shapes):
            size = int(np.prod(shape))
            out[name.split(":", 1)[1]] = torch.from_numpy(self.final_params[offset : offset + size].reshape(shape).copy())
            offset += size
        return out


# --------------------------------------------------------------------------- groups

def _columns(f: h5py.File, group: str, path: Path, kinds: dict, live: bool) -> tuple[dict, dict]:
    """Every dataset of ``/group`` (1-D, numeric), all of one length; and their units.

    Known fields must have their layout's kind; a live or killed writer's file may hold one
    column a round ahead of another, so those are cut to the shortest.
    """
    g = member(f, group, h5py.Group, path)
    data, units = {}, {}
    for name in g:
        ds = member(g, name, h5py.Dataset, path)
        data[name] = read(ds, path, kinds.get(name, "biuf"))
        units[name] = _unit(ds)
    if "round" not in data:
        raise BadFile(f"{path}: /{group}/round is missing")
    lengths = {len(v) for v in data.values()}
    if len(lengths) > 1:
        if not live:
            raise BadFile(f"{path}: the columns of /{group} have different lengths {sorted(lengths)}")
        n = min(lengths)
        data = {k: v[:n] for k, v in data.items()}
    return data, units


class Columns(Mapping):
    """A group of equal-length columns (``/clients``, ``/client_eval``) read from the file when first
    used, then kept: what :func:`hpcfl.run` returns, so that a run's per-client tables, which grow with
    rounds times cohort, are not read unless asked for. Reading checks them as :func:`load` does.

    The names come from the file at once; ``rows`` (their length) too, without reading the data.
    Pickled (every rank of a run receives its results), it carries the path, not the data.
    """

    def __init__(self, path: Path, group: str, kinds: dict, live: bool, names: list, rows: int):
        self.path, self.group, self.kinds, self.live = path, group, kinds, live
        self.names, self.rows = list(names), rows
        self._data = None

    def _load(self) -> dict:
        if self._data is None:
            with open_results(self.path) as f:
                self._data, _ = _columns(f, self.group, self.path, self.kinds, self.live)
        return self._data

    def __getitem__(self, name):
        if name not in self.names:
            raise KeyError(name)
        return self._load()[name]

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None}


def _lazy(f: h5py.File, group: str, path: Path, kinds: dict, live: bool) -> tuple[Columns, dict]:
    """``/group`` as :class:`Columns` (nothing read but names, units and the length of ``round``), and its units."""
    g = member(f, group, h5py.Group, path)
    sets = {name: member(g, name, h5py.Dataset, path) for name in g}
    if "round" not in sets:
        raise BadFile(f"{path}: /{group}/round is missing")
    rows = min(ds.shape[0] if ds.ndim == 1 else 0 for ds in sets.values())   # as _columns cuts a live file's
    return Columns(path, group, kinds, live, list(sets), rows), {name: _unit(ds) for name, ds in sets.items()}


def _unit(ds: h5py.Dataset) -> str:
    try:
        u = ds.attrs.get("unit", "")
    except (OSError, RuntimeError, KeyError, ValueError, TypeError):
        return ""
    return u.decode(errors="replace") if isinstance(u, bytes) else str(u)


def _strings(values) -> list[str]:
    return [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in values]


def read_segments(f: h5py.File, path: Path, attrs: dict | None = None) -> list[dict]:
    """The segment rows of a file; a file older than /segments gives its one known start."""
    if "segments" in f:
        g = member(f, "segments", h5py.Group, path)
        cols = {}
        for k in SEGMENT_COLUMNS:
            col = read(member(g, k, h5py.Dataset, path), path, SEGMENT_KINDS[k])
            cols[k] = _strings(col) if SEGMENT_KINDS[k] == "O" else [int(v) for v in col]
        if len({len(c) for c in cols.values()}) > 1:
            raise BadFile(f"{path}: the columns of /segments have different lengths")
        return [{k: cols[k][i] for k in SEGMENT_COLUMNS} for i in range(len(cols["start_round"]))]
    a = attrs if attrs is not None else root_attrs(f, path)
    dump = (lambda v: v if isinstance(v, str) else json.dumps(v))
    return [{"start_round": int(_int_attr(a, "resumed_at_round", path, 0)) + 1,
             "world_size": int(_int_attr(a, "world_size", path, 0)), "devices": dump(a.get("devices", "[]")),
             "versions": dump(a.get("versions", "{}")), "started": ""}]


def _final(f: h5py.File, path: Path, res: Results) -> None:
    g = member(f, "final", h5py.Group, path)
    params = read(member(g, "params", h5py.Dataset, path), path, "f")
    names = _strings(read(member(g, "param_names", h5py.Dataset, path), path, "O"))
    a = root_attrs(g, path)
    shapes = a.get("shapes")
    if not (isinstance(shapes, list) and len(shapes) == len(names) and
            all(isinstance(s, list) and all(isinstance(d, int) and d >= 0 for d in s) for s in shapes)):
        raise BadFile(f"{path}: /final's shapes attribute does not list one shape per entry of param_names")
    if sum(int(np.prod(s, dtype=np.float64)) for s in shapes) != params.size:
        raise BadFile(f"{path}: /final/params has {params.size} values, its shapes account for another number")
    if any(":" not in n for n in names):
        raise BadFile(f"{path}: /final/param_names holds names without 'param:' or 'buffer:'")
    res.final_params, res.param_names, res.param_shapes = params, names, [tuple(s) for s in shapes]
    if "input_shape" in a:
        shape = a["input_shape"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and d > 0 for d in shape)):
            raise BadFile(f"{path}: /final's input_shape attribute is not a list of positive integers")
        res.input_shape, res.num_classes = tuple(shape), _int_attr(a, "num_classes", path)


def _events(f: h5py.File, path: Path) -> np.ndarray:
    ds = member(f, "controller_events", h5py.Dataset, path)
    fields = ds.dtype.fields or {}
    if tuple(fields) != EVENT_FIELDS or any(fields[k][0].kind not in "iu" for k in EVENT_FIELDS[:3]) \
            or fields["reason"][0].kind != "S":
        raise BadFile(f"{path}: /controller_events is not a table of (round, old_tau, new_tau, reason)")
    return read(ds, path, "V")


# --------------------------------------------------------------------------- entry points

def load(path: str | Path, lazy: bool = False) -> Results:
    """Read a results file (a finished or a running one) into plain numpy arrays.

    ``path`` may be the file or the run's output directory. Raises BadFile (an HpcflError)
    naming the file and the problem for a damaged, truncated or crafted file. ``lazy``: read
    ``/clients`` and ``/client_eval`` only when first used (:class:`Columns`; what
    :func:`hpcfl.run` returns); they are then read from the file as it is at that moment.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.h5"
    live = bool(superblock(path)["flags"] & 0x04)
    with open_results(path) as f:
        attrs = root_attrs(f, path)
        config = job_config(attrs, path)
        kinds = {"metrics": {k: _kind(v.dtype) for k, v in METRICS.items()},
                 "clients": {k: _kind(v.dtype) for k, v in CLIENT_FIELDS.items()}}
        metrics, m_units = _columns(f, "metrics", path, kinds["metrics"], live)
        old = (_int_attr(attrs, "schema_version", path, 1) or 1) < 2   # rounds were 0-based: read as today's
        columns = _lazy if lazy and not old else _columns
        clients, c_units = columns(f, "clients", path, kinds["clients"], live)
        counts = read(member(member(f, "partition", h5py.Group, path), "class_counts", h5py.Dataset, path), path,
                      "iu", ndim=2)
        res = Results(metrics=metrics, clients=clients, config=config, attrs=attrs, class_counts=counts,
                      segments=read_segments(f, path, attrs), units={"metrics": m_units, "clients": c_units},
                      source=path)
        if old:
            res.metrics["round"] = res.metrics["round"] + 1
            res.clients["round"] = res.clients["round"] + 1
        # /final, /clients_summary and /controller_events hold the run's end once status says so: a
        # schema 3 file has them (NaN, empty) from its start, an older one only once finished
        done = str(attrs.get("status", "running")) == "finished"
        if done and "clients_summary" in f:
            g = member(f, "clients_summary", h5py.Group, path)
            res.summaries = {k: read(member(g, k, h5py.Dataset, path), path, "f") for k in g}
        if done and "controller_events" in f:
            res.events = _events(f, path)
        if "clients_panel" in f:
            res.panel = read(member(f, "clients_panel", h5py.Dataset, path), path, "iu")
        if "client_eval" in f:
            res.client_eval, res.units["client_eval"] = columns(
                f, "client_eval", path, {k: _kind(v.dtype) for k, v in CLIENT_EVAL.items()}, live)
        for seg in res.segments:   # decoded as .attrs decodes them (the file keeps JSON text)
            for k in ("devices", "versions"):
                seg[k] = _json(seg[k], path, f"/segments/{k}") if seg[k] else seg[k]
        if done and "final" in f:
            _final(f, path, res)
    return res


def _kind(dtype) -> str:
    return "f" if np.dtype(dtype).kind == "f" else "iu"


def status(path: Path) -> tuple[str, dict, str | None] | None:
    """(status, config dict, run id) of an existing results file, or None if there is none.

    Raises BadFile when the file is damaged or is not an hpcfl results file (no job in it);
    files of an hpcfl older than run ids have None as their id.
    """
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    with open_results(path) as f:
        attrs = root_attrs(f, path)
        config = job_config(attrs, path)
        member(f, "metrics", h5py.Group, path)
    rid = attrs.get("run_id")
    return str(attrs.get("status", "running")), config, None if rid is None else str(rid)


def diverged_round(path: Path) -> int | None:
    """The round (from 1) in which the run of ``path`` diverged, or None."""
    with open_results(Path(path)) as f:
        r = _int_attr(root_attrs(f, Path(path)), "diverged_round", Path(path))
        return None if not r else int(r)   # 0: a schema 3 file that did not diverge


def metric_rows(path: Path) -> list[dict]:
    """The metrics table as a list of per-round dicts (for the closing summary)."""
    path = Path(path)
    live = bool(superblock(path)["flags"] & 0x04)
    with open_results(path) as f:
        m, _ = _columns(f, "metrics", path, {k: _kind(v.dtype) for k, v in METRICS.items()}, live)
    return [{k: v[i].item() for k, v in m.items()} for i in range(len(m["round"]))]
