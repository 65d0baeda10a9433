"""The last writes to ``results.h5``: :class:`FinalWrites`, part of :class:`hpcfl.io.results.ResultsWriter`.

The final model and what rebuilds it, ``/clients_summary``, ``/controller_events`` and the
diverged status. SWMR allows no new objects or attributes, so these writes go to a normal-mode
copy of the file that is then renamed over it (:meth:`FinalWrites._in_normal_mode`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from ..errors import WriteError
from . import client_summary, h5check, safefs
from .results_h5 import _FULL_FIX, _describe, _open, _with_margin


class FinalWrites:
    """The final and diverged writes of :class:`hpcfl.io.results.ResultsWriter`, which inherits them;
    they use its ``file``, ``path``, ``_final``, ``client_fields``, ``write_pending``, ``_abandon``
    and ``_error``."""

    def write_final(self, params: np.ndarray, names: list[str], shapes: list[tuple],
                    input_shape: tuple | None = None, num_classes: int | None = None) -> None:
        """The final model (in its own dtype) and what rebuilds it: one sample's shape, classes."""
        params = np.asarray(params)
        self.write_pending()

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
        self.write_pending()

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
        self._follow_the_file()
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

    def _follow_the_file(self) -> None:
        """Point :attr:`path` at the file this writer holds open, wherever it is now.

        ``--out`` may be moved (or replaced by another folder) while the run writes: the open
        file moved with its folder, so the last writes go there, as checkpoints follow their
        folder (docs/reliability.md); :attr:`moved_from` keeps the old path. A file deleted
        meanwhile is a WriteError. Where the open file's path cannot be read (no /proc), the
        path stays as it was.
        """
        try:
            real = os.readlink(f"/proc/self/fd/{self.file.id.get_vfd_handle()}")
        except (OSError, ValueError, RuntimeError, TypeError, AttributeError):
            return
        if real.endswith(" (deleted)"):
            raise WriteError(f"{self.path} was deleted while the run was writing it: the rounds written there are "
                             f"lost, and the checkpoints are not (pass --force to start over, or restore the file "
                             f"and run the same command again)")
        if os.path.realpath(self.path) != real:
            self.moved_from, self.path = self.path, Path(real)
            self._final = self.path.with_name(self.path.name + ".final")

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
            out = client_summary.per_client(ids, self.file[f"clients/{name}"][()], n, f.summary)   # linear in rows
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
