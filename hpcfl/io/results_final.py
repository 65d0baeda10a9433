"""The last writes to ``results.h5``: :class:`FinalWrites`, part of :class:`hpcfl.io.results.ResultsWriter`.

The final model, ``/clients_summary``, ``/controller_events`` and the status. A SWMR file takes
no new objects or attributes, so every one of them is created with the file, before SWMR mode
(:func:`create_final_records`), and the end of a run only writes values into them: data writes
and one same-size attribute change, in place, whatever the file's size (docs/results.md, "At
the end"; docs/reliability.md, "The end of a run").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from ..errors import HpcflError, WriteError
from . import client_summary, h5check, safefs
from .results_h5 import _FULL_FIX, _describe

# status: a fixed-size string, so that "running" -> "finished" or "diverged" rewrites the bytes of an
# existing attribute (one metadata block) in SWMR mode; a variable-length one would add a heap object
STATUS_DTYPE = np.dtype("S8")
EVENTS_DTYPE = np.dtype([("round", np.int64), ("old_tau", np.int64), ("new_tau", np.int64), ("reason", "S10")])
EVENTS_CHUNK = 256
LEGACY_COPY = "results.h5.final"   # where hpcfl before schema 3 copied the file at the end (left by a kill)


@dataclass(frozen=True)
class FinalModel:
    """What ``/final`` holds, known when the run starts: the entries' names and shapes, the dtype,
    one sample's shape and the class count (what rebuilds the model)."""

    names: list
    shapes: list
    dtype: np.dtype
    input_shape: tuple | None = None
    num_classes: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", np.dtype(self.dtype))   # "float32", torch's name or a numpy dtype

    @property
    def length(self) -> int:
        return int(sum(int(np.prod(s, dtype=np.int64)) for s in self.shapes))


def final_records_bytes(model: FinalModel | None, clients: int, client_fields: dict) -> int:
    """About the bytes :func:`create_final_records` writes: the model (and its names), N values a summary."""
    params = 0 if model is None else model.length * model.dtype.itemsize + 64 * len(model.names)
    return params + 8 * clients * sum(f.summary is not None for f in client_fields.values())


def create_final_records(f: h5py.File, model: FinalModel | None, clients: int, client_fields: dict,
                         metrics: dict) -> None:
    """Create in ``f`` (normal mode, before SWMR) every object and attribute the end of the run fills.

    ``/final/params`` (NaN) with its names and attributes, ``/clients_summary/<field>_<stat>`` (N,)
    (NaN), ``/controller_events`` (empty, resizable) when the steps policy records ``tau_event``,
    and the root attributes ``status`` ("running"), ``diverged`` (false) and ``diverged_round`` (0).
    Readers take ``/final``, ``/clients_summary`` and ``/controller_events`` once status says
    "finished" (:func:`hpcfl.io.reader.load`). Costs the model's and N summary values' bytes.
    """
    f.attrs.create("status", np.bytes_("running"), dtype=STATUS_DTYPE)
    f.attrs["diverged"] = np.False_
    f.attrs["diverged_round"] = np.int64(0)
    if model is not None:
        g = f.create_group("final")
        _describe(g.create_dataset("params", data=np.full(model.length, np.nan, dtype=model.dtype)), "1",
                  "final flat model: parameters, then float buffers, in the order of param_names "
                  "(NaN until status is finished)")
        _describe(g.create_dataset("param_names", data=np.array(model.names, dtype=h5py.string_dtype())), "name",
                  '"param:<module path>" or "buffer:<module path>" of each entry of params')
        g.attrs["shapes"] = json.dumps([[int(d) for d in s] for s in model.shapes])
        if model.input_shape is not None:
            g.attrs["input_shape"] = json.dumps([int(d) for d in model.input_shape])
            g.attrs["num_classes"] = int(model.num_classes)
    for name, fld in client_fields.items():
        if fld.summary is None:
            continue
        ds = f.require_group("clients_summary").create_dataset(f"{name}_{fld.summary}", data=np.full(clients, np.nan))
        _describe(ds, fld.unit, f"{fld.summary} over rounds of: {fld.description}")
    if "tau_event" in metrics:
        _describe(f.create_dataset("controller_events", shape=(0,), maxshape=(None,), chunks=(EVENTS_CHUNK,),
                                   dtype=EVENTS_DTYPE), "round, steps, steps, name",
                  "changes of tau: (round, old_tau, new_tau, reason), reason in stagnation, relax, literal, "
                  "adacomm, saturation, afl; the new tau is used from round + 1")


