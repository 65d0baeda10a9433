"""Engine state to and from checkpoints (docs/reliability.md, "Checkpoints of any size").

:func:`write` and :func:`read` are collectives. They know nothing of particular algorithms:
every policy declares its state (:mod:`hpcfl.algorithms.protocol`) as :class:`ClientTable` s,
stored as ``clients.<name>`` (N, width) in client-id order, and :class:`ServerArray` s stored
as ``server.<name>``. The rows travel rank by rank in blocks of numpy buffers (never a
pickle, never more than one block in rank 0's memory besides its own rows), so a run resumes
on any number of ranks and any placement whatever the state's size. :func:`capture` and
:func:`restore` do the same into and out of a dict (tests, small states). :func:`check_job`
makes sure a checkpoint was written by the job that resumes from it, :func:`problems` that its
arrays fit the job, and :func:`settle` falls back to an older checkpoint when they do not."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from .. import config
from ..errors import HpcflError
from ..io import ckptblocks
from ..io.checkpoint import open_loaded
from ..io.ckptblocks import MESSAGE_BYTES, DictArrays, Streamed, row_blocks
from ..state import ClientTable, ServerArray
from . import shards as sharded
from .simulation import accumulator  # noqa: F401  (tests patch it here)
from .staterows import _dtype, _home_row, _put, _segments, _tables, server_arrays, state_items  # noqa: F401


TAG = 0x4843   # the tag of the rows' messages (nothing else is in flight during a checkpoint)


def _pieces(buf: np.ndarray):
    """A C-contiguous array as byte views of at most MESSAGE_BYTES (MPI counts are int)."""
    flat = buf.reshape(-1).view(np.uint8)
    return [flat[o:o + MESSAGE_BYTES] for o in range(0, flat.size, MESSAGE_BYTES)] or [flat]


def _send(comm, rows: np.ndarray, dest: int) -> None:
    # Synchronous sends: a rank never runs ahead of rank 0 by more than one block, so rank 0's
    # receive queue holds nothing beyond the block it is writing (eager messages would pile up).
    for piece in _pieces(np.ascontiguousarray(rows)):
        comm.Ssend(piece, dest=dest, tag=TAG)


def _recv(comm, out: np.ndarray, source: int) -> None:
    for piece in _pieces(out):
        comm.Recv(piece, source=source, tag=TAG)


def state_bytes(s) -> int:
    """Rank 0: the bytes a checkpoint would write now (the model, the server's arrays, every client
    table's N rows), before HDF5's few kB of metadata. No table is copied off its device."""
    n = s.model.length * s.model.flat.element_size()
    for it in state_items(s):
        value = it.get() if isinstance(it, ServerArray) else None
        n += 0 if value is None else np.asarray(value).nbytes
    for t in _tables(s):
        n += len(s.owner) * t.width * _dtype(t).itemsize
    return int(n)


def _table_stream(s, rows: np.ndarray) -> Streamed:
    """Rank 0: a table ``clients.<name>`` (N, width) in client-id order, its own rows from
    ``rows`` and the others' received one block at a time into one reused buffer."""
    comm, n, width = s.comm, len(s.owner), rows.shape[1]

    def blocks():
        buf = None
        for lo, hi, rank in _segments(s.owner):
            for r0, r1 in row_blocks(hi - lo, width * rows.itemsize):
                if rank == 0:
                    a = _home_row(s, lo)
                    yield lo + r0, lo + r1, rows[a + r0:a + r1]
                    continue
                if buf is None:   # the one block of memory rank 0 spends on other ranks' rows
                    per = max(1, ckptblocks.BLOCK_BYTES // max(1, width * rows.itemsize))
                    buf = np.empty(min(n, per) * width, dtype=rows.dtype)
                out = buf[: (r1 - r0) * width].reshape(r1 - r0, width)
                _recv(comm, out, rank)
                yield lo + r0, lo + r1, out

    return Streamed((n, width), rows.dtype, blocks)


def _send_tables(s) -> None:
    """Ranks other than 0: send every table's own rows to rank 0, in the order it writes them."""
    for table in _tables(s):
        rows = table.get()
        for lo, hi, rank in _segments(s.owner):
            if rank != s.comm.rank:
                continue
            a = _home_row(s, lo)
            for r0, r1 in row_blocks(hi - lo, rows.shape[1] * rows.itemsize):
                _send(s.comm, rows[a + r0:a + r1], 0)


def _rank0_arrays(s, x) -> dict:
    """Rank 0: the checkpoint's arrays, the client tables as :class:`Streamed`."""
    arrays = server_arrays(s, x)
    for t in _tables(s):
        arrays[f"clients.{t.name}"] = _table_stream(s, t.get())
    return arrays


def write(s, x: np.ndarray, store, round: int, meta: dict, manifest: dict, before=None,
          shards: bool = False) -> HpcflError | None:
    """Collective: checkpoint ``round`` into ``store`` (rank 0's), the rows streamed rank by rank.

    With ``shards`` (``checkpoint.shards``), on more than one rank and with client tables to write,
    every rank writes its own rows instead (:func:`hpcfl.engine.shards.write`).

    Rank 0 holds its own rows and one block (``hpcfl.io.ckptblocks.BLOCK_BYTES``) of
    another rank's at a time, whatever the number of clients and ranks; no rank's rows travel
    as a pickle. ``before``: called on rank 0 first (the results file's sync); an error it raises
    fails the save the same way. Returns, on rank 0, None or the error of a failed save (older
    checkpoints untouched; its type tells a moved folder from a full disk); None elsewhere.
    """
    if shards and s.comm.size > 1 and _tables(s):
        return sharded.write(s, x, store, round, meta, manifest, before)
    if s.comm.rank != 0:
        _send_tables(s)
        return None
    arrays = _rank0_arrays(s, x)
    try:
        if before is not None:
            before()
        store.save(round, arrays, meta=meta, manifest=manifest)
        return None
    except HpcflError as exc:
        return exc
    finally:   # the other ranks send their rows whatever happened here: take them all
        for name in sorted(arrays):
            if isinstance(arrays[name], Streamed):
                arrays[name].drain()


def capture(s, x: np.ndarray) -> dict | None:
    """Collective: the checkpoint's arrays in memory on rank 0, None elsewhere (tests, small runs:
    the same streams as :func:`write`, collected into whole tables)."""
    if s.comm.rank != 0:
        _send_tables(s)
        return None
    arrays = _rank0_arrays(s, x)
    for name in sorted(arrays):
        if isinstance(arrays[name], Streamed):
            st, full = arrays[name], np.empty(arrays[name].shape, dtype=arrays[name].dtype)
            for r0, r1, rows in st:
                full[r0:r1] = rows
            arrays[name] = full
    return arrays


def problems(s, spec) -> str | None:
    """Rank 0: why a checkpoint's arrays do not fit this job, or None. ``spec(name)`` gives an
    array's (shape, dtype), None when absent (``Loaded.shapes.get``, ``DictArrays.spec``).

    Every array the job restores is checked for presence, dtype and shape before anything is
    sent: a hand-made file whose checksum matches fails here with a reason, not in a round.
    """
    def check(name, shape, dtype):
        got = spec(name)
        if got is None:
            return f"it has no array {name!r}"
        if len(got[0]) != len(shape) or tuple(got[0]) != tuple(shape) or np.dtype(got[1]) != np.dtype(dtype):
            return (f"its {name!r} is {np.dtype(got[1])} of shape {tuple(got[0])}, this job's is "
                    f"{np.dtype(dtype)} of shape {tuple(shape)}")
        return None

    x = s.model.numpy()
    found = [check("model", x.shape, x.dtype)]
    for it in state_items(s):
        if isinstance(it, ClientTable):
            found.append(check(f"clients.{it.name}", (len(s.owner), it.width), _dtype(it)))
        elif isinstance(it, ServerArray) and it.get() is not None:
            now = np.asarray(it.get())   # the state a fresh run starts from: same shape and type
            found.append(check(f"server.{it.name}", now.shape, now.dtype))
        elif isinstance(it, ServerArray) and spec(f"server.{it.name}") is not None \
                and np.dtype(spec(f"server.{it.name}")[1]).kind not in "biuf":
            found.append(f"its 'server.{it.name}' is not a real array")
    bad = [f for f in found if f]
    return "; ".join(bad) if bad else None


def settle(s, store, loaded, cfg) -> tuple[object, list[str]]:
    """Rank 0: the newest verified checkpoint, from ``loaded`` back, that fits the job ``s``.

    A checkpoint whose checksum matches but whose arrays do not fit (a file made or edited by
    hand, a bug in an older version) is passed over for the next older one, with a warning
    naming it and why. Returns (the checkpoint, the warnings); raises :class:`HpcflError`
    (exit 2) naming the newest one and the fix when none fits.
    """
    warnings, first = [], None
    while loaded is not None:
        why = problems(s, loaded.shapes.get)
        if why is None:
            if first is not None:
                warnings.append(f"warning: resuming from the older {loaded.path.name} instead")
            return loaded, warnings
        first = first or (loaded.path, why)
        warnings.append(f"warning: checkpoint {loaded.path} does not fit this job and is passed over: {why}")
        loaded = store.load_latest(keep_arrays=False, below=loaded.round)
        warnings += [f"warning: checkpoint {p.name} skipped: {w}" for p, w in store.last_skipped]
        if loaded is not None:
            check_job(loaded, cfg)
    raise HpcflError(f"checkpoint {first[0]} does not fit this job ({first[1]}) and no older checkpoint in "
                     f"{first[0].parent} does: it was not written by this version of hpcfl for this job. Move the "
                     f"checkpoint(s) away to start this run over from round 1, or pass --force to set the old run "
                     f"aside and start over")


def read(s, loaded) -> np.ndarray:
    """Collective: load checkpoint ``loaded`` (rank 0's :class:`hpcfl.io.checkpoint.Loaded`,
    verified and checked with :func:`problems`) into every rank; returns the model x.

    Rank 0 reads each table a block at a time and sends each block to the rank that owns its
    clients now (any rank count, any placement); nothing of the file stays in memory after. A
    sharded checkpoint is read by every rank from the shards (:func:`hpcfl.engine.shards.read`).
    """
    if s.comm.bcast(bool(loaded.shards) if s.comm.rank == 0 else None, root=0):
        return sharded.read(s, loaded)
    source = None
    if s.comm.rank == 0:
        source = DictArrays(loaded.arrays) if loaded.arrays else open_loaded(loaded)
    try:
        return _read(s, source)
    finally:
        if source is not None:
            source.close()


def restore(s, arrays: dict | None) -> np.ndarray:
    """Collective: load a checkpoint's arrays (a dict given on rank 0) into every rank."""
    return _read(s, DictArrays(arrays) if s.comm.rank == 0 else None)


def _read(s, source) -> np.ndarray:
    comm = s.comm
    items = state_items(s)
    payload = None
    if comm.rank == 0:
        server = {it.name: source.array(f"server.{it.name}") for it in items
                  if isinstance(it, ServerArray) and source.spec(f"server.{it.name}") is not None}
        payload = (source.array("model"), server)
    x, server = comm.bcast(payload, root=0)   # the model and the server's state: small
    for it in items:
        if isinstance(it, ServerArray) and it.name in server:
            it.set(server[it.name])
    for table in _tables(s):
        name, width, dtype = f"clients.{table.name}", table.width, _dtype(table)
        for lo, hi, rank in _segments(s.owner):
            if comm.rank not in (0, rank):
                continue
            for r0, r1 in row_blocks(hi - lo, width * dtype.itemsize):
                if comm.rank == 0:
                    rows = source.block(name, lo + r0, lo + r1)
                else:
                    rows = np.empty((r1 - r0, width), dtype=dtype)
                    _recv(comm, rows, 0)
                if rank == comm.rank:
                    _put(table, _home_row(s, lo) + r0, rows)
                else:
                    _send(comm, rows, rank)
                del rows   # before the next block is read: one block in memory, not two
    return np.array(x, copy=True)


def check_job(loaded, cfg) -> None:
    """Raise unless checkpoint ``loaded`` (a :class:`hpcfl.io.checkpoint.Loaded`) was written by
    the job ``cfg``, up to the keys that are safe to change on resume.

    The checkpoint's job is its ``meta["config"]`` (the job's canonical JSON), which must hash
    to its manifest's ``config_sha256``; the payload checksum does not cover either.
    """
    text = loaded.meta.get("config")
    fix = (f"it is not this run's: remove it from {loaded.path.parent}, choose another --out, or pass --force "
           f"to set the old run aside and start over")
    if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != loaded.manifest.get("config_sha256"):
        raise HpcflError(f"checkpoint {loaded.path} does not record the job it belongs to consistently (its config "
                         f"and config_sha256 differ); {fix}")
    if loaded.manifest.get("config_sha256") == cfg.digest():
        return
    try:
        old = json.loads(text)
    except (ValueError, RecursionError):
        raise HpcflError(f"checkpoint {loaded.path} holds a job that is not valid JSON; {fix}") from None
    changed, _ = config.resume_changes(old, cfg)
    unsafe = [k for k in changed if not config.is_safe_change(k)]
    if unsafe:
        raise HpcflError(f"checkpoint {loaded.path} was written by a different job (it differs in "
                         f"{', '.join(unsafe)}); {fix}")
