"""Compiled code: numba where it can be had (``jit``), the C kernels' compiler and loader (``cc``),
and the user's cache folder they (and generated datasets) are kept in (``cachedir``).

The lowest layer after the shared basics: it imports nothing else from hpcfl (docs/architecture.md).
"""
