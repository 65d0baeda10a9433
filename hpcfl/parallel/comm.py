"""MPI communication: client placement, exact and plain sum reductions, broadcast.

Everything takes a ``comm`` argument; one process is simply ``comm.size == 1``. mpi4py
itself is imported only by :mod:`hpcfl.parallel.mpi` (re-exported here as :func:`world` and
:func:`mpi_module`).

Exact reduction
---------------
Floating-point addition is not associative, so a plain ``Reduce(SUM)`` gives results
that depend on how contributions are spread over ranks. :class:`ExactSum` instead
converts every contribution to 64-bit fixed point on a per-element grid that all ranks
agree on first, and sums integers, which is associative:

1. each rank keeps its contributions (rows of length L) and their element-wise max |v|;
2. ``Allreduce(MAX)`` of the int16 binary exponents ``e_j`` of those maxima
   (``max|v_j| < 2**e_j``, read straight from the float64 bits);
3. every row is quantised as ``q = rint(v * 2**(b - e_j))`` with
   ``b = 62 - ceil(log2(K))`` for K contributions in total, so ``sum |q| < 2**62``;
4. ``Allreduce(SUM)`` of the int64 sums; converted back as ``sum_q * 2**(e_j - b)``.

Each quantised value depends only on its own value and the agreed grid, and integer sums
do not depend on order, so the result is bitwise identical for any number of ranks and
any placement. Per element, the error is at most ``K * 2**(e_j - b - 1)``: at least
``b`` bits (58 for K = 16, 45 for K = 100,000) relative to the largest contribution to
that element. Elements where every contribution is zero stay exactly zero.

The price is memory: a rank holds its contributions until the grid is agreed
(local contributions x L x 8 bytes). So ExactSum serves the policies' statistics sums
(:class:`Collectives`), whose rows are at hand anyway; the round's training reduction uses
:class:`hpcfl.parallel.gridsum.GridSum`, which fixes the grid before the round and needs O(L).
``reduce = "float"`` keeps one running float64 sum instead and reduces it with a plain
``Allreduce(SUM)``: cheaper, but not bitwise reproducible across rank counts.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ConfigError
from .mpi import mpi_module, world  # noqa: F401  (re-exported: the engine's one import of MPI)


def owners(num_clients: int, size: int, placement: str = "block") -> np.ndarray:
    """Rank that owns each client.

    Parameters
    ----------
    num_clients : int
        N, the number of simulated clients.
    size : int
        Number of ranks R. Must not exceed N.
    placement : {"balanced", "block", "round_robin"}
        "block": contiguous blocks of sizes differing by at most one. "balanced" uses the
        same blocks as the clients' home (where per-client state lives); each round's
        training is then dealt by :func:`deal`.
        "round_robin": client i on rank i mod R (used to test placement invariance).

    Returns
    -------
    np.ndarray, shape (N,), int64
    """
    if size > num_clients:
        raise ConfigError(
            f"{size} MPI ranks but only data.num_clients = {num_clients} clients; "
            f"every rank needs at least one client: start at most {num_clients} ranks "
            f"or raise data.num_clients"
        )
    if placement in ("block", "balanced"):
        # Same split as numpy.array_split: the first N mod R blocks get one more.
        base, extra = divmod(num_clients, size)
        counts = np.full(size, base, dtype=np.int64)
        counts[:extra] += 1
        return np.repeat(np.arange(size, dtype=np.int64), counts)
    if placement == "round_robin":
        return np.arange(num_clients, dtype=np.int64) % size
    raise ConfigError(f"runtime.placement = {placement!r}; choose 'balanced', 'block' or 'round_robin'")


def deal(work: np.ndarray, size: int) -> np.ndarray:
    """Rank that trains each cohort member this round: longest processing time first.

    Members are taken in order of decreasing expected ``work`` (ties: lower cohort
    position first) and each goes to the rank with the least work so far (ties: the lower
    rank). The busiest rank then carries at most 4/3 of the optimum (Graham 1969), and
    usually within one client's work of an even split. Identical on every rank, since
    ``work`` is.

    Parameters
    ----------
    work : (k,) array of float
        Expected cost of each cohort member (0: nothing to train, placed anyway).
    size : int
        Number of ranks R.

    Returns
    -------
    (k,) int64, the rank of each cohort position.
    """
    work = np.asarray(work, dtype=np.float64)
    out = np.zeros(len(work), dtype=np.int64)
    if size == 1:
        return out
    load = np.zeros(size, dtype=np.float64)
    for j in np.lexsort((np.arange(len(work)), -work)):   # by -work, then position
        r = int(np.argmin(load))                             # argmin takes the first (lowest) rank on ties
        out[j] = r
        load[r] += work[j]
    return out


def fixed_point_bits(total: int) -> int:
    """Bits b of the fixed-point grid for ``total`` contributions (see module doc)."""
    return 62 - math.ceil(math.log2(max(int(total), 1)))


class ExactSum:
    """Order-independent exact sum of float64 rows across all ranks.

    Usage: ``acc = ExactSum(length)``; ``acc.add(row)`` for each local contribution (or
    ``acc.claim()``, fill the returned buffer in place, ``acc.commit()``);
    ``acc.reduce(comm, total, root=0)`` on every rank. ``total`` is the number of
    contributions over all ranks (it bounds the integer sum); all ranks must pass the
    same value. ``reset()`` starts the next sum and keeps every buffer: touching fresh
    memory costs more than the arithmetic at 10^7 elements, so the engine keeps one
    accumulator for the whole run.
    """

    def __init__(self, length: int):
        self.length = int(length)
        self._pool: list[np.ndarray] = []   # row buffers, reused across reset()
        self.count = 0
        self.maxabs = np.zeros(self.length, dtype=np.float64)
        self._tmp = self._itmp = self._qsum = None

    @property
    def rows(self) -> list[np.ndarray]:
        return self._pool[: self.count]

    def reset(self) -> None:
        self.count = 0
        self.maxabs.fill(0.0)

    def add(self, row: np.ndarray) -> None:
        row = np.asarray(row, dtype=np.float64).reshape(-1)
        if row.shape != (self.length,):
            raise ValueError(f"row of shape {row.shape}, expected ({self.length},)")
        np.copyto(self.claim(), row)
        self.commit()

    def claim(self) -> np.ndarray:
        """The next row buffer (length,) float64, to be filled in place and then :meth:`commit`-ed.

        Lets the caller write a contribution where it is kept, instead of building it
        elsewhere and copying it in.
        """
        if self.count == len(self._pool):
            self._pool.append(np.empty(self.length, dtype=np.float64))
        return self._pool[self.count]

    def commit(self) -> None:
        """Count the claimed row: refuse NaN and Inf, fold |row| into the running max."""
        buf, tmp = self._pool[self.count], self._scratch()
        np.abs(buf, out=tmp)
        if not np.isfinite(tmp.max()):       # max propagates NaN and Inf: one read instead of isfinite's array
            raise FloatingPointError("a contribution holds NaN or Inf; it cannot be summed")
        np.maximum(self.maxabs, tmp, out=self.maxabs)
        self.count += 1

    def _scratch(self) -> np.ndarray:
        if self._tmp is None:
            self._tmp = np.empty(self.length, dtype=np.float64)
            self._itmp = np.empty(self.length, dtype=np.int64)
            self._qsum = np.empty(self.length, dtype=np.int64)
        return self._tmp

    def exponents(self) -> np.ndarray:
        """Biased binary exponents E_j (int16) of the local max |v_j|, read from the bits.

        For a normal float, 2**(E-1023) <= |v| < 2**(E-1022); zeros and subnormals have
        E = 0 and are below 2**-1022. So ``max|v_j| < 2**(E_j - 1022)`` always, and the
        MAX over ranks of E_j is the grid exponent for element j (zeros need no special case).
        """
        return (self.maxabs.view(np.uint64) >> np.uint64(52)).astype(np.int16)

    def quantized_sum(self, exp: np.ndarray, total: int) -> tuple[np.ndarray, np.ndarray]:
        """(sum of rint(v * 2**shift) as int64, shift) on the grid of the agreed exponents."""
        b = fixed_point_bits(total)
        shift = (b + 1022) - exp.astype(np.int32)  # |v * 2**shift| < 2**b
        tmp, itmp, qsum = self._scratch(), self._itmp, self._qsum
        qsum.fill(0)
        for row in self.rows:
            np.ldexp(row, shift, out=tmp)
            np.rint(tmp, out=tmp)
            np.copyto(itmp, tmp, casting="unsafe")  # exact: |tmp| < 2**62 is an integer
            qsum += itmp
        return qsum.copy(), shift

    def reduce(self, comm, total: int, root: int | None = 0) -> np.ndarray | None:
        """Sum over all ranks; the result on ``root`` (all ranks if root is None)."""
        MPI = mpi_module()
        exp = self.exponents()
        comm.Allreduce(MPI.IN_PLACE, exp, op=MPI.MAX)
        qsum, shift = self.quantized_sum(exp, total)
        # Allreduce, not Reduce: MPICH's large-message Allreduce is 2-3x faster than its
        # Reduce here (80 MB: 0.07 s vs 0.17 s on 2 ranks), and the result is the same.
        comm.Allreduce(MPI.IN_PLACE, qsum, op=MPI.SUM)
        if root is not None and comm.rank != root:
            return None
        return dequantize(qsum, shift)


def dequantize(qsum: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """float64 values of fixed-point sums: qsum * 2**-shift (one rounding, in the int-to-float conversion)."""
    out = qsum.astype(np.float64)
    return np.ldexp(out, -shift, out=out)


class FloatSum:
    """Plain float64 running sum and ``Allreduce(SUM)``: fast, not bitwise reproducible."""

    def __init__(self, length: int):
        self.length = int(length)
        self.acc = np.zeros(self.length, dtype=np.float64)
        self._row: np.ndarray | None = None   # claim()'s scratch row

    def reset(self, total: int | None = None) -> None:
        self.acc.fill(0.0)

    def add(self, row: np.ndarray) -> None:
        row = np.asarray(row, dtype=np.float64)
        if not np.isfinite(row).all():
            raise FloatingPointError("a contribution holds NaN or Inf; it cannot be summed")
        self.acc += row

    def claim(self) -> np.ndarray:
        """A scratch row to fill in place, then :meth:`commit` (same protocol as ExactSum)."""
        if self._row is None:
            self._row = np.empty(self.length, dtype=np.float64)
        return self._row

    def commit(self) -> None:
        self.add(self._row)

    def reduce(self, comm, total: int, root: int | None = 0) -> np.ndarray | None:
        MPI = mpi_module()
        comm.Allreduce(MPI.IN_PLACE, self.acc, op=MPI.SUM)
        if root is not None and comm.rank != root:
            return None
        return self.acc.copy()


def make_sum(mode: str, length: int, spans=None, device=None):
    """The training reduction's accumulator for ``runtime.reduce`` = "exact" or "float".

    "exact" is :class:`hpcfl.parallel.gridsum.GridSum` (O(L) memory, grid fixed before the round);
    :class:`ExactSum` serves sums whose rows are all at hand (:meth:`Collectives.sum`).
    With a ``device`` (a torch device), their device forms (:mod:`hpcfl.parallel.gridsum_torch`):
    rows written and summed there, the same bits.
    """
    if device is not None:
        from .gridsum_torch import TorchFloatSum, TorchGridSum

        return TorchGridSum(length, spans, device) if mode == "exact" else TorchFloatSum(length, device)
    if mode == "exact":
        from .gridsum import GridSum

        return GridSum(length, spans)
    return FloatSum(length)


class Collectives:
    """Collectives a policy may ask for, over ``comm``, without importing MPI.

    Every method is a collective: all ranks call it, in the same order, with the same
    ``name``-independent arguments (``total``, ``length``, ``k``). Results are identical on
    every rank and do not depend on the number of ranks or on client placement.

    Parameters
    ----------
    comm : MPI communicator
    mode : {"exact", "float"}
        ``runtime.reduce``: sums go through :class:`ExactSum` or :class:`FloatSum`.
    """

    def __init__(self, comm, mode: str = "exact"):
        self.comm, self.mode = comm, mode
        self.calls: list[str] = []   # names of the collectives run (tests count traffic)

    def sum(self, name: str, rows: list[np.ndarray], length: int, total: int) -> np.ndarray:
        """Sum of the float64 ``rows`` (each (length,)) of every rank, on every rank.

        ``total`` is the number of rows over all ranks (it sets the exact grid).
        """
        self.calls.append(name)
        acc = ExactSum(length) if self.mode == "exact" else FloatSum(length)
        for row in rows:
            acc.add(row)
        return acc.reduce(self.comm, total=total, root=None)

    def sum_int(self, name: str, vec: np.ndarray) -> np.ndarray:
        """Element-wise sum of an int64 vector over ranks (exact: integers), on every rank."""
        MPI = mpi_module()
        self.calls.append(name)
        out = np.ascontiguousarray(vec, dtype=np.int64).copy()
        self.comm.Allreduce(MPI.IN_PLACE, out, op=MPI.SUM)
        return out

    def gather(self, name: str, positions: np.ndarray, values: np.ndarray, k: int) -> np.ndarray:
        """Rows owned by each rank placed at their positions: a (k, width) array on every rank.

        ``positions`` (m,) are indices into 0..k-1 held by this rank, ``values`` (m, width)
        their rows. Each position must be held by exactly one rank. Values are placed, not
        summed, so they arrive bit for bit.
        """
        self.calls.append(name)
        values = np.asarray(values, dtype=np.float64)
        # a rank that owns none of the positions (common: K clients over many ranks) sends a (0, 0) block
        values = values.reshape(len(positions), -1) if len(positions) else np.zeros((0, 0))
        parts = self.comm.allgather((np.asarray(positions, dtype=np.int64), values))
        width = max((v.shape[1] for _, v in parts if v.size), default=1)
        out = np.full((k, width), np.nan)
        seen = np.zeros(k, dtype=np.int64)
        for pos, vals in parts:
            if len(pos):
                out[pos] = vals
                seen[pos] += 1
        if np.any(seen != 1):
            raise RuntimeError(f"collective {name!r}: positions {np.flatnonzero(seen != 1).tolist()} were not "
                               f"given by exactly one rank")
        return out

    def bcast(self, name: str, obj, root: int = 0):
        """``obj`` from ``root`` on every rank (a picklable object)."""
        self.calls.append(name)
        return self.comm.bcast(obj, root=root)
