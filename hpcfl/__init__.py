"""hpcfl: an MPI high-performance cluster simulator for federated learning."""

__version__ = "0.1.0"
