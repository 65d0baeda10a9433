"""Running a job from Python: :func:`run` (``hpcfl.run``), documented in docs/python.md.

The command line's ``hpcfl run`` and ``hpcfl sweep`` go through this same function; the steps of a
run are :class:`hpcfl.engine.job.JobRun`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import signals
from .engine.events import End, Evaluation, Round, Start  # noqa: F401  (hpcfl.Start, ... for isinstance checks)
from .errors import HpcflError

__all__ = ["run", "Start", "Round", "Evaluation", "End"]


def _override_texts(overrides) -> list[str]:
    """``overrides`` as ``--set`` texts: a list of ``"key=value"`` texts, one such text, or a dict
    ``{"algorithm.lr": 0.05}`` whose values are written as TOML."""
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        from .config.tomltext import toml_value

        plain = (lambda v: v.item() if getattr(v, "shape", None) == () and hasattr(v, "item") else v)   # numpy
        return [f"{k}={toml_value(plain(v))}" for k, v in overrides.items()]
    texts = list(overrides)
    wrong = [repr(t) for t in texts if not isinstance(t, str)]
    if wrong:
        raise HpcflError(f"overrides holds {', '.join(wrong)}: give 'section.key=value' texts (e.g. "
                         f"['algorithm.lr=0.05']) or a dict ({{'algorithm.lr': 0.05}})")
    return texts


def run(job, *, out=None, overrides=(), force: bool = False, comm=None, callbacks=()):
    """Run a job, or resume it, or find it finished; returns its results on every rank.

    Parameters
    ----------
    job : str, path-like or dict
        The path of a TOML job file (relative paths in it start from its folder), TOML text (a
        ``str`` with a newline or an ``=``), or a dict of its tables, e.g.
        ``{"data": {"dataset": "digits"}, "model": {"name": "mlp"}}`` (relative paths start from
        the current folder).
    out : str or path-like, optional
        The output folder (``results.h5``, ``checkpoints/``); default ``runs/<run.name>``. A folder
        that holds this job's unfinished run is resumed from its newest checkpoint, bitwise; a
        finished one is returned as it is.
    overrides : sequence of str, str or dict
        As ``--set``: ``["algorithm.lr=0.05", "run.rounds=10"]``, or ``{"algorithm.lr": 0.05}``.
    force : bool
        Start over: the old run in ``out`` is set aside and deleted once this one has written its
        first checkpoint (``--force``).
    comm : MPI communicator, optional
        Default ``MPI.COMM_WORLD``: one rank in a plain ``python`` or a notebook, every rank under
        ``mpiexec``. Every rank of ``comm`` must call :func:`run` with the same arguments.
    callbacks : sequence of callables
        Each is called on rank 0 with every event of the run, in order: :class:`Start`, then a
        :class:`Round` per round and an :class:`Evaluation` per evaluation with per-client figures
        (``run.eval_clients``), then :class:`End`. Their data is read-only. One that raises stops
        the run at the end of that round with a checkpoint (:class:`hpcfl.errors.CallbackError`).
        The progress display (``runtime.progress``) is one such callback, called first.

    Returns
    -------
    hpcfl.results.Results
        The same on every rank: the run's results file, read by rank 0 (the per-client tables
        ``.clients`` and ``.client_eval`` are read from ``out`` when first used). ``.status`` is
        ``"finished"`` or ``"diverged"`` (a run that diverged is a result, not an error);
        ``.outcome`` says what this call did: ``"finished"``, ``"diverged"``, ``"already finished"``
        or ``"already diverged"``.

    Raises
    ------
    hpcfl.errors.HpcflError
        On every rank together, the same message everywhere: bad input (:class:`ConfigError`,
        nothing written), :class:`RunStopped` (Ctrl-C, SIGTERM, SIGUSR1: a checkpoint was
        written; call again to resume), :class:`GuardStopped`, :class:`WriteError` (full disk),
        :class:`CallbackError`. Each carries the command line's ``exit_code``. A rank that dies or
        freezes ends the whole job (MPI abort), as with ``hpcfl run``.
    """
    from .cli.progress import ShowProgress
    from .engine.job import JobRun

    texts = _override_texts(overrides)
    callbacks = [callbacks] if callable(callbacks) else list(callbacks or ())
    if comm is None:
        from .parallel import launch
        from .parallel.mpi import world

        comm = world()
        split = launch.split_world(comm.size)
        if split:   # N srun tasks, each a world of 1: each would run the whole job into the same --out
            raise HpcflError(f"{split} Stopped before touching --out.")
    shown = ShowProgress()
    try:
        with signals.listening():
            return JobRun(job, comm, out=out, overrides=texts, force=force, callbacks=[shown, *callbacks]).run()
    finally:
        shown.close()   # a run that ended without its End event (an unexpected error) gives the streams back
