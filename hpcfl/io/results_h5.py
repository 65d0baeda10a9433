"""The HDF5 helpers that :class:`hpcfl.io.results.ResultsWriter` builds ``results.h5`` with.

Opening a file with the file-locking choice (:func:`configure`, re-exported by
:mod:`hpcfl.io.results`), the free space a copy of the file needs, the fix a full disk's message
names, dataset descriptions and appends, and the ``/segments`` and ``/client_eval`` groups
(with a resume's copy of the ``/client_eval`` rows it keeps).
"""

from __future__ import annotations

import json
import time

import h5py
import numpy as np

from . import reader
from .schema import CLIENT_EVAL, SEGMENT_COLUMNS, client_layout

SLAB = 1 << 20   # rows a resume reads and writes at a time: a column of any length in bounded memory

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
    now = {"start_round": start_round, "world_size": attrs.get("world_size", 0),
           "devices": json.dumps(attrs.get("devices", [])), "versions": json.dumps(attrs.get("versions", {})),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    rows = rows + [now]
    g = f.create_group("segments")
    for name, (dtype, unit, description) in SEGMENT_COLUMNS.items():
        _describe(g.create_dataset(name, data=np.array([r[name] for r in rows], dtype=dtype)), unit, description)


def _column(g: h5py.Group, name: str, dtype, rows: int) -> h5py.Dataset:
    """An empty resizable column of ``g`` laid out for ``rows`` rows a round (:func:`client_layout`)."""
    return g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, **client_layout(rows))


def _client_eval_group(f: h5py.File, clients: int) -> h5py.Group:
    """Create ``/client_eval`` (:data:`CLIENT_EVAL`'s columns, resizable, empty), laid out for
    ``clients`` rows an evaluated round."""
    g = f.create_group("client_eval")
    for name, fld in CLIENT_EVAL.items():
        _describe(_column(g, name, fld.dtype, clients), fld.unit, fld.description)
    return g


def copy_rows(old: h5py.Group, new: dict, keep, shift: dict | None = None) -> int:
    """Append to the columns ``new`` (name -> dataset) the rows of ``old``'s same-named columns that
    ``keep(round slab) -> bool mask`` keeps, :data:`SLAB` rows at a time; ``shift`` adds a number to
    a column (rounds of a schema 1 file). Returns the rows kept. Memory: a few slabs, whatever the
    file's size."""
    total = min(old[name].shape[0] for name in new)
    kept = 0
    for lo in range(0, total, SLAB):
        hi = min(total, lo + SLAB)
        mask = keep(old["round"][lo:hi])
        k = int(mask.sum())
        if k == 0:
            continue
        for name, ds in new.items():
            values = old[name][lo:hi][mask]
            if shift and name in shift:
                values = values + shift[name]
            ds.resize((kept + k,))
            ds[kept:] = values
        kept += k
    return kept


def fill_rows(ds: h5py.Dataset, rows: int, fill) -> None:
    """Resize the empty ``ds`` to ``rows`` rows of ``fill``, written :data:`SLAB` rows at a time."""
    ds.resize((rows,))
    for lo in range(0, rows, SLAB):
        ds[lo:min(rows, lo + SLAB)] = fill


def _copy_client_eval(old: h5py.File, new: h5py.File, rounds_done: int, keep_group: bool) -> None:
    """On resume: ``/client_eval``'s rows of rounds up to ``rounds_done`` (created empty if this run
    evaluates clients and the old file did not)."""
    clients = new["partition/class_counts"].shape[0]
    if "client_eval" in old:
        g = _client_eval_group(new, clients)
        copy_rows(old["client_eval"], {name: g[name] for name in CLIENT_EVAL}, lambda r: r <= rounds_done)
    elif keep_group:
        _client_eval_group(new, clients)
