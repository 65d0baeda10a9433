"""hpcfl's version (one place: the package, ``hpcfl --version`` and the results files read it here)."""

__version__ = "0.1.0"
