"""The parallel layer: MPI, the exact sums, launch checks, devices and threads.

``mpi`` (the one import of mpi4py), ``comm`` (placement, exact collectives, the round's
accumulator), ``gridsum`` and ``gridsum_torch`` (the training reduction's exact sum on the host
and on a device), ``launch`` (a world split into singletons by the launcher), ``runtime`` (device,
threads, determinism) and ``exits`` (exit codes, and how every rank ends together). It imports
only the shared basics at hpcfl's root and :mod:`hpcfl.native` (docs/architecture.md).
"""
