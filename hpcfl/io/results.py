"""The results file ``<out>/results.h5``, written by global rank 0 only.

Layout (every ``/metrics`` and ``/clients`` dataset is 1-D, resizable, and grows by
one row per round or per participating client; the file is flushed after every round)::

    /                      attrs: schema_version (2), config (JSON), config_sha256, run_id,
                                  versions (JSON: hpcfl, torch, ...), world_size, devices (JSON
                                  list, one per rank) of the latest segment, seed, status
                                  ("running" | "finished" | "diverged"), resumed_at_round;
                                  a diverged run also has diverged (true) and diverged_round
    /metrics/round                 int64    round number, 1-based: row r holds round r, measured
                                            after r rounds (the console's "round r/R")
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
    /metrics/nova_tau_eff, nova_chi2, nova_slowdown, nova_A, nova_B, nova_C
                                   float64  FedNova's diagnostics of the round's local work, for
                                            every algorithm (hpcfl.algorithms.nova_diag); NaN if
                                            nobody reported
    /metrics/sim_time              float64  cumulative simulated seconds ([system]; else 0)
    /metrics/sim_time_round        float64  simulated seconds of the round ([system]; else 0)
    /metrics/time_decide, time_train, time_reduce, time_server, time_eval, time_round
                                   float64  real seconds per phase on rank 0 (decide: weights,
                                            statistics phase, steps)
    /clients/round, /clients/client, /clients/steps      int64  (one row per cohort member;
                                                                round 1-based as above)
    /clients/weight, /clients/train_loss                 float64 (normalised weight; 0 and NaN if dropped)
    /clients/anorm                 float64  ||a_i||_1, FedNova's normaliser (= steps for plain SGD)
    /clients/anorm2, alast         float64  ||a_i||_2^2 and the last coefficient a_{i,-1}
    /clients/sim_time              float64  simulated arrival time of the client's update
    /clients/dropped               int8     0 reported; 1 unavailable; 2 missed the deadline;
                                            3 late; 4 no steps (hpcfl.system reason codes)
    /metrics/<policy field>, /clients/<policy field>
                                            records a policy declares (FedDisco's discrepancy,
                                            FedGSNR's GSNR, ...), see docs/architecture.md
    /controller_events             (round, old_tau, new_tau, reason) rows of the changes of tau
                                   by GIFT, AdaComm or AFL (written when the run finishes)
    /clients_summary/<field>_<stat> float64 (clients,) per-client median or mean over rounds
                                            of fields declared with a summary
    /segments/<column>             one row per start or resume of the run: start_round (int64,
                                   the first round it ran, 1-based), world_size (int64), devices
                                   and versions (JSON strings), started (UTC time string)
    /partition/class_counts        int64 (clients, classes)  training samples per class
    /final/params                  run dtype (L,) final flat model (parameters, then float buffers)
    /final/param_names             str (entries,) "param:<module path>" or "buffer:<path>"
    /final attrs                   shapes (JSON list of lists), input_shape (JSON list, one
                                   sample's shape), num_classes: what rebuilds the model

Every dataset carries the attributes ``unit`` and ``description``.

Rebuild the trained model: ``hpcfl.results.load(path).model()`` (a torch module in eval
mode); its weights alone: ``.state_dict()``.

Reading: the file of a run that finished, or was stopped by a signal or the guard, opens
with plain ``h5py.File(path)``. While a run is going, the writer holds it in HDF5 SWMR mode (single
writer, multiple readers), so ``hpcfl.results.load(path)`` or ``h5py.File(path, "r",
swmr=True)`` reads every flushed round. After a SIGKILL at most the round in flight is
lost; such a file (or one of a crashed run) is still marked "open for write" and opens only
with ``swmr=True`` (or the reader) until the run resumes and rewrites it cleanly. SWMR is kept on purpose: a
non-SWMR HDF5 file killed while open cannot be opened at all (docs/results.md). SWMR needs POSIX write ordering: on NFS or a parallel filesystem without it, set
``[results] locking = false`` and copy the file before reading it mid-run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from ..algorithms.protocol import Field
from ..errors import HpcflError
from . import reader, safefs
from . import h5check
from .h5check import BadFile
# The reader lives in hpcfl/io/reader.py; re-exported here, where callers have always found it.
from .reader import Results, diverged_round, load, metric_rows, status  # noqa: F401

F64, I64 = np.float64, np.int64
METRICS = {
    "round": Field(I64, "round", "round number, 1-based (row r: after r rounds)"),
    "train_loss": Field(F64, "loss", "weight-averaged mean local mini-batch loss"),
    "test_accuracy": Field(F64, "1", "global model's test accuracy (NaN on rounds without evaluation)"),
    "test_loss": Field(F64, "loss", "global model's mean test loss (NaN on rounds without evaluation)"),
    "clients_participating": Field(I64, "clients", "clients that trained and reported"),
    "global_train_loss": Field(F64, "loss", "global model on all clients' training samples (run.eval_train)"),
    "global_train_accuracy": Field(F64, "1", "global model's accuracy on all training samples (run.eval_train)"),
    "lr": Field(F64, "1", "client learning rate of the round"),
    "tau_eff": Field(F64, "steps", "effective local steps: FedNova's tau_eff, or sum p_i ||a_i||_1"),
    # FedNova's diagnostics (Wang et al. 2020, Eqs. 5-6, 9-10) over the clients R that reported, p normalised
    # over R and w_i = p_i ||a_i||_1 / nova_tau_eff: what averaging the raw updates weighs, whatever the rule.
    "nova_tau_eff": Field(F64, "steps", "implicit effective steps of averaging, sum_R p_i ||a_i||_1 (p normalised)"),
    "nova_chi2": Field(F64, "1", "chi^2 divergence sum_R (p_i - w_i)^2 / w_i of p from the implicit weights "
                                 "w_i = p_i ||a_i||_1 / nova_tau_eff (Theorem 2)"),
    "nova_slowdown": Field(F64, "1", "tau_bar / nova_tau_eff, tau_bar = mean tau_i over R (Theorem 1)"),
    "nova_A": Field(F64, "1", "Theorem 1's A = m nova_tau_eff sum_R w_i^2 ||a_i||_2^2 / ||a_i||_1^2, m = |R|"),
    "nova_B": Field(F64, "steps", "Theorem 1's B = sum_R w_i (||a_i||_2^2 - a_{i,-1}^2)"),
    "nova_C": Field(F64, "steps^2", "Theorem 1's C = max_R (||a_i||_1^2 - ||a_i||_1 a_{i,-1})"),
    "sim_time": Field(F64, "s", "cumulative simulated time ([system]; else 0)"),
    "sim_time_round": Field(F64, "s", "simulated length of this round ([system]; else 0)"),
    "time_decide": Field(F64, "s", "real time of the decisions (weights, statistics phase, steps), rank 0"),
    "time_train": Field(F64, "s", "real time of local training, rank 0"),
    "time_reduce": Field(F64, "s", "real time of the reduction, waiting for slower ranks included, rank 0"),
    "time_server": Field(F64, "s", "real time of the server step and broadcasts, rank 0"),
    "time_eval": Field(F64, "s", "real time of evaluation, rank 0"),
    "time_round": Field(F64, "s", "real time of the whole round, rank 0"),
}
CLIENT_FIELDS = {
    "round": Field(I64, "round", "round number, 1-based"),
    "client": Field(I64, "client", "client id"),
    "steps": Field(I64, "steps", "local steps run (after the system model's deadline)"),
    "weight": Field(F64, "1", "normalised aggregation weight (0 if the client did not report)"),
    "train_loss": Field(F64, "loss", "mean local mini-batch loss (NaN if the client did not train)"),
    "anorm": Field(F64, "steps", "||a_i||_1, FedNova's normaliser (= steps for plain SGD)"),
    "anorm2": Field(F64, "steps", "||a_i||_2^2 of the gradient coefficients (= steps for plain SGD; 0 if the "
                                  "client did not report)"),
    "alast": Field(F64, "1", "a_{i,-1}, the last gradient's coefficient (1 without in-round lr decay; 0 if the "
                             "client did not report)"),
    "sim_time": Field(F64, "s", "simulated arrival time of the client's update"),
    "dropped": Field(np.int8, "code", "0 reported; 1 unavailable; 2 missed the deadline; 3 late; 4 no steps; "
                                      "5 refused by the guard"),
}
SUMMARIES = {"median": np.nanmedian, "mean": np.nanmean}
# 2: rounds 1-based, /segments, /final in the run's dtype with the model's input shape.
# Files without the attribute are version 1 (rounds 0-based); the reader converts them.
SCHEMA_VERSION = 2
SEGMENT_COLUMNS = {   # name -> (dtype, unit, description)
    "start_round": (I64, "round", "first round this segment ran (1-based)"),
    "world_size": (I64, "ranks", "MPI ranks of this segment"),
    "devices": (h5py.string_dtype(), "JSON", "device of each rank"),
    "versions": (h5py.string_dtype(), "JSON", "hpcfl, torch, numpy, mpi4py, h5py and MPI versions"),
    "started": (h5py.string_dtype(), "UTC", "wall-clock start of the segment"),
}


LOCKING = {"locking": True}   # set by configure(); False on filesystems without file locking


def configure(locking: bool) -> None:
    LOCKING["locking"] = reader.LOCKING["locking"] = locking


def _open(path, mode, **kw):
    if not LOCKING["locking"]:
        kw["locking"] = False
    return h5py.File(path, mode, **kw)


_FULL_FIX = ("Free space (or quota) there, then run the same command again to resume from the last checkpoint "
             "(results.h5 and the checkpoints were left as they were)")


def _with_margin(nbytes: int) -> int:
    """Bytes to have free for a copy of ``nbytes``: HDF5 adds metadata and rounds up to blocks."""
    return nbytes + max(64 << 10, nbytes // 50)


def _describe(ds, unit: str, description: str):
    ds.attrs["unit"], ds.attrs["description"] = unit, description
    return ds


def _append(ds: h5py.Dataset, values) -> None:
    values = np.asarray(values, dtype=ds.dtype).reshape(-1)
    n = ds.shape[0]
    ds.resize((n + values.size,))
    ds[n:] = values


def _segments(f: h5py.File, rows: list[dict], attrs: dict, start_round: int) -> None:
    """Create ``/segments`` holding ``rows`` plus this start (from ``attrs``) at ``start_round``."""
    import time

    now = {"start_round": start_round, "world_size": attrs.get("world_size", 0),
           "devices": json.dumps(attrs.get("devices", [])), "versions": json.dumps(attrs.get("versions", {})),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = rows + [now]
    g = f.create_group("segments")
    for name, (dtype, unit, description) in SEGMENT_COLUMNS.items():
        _describe(g.create_dataset(name, data=np.array([r[name] for r in rows], dtype=dtype)), unit, description)


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

    @h5check.quiet
    def __init__(self, path: Path, attrs: dict, class_counts: np.ndarray, resume_at: int | None = None,
                 metric_fields: dict | None = None, client_fields: dict | None = None):
        self.path = Path(path)
        self._final = self.path.with_name(self.path.name + ".final")   # see _normal_mode
        self.metrics = {**METRICS, **(metric_fields or {})}
        self.client_fields = {**CLIENT_FIELDS, **(client_fields or {})}
        self.file = None
        safefs.remove_stale(self._final)   # a copy a kill left behind
        if resume_at is not None:
            self._reopen(resume_at, attrs)
            return
        # Built under a temporary name and renamed into place once flushed: a results.h5 is
        # always a whole hpcfl file, so one that does not read as such is never the run's own.
        tmp = self.path.with_name(f".{self.path.name}.new-tmp")
        try:
            safefs.remove_stale(tmp)
            self.file = _open(tmp, "w-", libver="latest")   # exclusive; SWMR needs the latest format
            for k, v in attrs.items():
                self.file.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            self.file.attrs["status"] = "running"
            self.file.attrs["schema_version"] = SCHEMA_VERSION
            for group, fields in (("metrics", self.metrics), ("clients", self.client_fields)):
                g = self.file.create_group(group)
                for name, f in fields.items():
                    ds = g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=f.dtype, chunks=(1024,))
                    _describe(ds, f.unit, f.description)
            _describe(self.file.create_dataset("partition/class_counts", data=np.asarray(class_counts, dtype=np.int64)),
                      "samples", "training samples of each class held by each client (clients, classes)")
            _segments(self.file, [], attrs, 1)
            self.file.swmr_mode = True   # from here on: appends only, readable by SWMR readers
            self.file.flush()
            os.fsync(self.file.id.get_vfd_handle())
            os.replace(tmp, self.path)
        except (OSError, RuntimeError, ValueError) as exc:
            self._abandon(tmp)
            raise self._error("the new results file", tmp, exc, 1 << 20) from None

    def _abandon(self, partial: Path | None) -> None:
        """After a failed write: close what is open (HDF5 may fail to), remove the partial file."""
        if self.file is not None:
            h5check.close_failed(self.file)
            self.file = None
        if partial is not None:
            safefs.discard(partial)

    def _error(self, what: str, path: Path, exc: BaseException, need: int) -> HpcflError:
        """The user's message for a failed write: disk full (how much is needed) or another I/O error."""
        fix = _FULL_FIX
        if safefs.is_full(exc):
            reason = os.strerror(exc.errno) if isinstance(exc, OSError) and exc.errno else str(exc).splitlines()[0]
            return safefs.DiskFull(safefs.full_message(what, self.path, need, fix, reason))
        if isinstance(exc, HpcflError):
            return exc
        return HpcflError(f"cannot write {what} ({path}): {str(exc).splitlines()[0] if str(exc) else exc!r}. {fix}")

    @h5check.quiet
    def _reopen(self, rounds_done: int, attrs: dict) -> None:
        """Continue a run: keep metric and client rows of rounds < ``rounds_done`` only.

        Those later rows were written after the checkpoint the run resumes from; the
        resumed run writes them again, bitwise the same (docs/reliability.md). The file is
        rebuilt, not edited: a writer killed in SWMR mode leaves the file marked "open for
        write", which only SWMR readers accept. So the kept rows are copied into a new
        file under a temporary name that then replaces the old one; a crash or a full disk
        during the rebuild leaves the old file as it was and no partial copy. The rebuild
        needs up to the old file's size free beside it: checked first.
        """
        tmp = self.path.with_name(f".{self.path.name}.resume-tmp")
        safefs.need_space(self.path, _with_margin(os.path.getsize(self.path)), "the resumed results file",
                          "Resuming rebuilds results.h5 beside the old one. " + _FULL_FIX)
        try:
            safefs.remove_stale(tmp)
            with reader.open_results(self.path) as old, _open(tmp, "w-", libver="latest") as new:
                self._copy_kept(old, new, rounds_done, attrs)
            safefs.fsync(tmp)
            os.replace(tmp, self.path)
        except BadFile:
            safefs.discard(tmp)
            raise
        except (OSError, RuntimeError, ValueError, KeyError) as exc:
            safefs.discard(tmp)
            raise self._error("the resumed results file", tmp, exc, os.path.getsize(self.path)) from None
        self.file = _open(self.path, "r+", libver="latest")
        self.file.swmr_mode = True
        self.file.flush()

    def _copy_kept(self, old: h5py.File, new: h5py.File, rounds_done: int, attrs: dict) -> None:
        """Copy ``old``'s rows of rounds up to ``rounds_done`` and its other records into ``new``."""
        for k, v in old.attrs.items():
            new.attrs[k] = v
        first = 0 if old.attrs.get("schema_version", 1) < 2 else 1   # the first round's number
        for group in ("metrics", "clients"):
            keep = old[group]["round"][()] < rounds_done + first
            g = new.create_group(group)
            for name, ds in old[group].items():
                new_ds = g.create_dataset(name, data=ds[()][keep], maxshape=(None,), chunks=(1024,))
                for k, v in ds.attrs.items():
                    new_ds.attrs[k] = v
            # a field this version records and the file's writer did not (e.g. /metrics/nova_chi2):
            # its kept rows are unknown, NaN (0 for integers), and the resumed rounds fill it
            for name, f in (self.metrics if group == "metrics" else self.client_fields).items():
                if name not in g:
                    fill = np.nan if np.issubdtype(np.dtype(f.dtype), np.floating) else 0
                    data = np.full(int(keep.sum()), fill, dtype=f.dtype)
                    _describe(g.create_dataset(name, data=data, maxshape=(None,), chunks=(1024,)),
                              f.unit, f.description)
        if old.attrs.get("schema_version", 1) < 2:   # an older file counted rounds from 0
            for group, fields in (("metrics", METRICS), ("clients", CLIENT_FIELDS)):
                new[group]["round"][...] = new[group]["round"][()] + 1
                _describe(new[group]["round"], "round", fields["round"].description)
        counts = new.create_dataset("partition/class_counts", data=old["partition/class_counts"][()])
        _describe(counts, "samples", "training samples of each class held by each client (clients, classes)")
        # segments that started after the checkpoint this run resumes from are undone
        kept = [r for r in reader.read_segments(old, self.path) if r["start_round"] <= rounds_done]
        _segments(new, kept, attrs, rounds_done + 1)
        new.attrs["schema_version"] = SCHEMA_VERSION
        for k in ("world_size", "devices", "versions", "run_id"):   # the latest attempt (id: older files)
            if k not in attrs:
                continue
            v = attrs[k]
            new.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        new.attrs["status"] = "running"
        new.attrs["resumed_at_round"] = rounds_done

    @h5check.quiet
    def append_round(self, metrics: dict, clients: dict) -> None:
        """Append one round: ``metrics`` has a scalar per metric field, ``clients`` an array per client field."""
        missing = (set(self.metrics) - set(metrics)) | (set(self.client_fields) - set(clients))
        if missing:
            raise KeyError(f"round records missing {sorted(missing)}")
        # HDF5 that meets a full disk mid-write can crash the process later (SIGSEGV in its exit
        # handler), so the space a round may take, a new chunk per column, is checked first.
        need = sum(1024 * np.dtype(f.dtype).itemsize for f in (*self.metrics.values(), *self.client_fields.values()))
        safefs.need_space(self.path, need + (64 << 10), f"round {metrics['round']}", _FULL_FIX)
        try:
            for name in self.metrics:
                _append(self.file["metrics"][name], [metrics[name]])
            for name in self.client_fields:
                _append(self.file["clients"][name], clients[name])
            self.file.flush()
        except (OSError, RuntimeError) as exc:   # HDF5 reports some write failures as RuntimeError
            need = 8 * (len(self.metrics) + len(self.client_fields) * len(clients["client"]))
            raise self._error(f"round {metrics['round']}", self.path, exc, need) from None

    def write_final(self, params: np.ndarray, names: list[str], shapes: list[tuple],
                    input_shape: tuple | None = None, num_classes: int | None = None) -> None:
        """The final model (in its own dtype) and what rebuilds it: one sample's shape, classes."""
        params = np.asarray(params)

        def write():
            g = self.file.require_group("final")
            _describe(g.create_dataset("params", data=params), "1",
                      "final flat model: parameters, then float buffers, in the order of param_names")
            _describe(g.create_dataset("param_names", data=np.array(names, dtype=h5py.string_dtype())), "name",
                      '"param:<module path>" or "buffer:<module path>" of each entry of params')
            g.attrs["shapes"] = json.dumps([list(s) for s in shapes])
            if input_shape is not None:
                g.attrs["input_shape"] = json.dumps([int(d) for d in input_shape])
                g.attrs["num_classes"] = int(num_classes)
            self._write_summaries()
            self._write_events()
            self.file.attrs["status"] = "finished"

        self._in_normal_mode("the final results", write, params.nbytes + 64 * len(names))

    def mark_diverged(self, round_: int) -> None:
        """The run ended because round ``round_`` (from 1) made the model NaN or Inf: say so
        in the file (status "diverged", ``diverged``, ``diverged_round``); the rounds before stay."""
        def write():
            self.file.attrs["status"] = "diverged"
            self.file.attrs["diverged"] = True
            self.file.attrs["diverged_round"] = int(round_)

        self._in_normal_mode("the diverged status", write, 0)

    @h5check.quiet
    def _in_normal_mode(self, what: str, write, extra: int) -> None:
        """Run ``write`` on a normal-mode copy of the file, then rename the copy over it.

        SWMR allows no new objects or attributes, so the last writes go to a copy in normal
        mode. A file killed while open in normal mode cannot be opened again at all (HDF5's
        consistency flags; h5py has no h5clear), while a SWMR file killed mid-write still can.
        So the file is closed cleanly, copied, the copy written, and renamed over it: a kill
        at any moment leaves one of two readable files. The copy needs the file's size again
        (plus ``extra`` bytes) free: checked first. A failed write (disk full) removes the
        copy and leaves results.h5 as it was, closed, with every round in it.
        """
        self.file.close()
        self.file = None
        need = _with_margin(os.path.getsize(self.path) + extra)
        fix = "The final write copies results.h5 once. " + _FULL_FIX
        try:
            safefs.need_space(self.path, need, what, fix)
            safefs.copy(self.path, self._final)
            self.file = _open(self._final, "r+", libver="latest")
            write()
            self._commit_normal_mode()
        except (OSError, RuntimeError, ValueError) as exc:
            self._abandon(self._final)
            raise self._error(what, self._final, exc, need) from None
        except BaseException:
            self._abandon(self._final)
            raise

    def _commit_normal_mode(self) -> None:
        self.file.flush()
        self.file.close()
        self.file = None
        safefs.fsync(self._final)
        os.replace(self._final, self.path)

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

    def _write_events(self) -> None:
        """``/controller_events``: one row per change of tau by an adaptive-tau steps policy
        (GIFT, AdaComm, AFL), rebuilt from ``/metrics/tau_event`` so that it holds after resumes."""
        if "tau_event" not in self.file["metrics"]:
            return
        from ..algorithms.gift import events_table
        m = self.file["metrics"]
        table = events_table(*(m[k][()] for k in ("round", "tau_used", "tau_next", "tau_event")))
        _describe(self.file.create_dataset("controller_events", data=table), "round, steps, steps, name",
                  "changes of tau: (round, old_tau, new_tau, reason), reason in stagnation, relax, literal, "
                  "adacomm, saturation, afl; the new tau is used from round + 1")

    @h5check.quiet
    def close_after_failure(self) -> None:
        """Close after a failed write; HDF5 may fail to close such a file cleanly (it is then left as
        a killed run's SWMR file: every flushed round reads back)."""
        self._abandon(None)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None
