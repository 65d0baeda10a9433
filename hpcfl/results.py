"""Public reader of results files: ``hpcfl.results.load(path)``."""

from .io.results import Results, load

__all__ = ["Results", "load"]
