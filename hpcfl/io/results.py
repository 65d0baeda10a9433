"""The results file ``<out>/results.h5``, written by global rank 0 only: :class:`ResultsWriter`.

The layout is in :mod:`hpcfl.io.schema`, the reader in :mod:`hpcfl.io.reader` (both
re-exported here, where callers have always found them). The last writes (final model, diverged
status, into objects made with the file) are in :mod:`hpcfl.io.results_final`, the HDF5 helpers
in :mod:`hpcfl.io.results_h5`.
Files the writer creates in the run directory are created exclusively (:mod:`hpcfl.io.safefs`),
and every write checks the free space it needs first (docs/reliability.md, "A full disk").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import h5py
import numpy as np

from ..errors import HpcflError
from . import h5check, reader, safefs
from .h5check import BadFile  # noqa: F401  (callers have found it here)
from .panel import PanelFilter
from .reader import Results, diverged_round, load, metric_rows, status  # noqa: F401
from .results_final import LEGACY_COPY, FinalModel, FinalWrites, create_final_records, final_records_bytes  # noqa: F401
from .results_h5 import (LOCKING, _append, _client_eval_group, _column, _copy_client_eval, _describe,  # noqa: F401
                         _FULL_FIX, _open, _segments, _with_margin, configure, copy_rows, fill_rows)
from .schema import (CHUNK, CLIENT_CHOICES, CLIENT_EVAL, CLIENT_FIELDS, F64, I64, METRICS,  # noqa: F401
                     SCHEMA_VERSION, SEGMENT_COLUMNS, SUMMARIES)


def _remove_legacy_copy(path: Path) -> None:
    """Remove the final copy of results.h5 that an hpcfl before schema 3 left when killed in its last
    write (that hpcfl removed it on its next run); a folder or a link there is not ours: left alone."""
    try:
        if path.is_file() and not path.is_symlink():
            path.unlink()
    except OSError:
        pass


class ResultsWriter(FinalWrites):
    """Creates and appends to ``results.h5`` (use on global rank 0 only).

    Parameters
    ----------
    path : Path
    attrs : dict
        Root attributes; dict and list values are stored as JSON strings.
    class_counts : np.ndarray, shape (clients, classes)
    metric_fields, client_fields : dict of name -> Field, optional
        Records the policies declare, appended to :data:`METRICS` and :data:`CLIENT_FIELDS`.
    client_eval : bool
        Keep ``/client_eval`` (per-client evaluation, :meth:`append_client_eval`).
    batch_seconds, batch_rows : float, int
        Rounds are buffered and written together once this many seconds or client rows have gathered
        (see :meth:`append_round`); the defaults (0 s) write every round at once.
    cohort : int
        Client rows a round: ``/clients`` of a cohort of :data:`~hpcfl.io.schema.COMPRESS_FROM` or more
        is chunked by round and compressed (:func:`~hpcfl.io.schema.client_layout`); 0: unknown (small).
    clients : str
        ``results.clients``: "all" (a row per cohort member and round), "sampled" (the rows of the
        cohort members in ``panel`` only) or "none" (``/clients`` stays empty). The file's
        ``clients_recorded`` attribute says which. A resume keeps the file's choice.
    panel : np.ndarray, shape (P,), optional
        With "sampled" (and only then): the panel's client ids (:func:`hpcfl.io.panel.client_panel`),
        stored as ``/clients_panel``; a resume checks that the file holds the same panel.
    model : FinalModel, optional
        The final model's layout: ``/final`` is created with the file and :meth:`write_final` fills it
        (:func:`~hpcfl.io.results_final.create_final_records`); without it the file has no ``/final``.
    """

    @h5check.quiet
    def __init__(self, path: Path, attrs: dict, class_counts: np.ndarray, resume_at: int | None = None,
                 metric_fields: dict | None = None, client_fields: dict | None = None, client_eval: bool = False,
                 batch_seconds: float = 0.0, batch_rows: int = 1 << 20, cohort: int = 0, clients: str = "all",
                 panel: np.ndarray | None = None, model: FinalModel | None = None):
        if clients not in CLIENT_CHOICES:
            raise HpcflError(f"results.clients = {clients!r}: choose one of {', '.join(CLIENT_CHOICES)}")
        if (clients == "sampled") != (panel is not None and len(panel) > 0):
            raise HpcflError(f"results.clients = {clients!r} " + ("needs a panel of clients" if clients == "sampled"
                                                                  else "takes no panel of clients"))
        self.path = Path(path)
        self.cohort, self.clients = int(cohort), clients
        self.panel = PanelFilter(panel) if clients == "sampled" else None
        self.client_eval = client_eval
        self.batch_seconds, self.batch_rows = batch_seconds, batch_rows
        self._pending, self._pending_rows, self._written_at = [], 0, time.monotonic()
        self.model = model
        self.moved_from: Path | None = None   # the path before --out was moved mid-run (FinalWrites)
        self.metrics = {**METRICS, **(metric_fields or {})}
        self.client_fields = {**CLIENT_FIELDS, **(client_fields or {})}
        self.file = None
        _remove_legacy_copy(self.path.with_name(LEGACY_COPY))
        if resume_at is not None:
            self._reopen(resume_at, attrs)
            return
        # Built under a temporary name and renamed into place once flushed: a results.h5 is
        # always a whole hpcfl file, so one that does not read as such is never the run's own.
        tmp = self.path.with_name(f".{self.path.name}.new-tmp")
        # HDF5 meeting a full disk while it creates the file can crash the process when the file is
        # closed after it: check first. What the new file holds at once: headers (the columns' chunks
        # come with the rounds, each checked then), the class counts and the final records made with it.
        made = (128 << 10) + np.asarray(class_counts).size * 8 + final_records_bytes(model, len(class_counts),
                                                                                      self.client_fields)
        safefs.need_space(self.path, _with_margin(made), "the new results file",
                          "Free space (or quota) there, or choose another --out on a filesystem with room")
        try:
            safefs.remove_stale(tmp)
            self.file = _open(tmp, "w-", libver="latest")   # exclusive; SWMR needs the latest format
            for k, v in attrs.items():
                self.file.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
            self.file.attrs["schema_version"] = SCHEMA_VERSION
            self.file.attrs["clients_recorded"] = clients
            if self.panel is not None:
                _panel_dataset(self.file, self.panel.panel)
            for group, fields, rows in (("metrics", self.metrics, 1), ("clients", self.client_fields, self.cohort)):
                g = self.file.create_group(group)
                for name, f in fields.items():
                    _describe(_column(g, name, f.dtype, rows), f.unit, f.description)
            _describe(self.file.create_dataset("partition/class_counts", data=np.asarray(class_counts, dtype=np.int64)),
                      "samples", "training samples of each class held by each client (clients, classes)")
            _segments(self.file, [], attrs, 1)
            if client_eval:
                _client_eval_group(self.file, len(class_counts))
            create_final_records(self.file, model, len(class_counts), self.client_fields, self.metrics)
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
        # the error's first line; its repr when it has no text (`!r` inside the conditional applied to
        # both branches and quoted every message)
        first = str(exc).splitlines()[0] if str(exc) else repr(exc)
        return HpcflError(f"cannot write {what} ({path}): {first}. {fix}")

    @h5check.quiet
    def _reopen(self, rounds_done: int, attrs: dict) -> None:
        """Continue a run: keep metric and client rows of rounds < ``rounds_done`` only.

        Those later rows were written after the checkpoint the run resumes from; the
        resumed run writes them again, bitwise the same (docs/reliability.md). The file is
        rebuilt, not edited: a writer killed in SWMR mode leaves the file marked "open for
        write", which only SWMR readers accept. So the kept rows are copied into a new
        file under a temporary name that then replaces the old one; a crash or a full disk
        during the rebuild leaves the old file as it was and no partial copy. The rebuild
        needs up to the old file's size free beside it: checked first. Columns are copied
        :data:`~hpcfl.io.results_h5.SLAB` rows at a time: memory stays bounded for any file.
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
        except HpcflError:   # a damaged file (BadFile), or another results.clients than the file's
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
        recorded = old.attrs.get("clients_recorded", "all")
        recorded = recorded.decode() if isinstance(recorded, bytes) else str(recorded)
        if recorded != self.clients:
            raise HpcflError(f"{self.path} records results.clients = {recorded!r} and this run asks for "
                             f"{self.clients!r}: a file holds one choice for all its rounds. Resume with --set "
                             f"results.clients={recorded}, or start a new run (another --out, or --force)")
        new.attrs["clients_recorded"] = recorded
        if self.panel is not None:
            self._same_panel(old)
            _panel_dataset(new, self.panel.panel)
        for group in ("metrics", "clients"):
            g = new.create_group(group)
            rows = 1 if group == "metrics" else self.cohort
            cols = {}
            for name, ds in old[group].items():
                cols[name] = _column(g, name, ds.dtype, rows)
                for k, v in ds.attrs.items():
                    cols[name].attrs[k] = v
            # rows are copied slab by slab: an older file counted rounds from 0 (shifted to today's 1-based)
            kept = copy_rows(old[group], cols, lambda r: r < rounds_done + first, {"round": 1} if first == 0 else None)
            if first == 0:
                fields = METRICS if group == "metrics" else CLIENT_FIELDS
                _describe(g["round"], "round", fields["round"].description)
            # a field this version records and the file's writer did not (e.g. /metrics/nova_chi2):
            # its kept rows are unknown, NaN (0 for integers), and the resumed rounds fill it
            for name, f in (self.metrics if group == "metrics" else self.client_fields).items():
                if name not in g:
                    fill = np.nan if np.issubdtype(np.dtype(f.dtype), np.floating) else 0
                    fill_rows(_describe(_column(g, name, f.dtype, rows), f.unit, f.description), kept, fill)
        counts = new.create_dataset("partition/class_counts", data=old["partition/class_counts"][()])
        _describe(counts, "samples", "training samples of each class held by each client (clients, classes)")
        _copy_client_eval(old, new, rounds_done, self.client_eval)
        # segments that started after the checkpoint this run resumes from are undone
        kept = [r for r in reader.read_segments(old, self.path) if r["start_round"] <= rounds_done]
        _segments(new, kept, attrs, rounds_done + 1)
        new.attrs["schema_version"] = SCHEMA_VERSION
        for k in ("world_size", "devices", "versions", "run_id", "plugins"):   # the latest attempt (id: older files)
            if k not in attrs:
                continue
            v = attrs[k]
            new.attrs[k] = json.dumps(v) if isinstance(v, (dict, list)) else v
        new.attrs["resumed_at_round"] = rounds_done
        # status "running" (the old file's /final and summaries are not kept: this run writes them at its end)
        create_final_records(new, self.model, new["partition/class_counts"].shape[0], self.client_fields, self.metrics)

    def _same_panel(self, old: h5py.File) -> None:
        """Refuse to resume a "sampled" file whose panel is not this run's: its rows would mix two panels."""
        ds = old.get("clients_panel")
        held = ds[()] if isinstance(ds, h5py.Dataset) and ds.ndim == 1 and ds.dtype.kind in "iu" else None
        if held is None or not np.array_equal(held, self.panel.panel):
            what = "no readable /clients_panel" if held is None else f"a panel of {len(held)} clients"
            raise HpcflError(f"{self.path} holds {what} and this run's panel (results.client_sample, run.seed) is "
                             f"{len(self.panel.panel)} other clients: a file keeps one panel for all its rounds. "
                             f"Resume with the job's stored results.client_sample and run.seed, or start a new run "
                             f"(another --out, or --force)")

    def append_round(self, metrics: dict, clients: dict) -> None:
        """Add one round: ``metrics`` has a scalar per metric field, ``clients`` an array per client field.

        The round is kept in memory and written with the others buffered since the last write once
        ``batch_rows`` client rows or ``batch_seconds`` seconds (0: every round) have gathered
        (and always by :meth:`sync`, :meth:`write_final`, :meth:`mark_diverged` and :meth:`close`): one
        resize and one write per dataset for the lot, instead of 33 resizes and a flush in every round
        while the other ranks wait at the round's end. A crash loses the buffered rounds only, and they
        come after the newest checkpoint (the run syncs the file before each one), so the resumed run
        writes them again anyway (docs/reliability.md).
        """
        missing = (set(self.metrics) - set(metrics)) | (set(self.client_fields) - set(clients))
        if missing:
            raise KeyError(f"round records missing {sorted(missing)}")
        # copies in the file's dtypes: the caller may reuse its arrays for the next round
        if self.clients == "none":
            rows = {}
        elif self.panel is not None:   # the panel's rows only: the buffer and the writes grow with the panel
            keep = self.panel.rows(clients["client"])
            rows = {name: np.asarray(clients[name]).reshape(-1)[keep].astype(f.dtype)
                    for name, f in self.client_fields.items()}
        else:
            rows = {name: np.array(clients[name], dtype=f.dtype).reshape(-1) for name, f in self.client_fields.items()}
        self._pending.append(({name: metrics[name] for name in self.metrics}, rows))
        self._pending_rows += len(rows.get("client", ()))
        if self._pending_rows >= self.batch_rows or time.monotonic() - self._written_at >= self.batch_seconds:
            self.write_pending()

    @h5check.quiet
    def write_pending(self) -> None:
        """Write the buffered rounds (if any) and flush, so that SWMR readers see them."""
        self._written_at = time.monotonic()
        if not self._pending:
            return
        pending, self._pending, k = self._pending, [], self._pending_rows
        self._pending_rows = 0
        first, last = pending[0][0]["round"], pending[-1][0]["round"]
        what = f"round {first}" if len(pending) == 1 else f"rounds {first}-{last}"
        # HDF5 that meets a full disk mid-write can crash the process later (SIGSEGV in its exit
        # handler), so the space the rounds take, new chunks where a column crosses one, is checked first.
        # Compressed chunks take less than this: the uncompressed size is an upper bound.
        need = 64 << 10   # metadata, with room to spare
        for group, fields, rows in (("metrics", self.metrics, len(pending)), ("clients", self.client_fields, k)):
            n, size = self.file[group]["round"].shape[0], self.file[group]["round"].chunks[0]
            chunks = -(-(n + rows) // size) - -(-n // size)
            need += chunks * size * sum(np.dtype(f.dtype).itemsize for f in fields.values())
        safefs.need_space(self.path, need, what, _FULL_FIX)
        try:
            for name in self.metrics:
                _append(self.file["metrics"][name], [m[name] for m, _ in pending])
            for name in self.client_fields if k else ():   # none with results.clients = "none"
                _append(self.file["clients"][name], np.concatenate([c[name] for _, c in pending]))
            self.file.flush()
        except (OSError, RuntimeError) as exc:   # HDF5 reports some write failures as RuntimeError
            need = 8 * (len(self.metrics) * len(pending) + len(self.client_fields) * k)
            raise self._error(what, self.path, exc, need) from None

    @h5check.quiet
    def sync(self) -> None:
        """Write the buffered rounds, flush and fsync: call before a checkpoint is written, so that
        results.h5 on disk is never behind the newest checkpoint (a node crash keeps both)."""
        self.write_pending()
        try:
            os.fsync(self.file.id.get_vfd_handle())
        except OSError as exc:
            raise self._error("the rounds before the checkpoint", self.path, exc, 0) from None

    @h5check.quiet
    def append_client_eval(self, round_: int, accuracy: np.ndarray, loss: np.ndarray, samples: np.ndarray) -> None:
        """Append one evaluated round of ``/client_eval``: each client's accuracy and loss (N,) on its
        ``samples`` (N,) held-out test rows."""
        n = len(accuracy)
        rows = {"round": np.full(n, round_), "client": np.arange(n), "accuracy": accuracy, "loss": loss,
                "samples": samples}
        size = self.file["client_eval"]["round"].chunks[0]
        safefs.need_space(self.path, (64 << 10) + 40 * max(n, size), f"round {round_}", _FULL_FIX)
        try:
            for name in CLIENT_EVAL:   # flushed with the rounds' batch (write_pending, sync before a checkpoint)
                _append(self.file["client_eval"][name], rows[name])
        except (OSError, RuntimeError) as exc:
            raise self._error(f"round {round_}", self.path, exc, 40 * n) from None

    @h5check.quiet
    def close_after_failure(self) -> None:
        """Close after a failed write; HDF5 may fail to close such a file cleanly (it is then left as
        a killed run's SWMR file: every flushed round reads back). Buffered rounds are dropped."""
        self._pending, self._pending_rows = [], 0
        self._abandon(None)

    @h5check.quiet
    def close(self) -> None:
        """Write the buffered rounds and close the file; if HDF5 cannot (a full disk), close it as after
        a failed write (the rounds not written come after the newest checkpoint) and raise the error."""
        if self.file is not None:
            try:
                self.write_pending()
            except HpcflError:
                self.close_after_failure()
                raise
            try:
                self.file.close()
            except (OSError, RuntimeError):
                h5check.close_failed(self.file)
            self.file = None


def _panel_dataset(f: h5py.File, panel: np.ndarray) -> None:
    """``/clients_panel``: the ids of the clients whose rows ``/clients`` keeps (results.clients = "sampled")."""
    _describe(f.create_dataset("clients_panel", data=np.asarray(panel, dtype=np.int64)), "client",
              "ids of the clients whose rows /clients keeps (results.clients = 'sampled'): a fixed panel drawn "
              "from run.seed; the rows of the other cohort members are not in the file")