class FinalWrites:
    """The final and diverged writes of :class:`hpcfl.io.results.ResultsWriter`, which inherits them;
    they use its ``file``, ``path``, ``model``, ``client_fields``, ``write_pending``, ``_abandon``
    and ``_error``."""

    def write_final(self, params) -> None:
        """The final model (flat, in the dtype and length of the :class:`FinalModel` the writer was
        created with), the per-client summaries and the controller events; then status "finished"."""
        params = np.asarray(params)
        model = self.model
        if model is None:
            raise HpcflError(f"{self.path}: this results writer was created without the final model's layout "
                             f"(ResultsWriter(..., model=FinalModel(...))), so /final was not created with the file")
        if params.shape != (model.length,) or params.dtype != model.dtype:
            raise HpcflError(f"{self.path}: the final model is {params.dtype} {params.shape}, and /final/params was "
                             f"created for {model.dtype} ({model.length},)")
        self.write_pending()
        self._follow_the_file()
        summaries = self._summaries()            # read first: a failure below leaves nothing half-changed
        events = self._events_table()
        rows = 0 if events is None else len(events)
        need = (64 << 10) + (EVENTS_CHUNK + rows) * EVENTS_DTYPE.itemsize   # params and summaries exist

        def write():
            self.file["final/params"][:] = params
            for name, values in summaries.items():
                self.file[f"clients_summary/{name}"][:] = values
            if events is not None and len(events):
                ds = self.file["controller_events"]
                ds.resize((len(events),))
                ds[:] = events
            return {"status": np.bytes_("finished")}

        self._in_place("the final results", write, need)

    def mark_diverged(self, round_: int) -> None:
        """The run ended because round ``round_`` (from 1) made the model NaN or Inf: say so
        in the file (status "diverged", ``diverged``, ``diverged_round``); the rounds before stay."""
        self.write_pending()
        self._follow_the_file()
        self._in_place("the diverged status", lambda: {"diverged": np.True_, "diverged_round": np.int64(round_),
                                                        "status": np.bytes_("diverged")}, 0)

    @h5check.quiet
    def _in_place(self, what: str, write, need: int) -> None:
        """Run ``write`` (data writes into objects made with the file; returns the root attributes to
        change), flush and fsync, then change those attributes, status last, and flush and fsync again.
        ``need``: the free space checked first (0: none; the writes take no new room).

        Everything stays in SWMR mode, as the rounds' appends do: a kill at any moment leaves the file
        a killed SWMR writer's, every round readable. Until the second flush the status on disk says
        "running", so a kill before it leaves a run that resumes and writes the end again; the
        status change rewrites one existing fixed-size attribute. A failed write (a full disk)
        closes the file as after a failed round (status "running", every flushed round there).
        """
        try:
            if need:
                safefs.need_space(self.path, need, what, _FULL_FIX)
            attrs = write()
            self.file.flush()
            os.fsync(self.file.id.get_vfd_handle())
            for name, value in attrs.items():   # status is the last key: the other attributes come first
                self.file.attrs.modify(name, value)
            self.file.flush()
            os.fsync(self.file.id.get_vfd_handle())
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            self._abandon(None)
            raise self._error(what, self.path, exc, need) from None

    def _follow_the_file(self) -> None:
        """Point :attr:`path` at the file this writer holds open, wherever it is now.

        ``--out`` may be moved (or replaced by another folder) while the run writes: the open
        file moved with its folder, and the last writes go to it, as checkpoints follow their
        folder (docs/reliability.md); :attr:`moved_from` keeps the old path. A file deleted
        meanwhile is a WriteError. Where the open file's path cannot be read (no /proc), the
        path stays as it was.
        """
        try:
            real = os.readlink(f"/proc/self/fd/{self.file.id.get_vfd_handle()}")
        except (OSError, ValueError, RuntimeError, TypeError, AttributeError):
            return
        if real.endswith(" (deleted)"):
            self._abandon(None)
            raise WriteError(f"{self.path} was deleted while the run was writing it: the rounds written there are "
                             f"lost, and the checkpoints are not (pass --force to start over, or restore the file "
                             f"and run the same command again)")
        if os.path.realpath(self.path) != real:
            self.moved_from, self.path = self.path, Path(real)

    def _summaries(self) -> dict:
        """``<field>_<stat>`` -> (N,): a client's statistic over the rounds it took part in.

        For client fields declared with a ``summary`` (e.g. FedGSNR's contribution score,
        the median GSNR over rounds); NaN for clients that never took part.
        """
        n = self.file["partition/class_counts"].shape[0]
        out, ids = {}, None
        for name, f in self.client_fields.items():
            if f.summary is None:
                continue
            ids = self.file["clients/client"][()] if ids is None else ids
            out[f"{name}_{f.summary}"] = client_summary.per_client(ids, self.file[f"clients/{name}"][()], n,
                                                                   f.summary)   # linear in rows
        return out

    def _events_table(self) -> np.ndarray | None:
        """``/controller_events``' rows: one per change of tau by an adaptive-tau steps policy
        (GIFT, AdaComm, AFL), rebuilt from ``/metrics/tau_event`` so that it holds after resumes."""
        if "tau_event" not in self.file["metrics"]:
            return None
        from ..algorithms.gift import events_table
        m = self.file["metrics"]
        return events_table(*(m[k][()] for k in ("round", "tau_used", "tau_next", "tau_event"))).astype(EVENTS_DTYPE)
