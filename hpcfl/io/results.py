"""The results file ``<out>/results.h5``, written by global rank 0 only.

Layout (every ``/metrics`` and ``/clients`` dataset is 1-D, resizable, and grows by
one row per round or per participating client; the file is flushed after every round)::

    /                      attrs: config (JSON), config_sha256, run_id, versions (JSON: hpcfl,
                                  torch, ...), world_size, devices (JSON list, one per rank),
                                  seed, status ("running" | "finished"), resumed_at_round
    /metrics/round                 int64    round index, 0-based
    /metrics/train_loss            float64  weight-averaged mean local mini-batch loss
    /metrics/test_accuracy         float64  NaN on rounds without evaluation
    /metrics/test_loss             float64  NaN on rounds without evaluation
    /metrics/clients_participating int64    clients that trained and reported
    /metrics/global_train_loss, global_train_accuracy
                                   float64  global model on all clients' training samples
                                            (run.eval_train = true; else NaN)
    /metrics/lr                    float64  client learning rate of the round
    /metrics/tau_eff               float64  effective local steps: FedNova's tau_eff, or the
                                            implicit sum p_i ||a_i||_1 of averaging rules
    /metrics/sim_time              float64  cumulative simulated seconds ([system]; else 0)
    /metrics/time_decide, time_train, time_reduce, time_server, time_eval, time_round
                                   float64  real seconds per phase on rank 0 (decide: weights,
                                            statistics phase, steps)
    /clients/round, /clients/client, /clients/steps      int64  (one row per cohort member)
    /clients/weight, /clients/train_loss                 float64 (normalised weight; 0 and NaN if dropped)
    /clients/anorm                 float64  ||a_i||_1, FedNova's normaliser (= steps for plain SGD)
    /clients/sim_time              float64  simulated arrival time of the client's update
    /clients/dropped               int8     0 reported; 1 unavailable; 2 missed the deadline;
                                            3 late; 4 no steps (hpcfl.system reason codes)
    /metrics/<policy field>, /clients/<policy field>
                                            records a policy declares (FedDisco's discrepancy,
                                            FedGSNR's GSNR, ...), see docs/architecture.md
    /clients_summary/<field>_<stat> float64 (clients,) per-client median or mean over rounds
                                            of fields declared with a summary
    /partition/class_counts        int64 (clients, classes)  training samples per class
    /final/params                  float32 (L,)   final flat model (parameters, then float buffers)
    /final/param_names             str (entries,) "param:<module path>" or "buffer:<path>"
    /final/param_shapes            JSON string attribute ``shapes`` on /final (list of lists)

Every /metrics and /clients dataset carries the attributes ``unit`` and ``description``.

Load a final model into torch: ``hpcfl.results.load(path).state_dict()``.

Reading while a run is going: the writer uses HDF5 SWMR (single writer, multiple
readers), so ``hpcfl.results.load(path)`` (or ``h5py.File(path, "r", swmr=True)``) reads
every flushed round of a running job. After a SIGKILL at most the round in flight is
lost; such a file is still marked "open for write" and opens only with ``swmr=True``
(``hpcfl.results.load`` does that; resuming the run rewrites it cleanly). SWMR needs POSIX write ordering: on NFS or a parallel filesystem without it, set
``[results] locking = false`` and copy the file before reading it mid-run.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import h5py
import numpy as np

from ..algorithms.protocol import Field
from ..errors import HpcflError

F64, I64 = np.float64, np.int64
METRICS = {
    "round": Field(I64, "round", "round index, 0-based"),
    "train_loss": Field(F64, "loss", "weight-averaged mean local mini-batch loss"),
    "test_accuracy": Field(F64, "1", "global model's test accuracy (NaN on rounds without evaluation)"),
    "test_loss": Field(F64, "loss", "global model's mean test loss (NaN on rounds without evaluation)"),
    "clients_participating": Field(I64, "clients", "clients that trained and reported"),
    "global_train_loss": Field(F64, "loss", "global model on all clients' training samples (run.eval_train)"),
    "global_train_accuracy": Field(F64, "1", "global model's accuracy on all training samples (run.eval_train)"),
    "lr": Field(F64, "1", "client learning rate of the round"),
    "tau_eff": Field(F64, "steps", "effective local steps: FedNova's tau_eff, or sum p_i ||a_i||_1"),
    "sim_time": Field(F64, "s", "cumulative simulated time ([system]; else 0)"),
    "time_decide": Field(F64, "s", "real time of the decisions (weights, statistics phase, steps), rank 0"),
    "time_train": Field(F64, "s", "real time of local training, rank 0"),
    "time_reduce": Field(F64, "s", "real time of the reduction, waiting for slower ranks included, rank 0"),
    "time_server": Field(F64, "s", "real time of the server step and broadcasts, rank 0"),
    "time_eval": Field(F64, "s", "real time of evaluation, rank 0"),
    "time_round": Field(F64, "s", "real time of the whole round, rank 0"),
}
CLIENT_FIELDS = {
    "round": Field(I64, "round", "round index, 0-based"),
    "client": Field(I64, "client", "client id"),
    "steps": Field(I64, "steps", "local steps run (after the system model's deadline)"),
    "weight": Field(F64, "1", "normalised aggregation weight (0 if the client did not report)"),
    "train_loss": Field(F64, "loss", "mean local mini-batch loss (NaN if the client did not train)"),
    "anorm": Field(F64, "steps", "||a_i||_1, FedNova's normaliser (= steps for plain SGD)"),
    "sim_time": Field(F64, "s", "simulated arrival time of the client's update"),
    "dropped": Field(np.int8, "code", "0 reported; 1 unavailable; 2 missed the deadline; 3 late; 4 no steps; "
                                      "5 refused by the guard"),
}
SUMMARIES = {"median": np.nanmedian, "mean": np.nanmean}


LOCKING = {"locking": True}   # set by configure(); False on filesystems without file locking


def configure(locking: bool) -> None:
    LOCKING["locking"] = locking


def _open(path, mode, **kw):
    if not LOCKING["locking"]:
        kw["locking"] = False
    return h5py.File(path, mode, **kw)


def _append(ds: h5py.Dataset, values) -> None:
    values = np.asarray(values, dtype=ds.dtype).reshape(-1)
    n = ds.shape[0]
    ds.resize((n + values.size,))
    ds[n:] = values


class ResultsWriter:
    """Creates and appends to ``results.h5`` (use on global rank 0 only).

    Parameters
    ----------
    path : Path
    attrs : dict
        Root attributes; dict and list values are stored as JSON strings.
    class_counts : np.ndarray, shape (clients, classes)
    metric_fields, client_fields : dict of name -> Field, optional
        Records the policies declare, appended to :data:`METRICS` and :data:`CLIENT_FIELDS`.
    """

    def __init__(self, path: Path, attrs: dict, class_counts: np.ndarray, resume_at: int | None = None,
                 metric_fields: dict | None = None, client_fields: dict | None = None):
        self.path = Path(path)
        self.metrics = {**METRICS, **(metric_fields or {})}
        self.client_fields = {**CLIENT_FIELDS, **(client_fields or {})}
        if resume_at is not None:
            self._reopen(resume_at, attrs)
            return
        self.file = _open(self.path, "w", libver="latest")   # SWMR needs the latest format
        for k, v in attrs.items():
            self.file.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        self.file.attrs["status"] = "running"
        for group, fields in (("metrics", self.metrics), ("clients", self.client_fields)):
            g = self.file.create_group(group)
            for name, f in fields.items():
                ds = g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=f.dtype, chunks=(1024,))
                ds.attrs["unit"] = f.unit
                ds.attrs["description"] = f.description
        self.file.create_dataset("partition/class_counts", data=np.asarray(class_counts, dtype=np.int64))
        self.file.swmr_mode = True   # from here on: appends only, readable by SWMR readers
        self.file.flush()

    def _reopen(self, rounds_done: int, attrs: dict) -> None:
        """Continue a run: keep metric and client rows of rounds < ``rounds_done`` only.

        Those later rows were written after the checkpoint the run resumes from; the
        resumed run writes them again, bitwise the same (docs/reliability.md). The file is
        rebuilt, not edited: a writer killed in SWMR mode leaves the file marked "open for
        write", which only SWMR readers accept. So the kept rows are copied into a new
        file under a temporary name that then replaces the old one; a crash during the
        rebuild leaves the old file as it was.
        """
        tmp = self.path.with_name(f".{self.path.name}.resume-tmp")
        with _open(self.path, "r", swmr=True) as old, _open(tmp, "w", libver="latest") as new:
            for k, v in old.attrs.items():
                new.attrs[k] = v
            for group in ("metrics", "clients"):
                keep = old[group]["round"][()] < rounds_done
                g = new.create_group(group)
                for name, ds in old[group].items():
                    new_ds = g.create_dataset(name, data=ds[()][keep], maxshape=(None,), chunks=(1024,))
                    for k, v in ds.attrs.items():
                        new_ds.attrs[k] = v
            new.create_dataset("partition/class_counts", data=old["partition/class_counts"][()])
            for k in ("world_size", "devices", "versions", "run_id"):   # the latest attempt (id: older files)
                if k not in attrs:
                    continue
                v = attrs[k]
                new.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            new.attrs["status"] = "running"
            new.attrs["resumed_at_round"] = rounds_done
        os.replace(tmp, self.path)
        self.file = _open(self.path, "r+", libver="latest")
        self.file.swmr_mode = True
        self.file.flush()

    def append_round(self, metrics: dict, clients: dict) -> None:
        """Append one round: ``metrics`` has a scalar per metric field, ``clients`` an array per client field."""
        missing = (set(self.metrics) - set(metrics)) | (set(self.client_fields) - set(clients))
        if missing:
            raise KeyError(f"round records missing {sorted(missing)}")
        try:
            for name in self.metrics:
                _append(self.file["metrics"][name], [metrics[name]])
            for name in self.client_fields:
                _append(self.file["clients"][name], clients[name])
            self.file.flush()
        except OSError as exc:
            free = shutil.disk_usage(self.path.parent).free
            need = 8 * (len(self.metrics) + len(self.client_fields) * len(clients["client"]))
            raise HpcflError(f"cannot write round {metrics['round']} to {self.path}: {exc}. A round needs about "
                             f"{need} bytes; {free:,} bytes are free there. Free space, then run the same "
                             f"command again to resume from the last checkpoint") from None

    def write_final(self, params: np.ndarray, names: list[str], shapes: list[tuple]) -> None:
        # SWMR allows no new objects or attributes: reopen in normal mode for the last write.
        self.file.close()
        self.file = _open(self.path, "r+", libver="latest")
        g = self.file.require_group("final")
        g.create_dataset("params", data=np.asarray(params, dtype=np.float32))
        g.create_dataset("param_names", data=np.array(names, dtype=h5py.string_dtype()))
        g.attrs["shapes"] = json.dumps([list(s) for s in shapes])
        self._write_summaries()
        self.file.attrs["status"] = "finished"
        self.file.flush()

    def _write_summaries(self) -> None:
        """``/clients_summary/<field>_<stat>`` (N,): a client's statistic over the rounds it took part in.

        For client fields declared with a ``summary`` (e.g. FedGSNR's contribution score,
        the median GSNR over rounds); NaN for clients that never took part.
        """
        n = self.file["partition/class_counts"].shape[0]
        ids = self.file["clients/client"][()]
        for name, f in self.client_fields.items():
            if f.summary is None:
                continue
            values = self.file[f"clients/{name}"][()].astype(np.float64)
            out = np.full(n, np.nan)
            for c in np.unique(ids):
                v = values[ids == c]
                if np.isfinite(v).any():
                    out[c] = SUMMARIES[f.summary](v)
            ds = self.file.require_group("clients_summary").create_dataset(f"{name}_{f.summary}", data=out)
            ds.attrs["unit"] = f.unit
            ds.attrs["description"] = f"{f.summary} over rounds of: {f.description}"

    def close(self) -> None:
        self.file.close()


@dataclass
class Results:
    """Plain-array view of a results file (see module docstring for the layout)."""

    metrics: dict[str, np.ndarray]
    clients: dict[str, np.ndarray]
    config: dict
    attrs: dict
    class_counts: np.ndarray
    final_params: np.ndarray | None = None
    param_names: list[str] = dc_field(default_factory=list)
    param_shapes: list[tuple] = dc_field(default_factory=list)
    summaries: dict[str, np.ndarray] = dc_field(default_factory=dict)

    def state_dict(self) -> dict:
        """The final model as ``{module path: torch.Tensor}`` for ``model.load_state_dict(..., strict=False)``."""
        import torch

        out, offset = {}, 0
        for name, shape in zip(self.param_names, self.param_shapes):
            size = int(np.prod(shape))
            out[name.split(":", 1)[1]] = torch.from_numpy(self.final_params[offset : offset + size].reshape(shape).copy())
            offset += size
        return out


def load(path: str | Path) -> Results:
    """Read a results file (a finished or a running one) into plain numpy arrays.

    ``path`` may be the file or the run's output directory.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.h5"
    with _open(path, "r", swmr=True) as f:
        attrs = {}
        for k, v in f.attrs.items():
            v = v.decode() if isinstance(v, bytes) else v
            if isinstance(v, str) and v[:1] in "[{":
                v = json.loads(v)
            attrs[k] = v.item() if isinstance(v, np.generic) else v
        res = Results(
            metrics={k: f["metrics"][k][()] for k in f["metrics"]},
            clients={k: f["clients"][k][()] for k in f["clients"]},
            config=attrs.get("config", {}),
            attrs=attrs,
            class_counts=f["partition/class_counts"][()],
        )
        if "clients_summary" in f:
            res.summaries = {k: v[()] for k, v in f["clients_summary"].items()}
        if "final" in f:
            res.final_params = f["final/params"][()]
            res.param_names = [s.decode() if isinstance(s, bytes) else s for s in f["final/param_names"][()]]
            res.param_shapes = [tuple(s) for s in json.loads(f["final"].attrs["shapes"])]
    return res


def status(path: Path) -> tuple[str, dict, str | None] | None:
    """(status, config dict, run id) of an existing results file, or None if there is none.

    A file that cannot be read (killed before its first flush) reads as ("unreadable", {},
    None); files of an hpcfl older than run ids have None as their id.
    """
    path = Path(path)
    if not path.exists():
        return None
    try:
        with _open(path, "r", swmr=True) as f:
            rid = f.attrs.get("run_id")
            return (str(f.attrs.get("status", "running")), json.loads(f.attrs.get("config", "{}")),
                    None if rid is None else str(rid))
    except (OSError, ValueError):
        return "unreadable", {}, None


def metric_rows(path: Path) -> list[dict]:
    """The metrics table as a list of per-round dicts (for the closing summary)."""
    with _open(path, "r", swmr=True) as f:
        m = {k: f["metrics"][k][()] for k in f["metrics"]}
    return [{k: v[i].item() for k, v in m.items()} for i in range(len(m["round"]))]
