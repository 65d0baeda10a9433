"""hpcfl: an MPI high-performance cluster simulator for federated learning.

``hpcfl.run(job, ...)`` runs a job from Python and returns its results (:mod:`hpcfl.api`,
docs/python.md); ``hpcfl.results.load(path)`` reads a run's results file. Importing hpcfl is
light: torch, MPI and the engine load when a run starts.
"""

from .version import __version__  # noqa: F401

__all__ = ["run", "__version__"]


def __getattr__(name: str):
    """``hpcfl.run`` and the event classes, imported when first used (the engine is heavy)."""
    if name in ("run", "Start", "Round", "Evaluation", "End"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'hpcfl' has no attribute {name!r}")
