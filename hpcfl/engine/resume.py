"""Engine state to and from checkpoints (docs/reliability.md).

:func:`capture` and :func:`restore` are collectives. They know nothing of particular
algorithms: every policy declares its state (:mod:`hpcfl.algorithms.protocol`) as
:class:`ClientTable` s, gathered from the owning ranks in client-id order and stored as
``clients.<name>`` (N, width), and :class:`ServerArray` s stored as ``server.<name>``.
So a run resumes on any number of ranks and any placement. :func:`check_job` makes sure a
checkpoint was written by the job that resumes from it.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np

from .. import config
from ..errors import HpcflError
from ..state import ClientTable, ServerArray
from .simulation import accumulator


def state_items(s) -> list:
    """The policies' state and the engine's own (the exact sum's grid)."""
    return s.algo.state() + list(getattr(accumulator(s), "state", list)())


def capture(s, x: np.ndarray) -> dict | None:
    """Arrays of the checkpoint after the current round; on rank 0, None elsewhere."""
    comm = s.comm
    mine = np.flatnonzero(s.owner == comm.rank)
    items = state_items(s)
    tables = [(it.name, it.get()) for it in items if isinstance(it, ClientTable)]
    gathered = comm.gather((mine, tables), root=0)
    if comm.rank != 0:
        return None
    arrays = {"model": np.asarray(x)}
    for it in items:
        if isinstance(it, ServerArray) and it.get() is not None:
            arrays[f"server.{it.name}"] = np.asarray(it.get())
    for t, (name, rows) in enumerate(tables):
        full = np.zeros((len(s.owner), rows.shape[1]), dtype=rows.dtype)
        for ids, parts in gathered:
            full[ids] = parts[t][1]
        arrays[f"clients.{name}"] = full
    return arrays


def restore(s, arrays: dict | None) -> np.ndarray:
    """Load a checkpoint's arrays (given on rank 0) into every rank; returns the model x."""
    comm = s.comm
    items = state_items(s)
    payload = parts = None
    if comm.rank == 0:
        server = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("server.")}
        tables = {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("clients.")}
        # rows of each rank's clients, for the new placement
        parts = [{name: full[s.owner == r] for name, full in tables.items()} for r in range(comm.size)]
        payload = (arrays["model"], server)
    x, server = comm.bcast(payload, root=0)
    rows = comm.scatter(parts, root=0)
    for it in items:
        if isinstance(it, ServerArray) and it.name in server:
            it.set(server[it.name])
        elif isinstance(it, ClientTable) and it.name in rows:
            it.set(rows[it.name])
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
