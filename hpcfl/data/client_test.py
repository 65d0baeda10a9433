"""Each client's held-out test rows: a draw from the test set with the client's own label mix.

Per-client evaluation (``run.eval_clients``, docs/results.md) measures the global model on
data that looks like each client's. LEAF and FLGo hold out a fraction of every client's own
samples; hpcfl draws the held-out rows from the test set instead, so that turning the
evaluation on or off never changes a client's training data (and so no result, paper
replication or bitwise promise made without it):

- client i gets ``m_i = max(min_size, round(n_test * n_i / n_train))`` rows, its share of the
  test set as it holds its share of the training set (at least ``min_size``);
- split over classes in proportion to its training label counts (largest remainders, ties to
  the lower class), each class capped at the test samples of that class;
- drawn without replacement within the client: each class's test samples are shuffled once by a
  generator keyed by (seed, class), and the client takes a window of that order starting at an
  offset keyed by (seed, client, class) (a hash, so that a million clients draw in a second).
  For one client the window of a random order is a uniform random sample of the class; the rows
  are the same whatever the rank count, the round or the other clients. Two clients may share a
  test sample (as the clients of LEAF's and FLGo's splits never do): the test set is finite, the
  clients' label mixes overlap.

What this does not capture is feature skew within a class (FEMNIST's writers, speech
speakers): the rows match the client's labels, not its inputs.
"""

from __future__ import annotations

import numpy as np

from .. import rng

MIN_SIZE = 10   # default least rows per client: fewer make a client's accuracy a coarse fraction


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 (wrapping arithmetic): a well-spread hash of each value."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def window_offsets(seed: int, clients: np.ndarray, cls: int, size: int) -> np.ndarray:
    """Each client's start in class ``cls``'s shuffled test samples (``size`` of them): a hash of
    (seed, client, class) modulo ``size``, shape (len(clients),)."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(rng.CLIENT_EVAL))
        key = _mix(key ^ (np.uint64(cls) * np.uint64(0xD1B54A32D192ED03)))
        h = _mix(key ^ (np.asarray(clients, dtype=np.uint64) * np.uint64(0xA24BAED4963EE407)))
    return (h % np.uint64(max(size, 1))).astype(np.int64)


def quotas(counts: np.ndarray, m: np.ndarray, available: np.ndarray) -> np.ndarray:
    """Rows of each class for every client: (N, C) int64, client i's ``m[i]`` split in proportion to its
    training label counts ``counts[i]`` (N, C), by largest remainders (ties to the lower class); a class
    without test samples (``available`` (C,) per class) gets none, and none gets more than it has.

    Only the clients with rows left after the floors rank their remainders (none where every
    share is whole, e.g. a client of 2 samples in 2 classes or 1 class and an even ``m``)."""
    q = np.asarray(counts).astype(np.float64)       # the shares, then in place the quotas m_i share / total
    q[:, available <= 0] = 0.0
    total = q.sum(axis=1)
    has = total > 0                                 # a client without a share keeps q = 0 and gets no rows
    q *= m[:, None]
    q /= np.where(has, total, 1.0)[:, None]
    k = q.astype(np.int64)                          # the floor: q >= 0
    rest = np.where(has, m - k.sum(axis=1), 0)
    some = np.flatnonzero(rest > 0)
    if some.size:
        # largest remainders first, ties to the lower class
        order = np.argsort(-(q[some] - k[some]), axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(k.shape[1])[None, :].repeat(some.size, 0), axis=1)
        k[some] += rank < rest[some, None]
    return np.minimum(k, available[None, :], out=k)


def _stable_order(keys: np.ndarray, bound: int) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of integers in ``[0, bound)``, shape (len(keys),), in O(n):
    numpy sorts 16-bit keys stably by radix, so the keys go through in 16-bit digits, least
    significant first (one pass for a test set of up to 65,536 samples)."""
    keys = np.asarray(keys)
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    shift = 16
    while (int(bound) - 1) >> shift:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        shift += 16
    return order


def client_test_pairs(y_test: np.ndarray, class_counts: np.ndarray, seed: int,
                      min_size: int = MIN_SIZE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's held-out test rows, as (test row, client) pairs sorted by row, then client.

    Parameters
    ----------
    y_test : np.ndarray of int, shape (n_test,)
    class_counts : np.ndarray of int, shape (N, C)
        Training samples per client and class (``hpcfl.data.class_counts``).
    seed : int
        ``run.seed``; the rows are keyed by (seed, class) and (seed, client, class).
    min_size : int
        Least rows per client (fewer only where its classes' test samples run out).

    Returns
    -------
    sizes : np.ndarray of int64, shape (N,)
        Rows per client.
    sample : np.ndarray of int64, shape (P,), P = sizes.sum()
        The pairs' test rows, ascending.
    client : np.ndarray of int64, shape (P,)
        The pairs' clients, ascending among the pairs of one row (a client holds a row once).

    Work and memory are linear in P (a million clients of 10 rows: about half a second of CPU):
    the rows are drawn class by class, each class's pairs in client order, and the classes' test
    samples are disjoint, so one stable sort by row (a radix sort) puts them in (row, client) order.
    """
    y = np.asarray(y_test, dtype=np.int64)
    counts = np.asarray(class_counts, dtype=np.int64)
    c = counts.shape[1]
    pools = [np.flatnonzero(y == k) for k in range(c)]
    available = np.array([p.size for p in pools], dtype=np.int64)
    n_train = max(int(counts.sum()), 1)
    m = np.maximum(int(min_size), np.rint(y.size * counts.sum(axis=1) / n_train).astype(np.int64))
    k = quotas(counts, m, available)
    sizes = k.sum(axis=1).astype(np.int64)
    total = int(sizes.sum())
    # 32-bit rows and positions where they fit: half the memory to fill (10M pairs at 1M clients);
    # a position reaches almost twice its class's size before it wraps (below), hence 2 * y.size
    idx = np.int32 if max(total, 2 * y.size) < 2 ** 31 else np.int64
    rows = np.empty(total, dtype=idx)          # each pair's test row, class after class
    who = np.empty(total, dtype=np.int64)      # its client, ascending within a class
    at = 0
    for cls in range(c):
        take = np.flatnonzero(k[:, cls])
        if take.size == 0:
            continue
        order = rng.numpy_rng(seed, rng.CLIENT_EVAL, cls).permutation(pools[cls])   # keyed by (seed, class)
        start = window_offsets(seed, take, cls, order.size)
        length = k[take, cls]
        n = int(length.sum())
        # client i's window start_i, start_i + 1, ..., start_i + k_i - 1 of the order, wrapped once at
        # most (start_i < size, k_i <= size): positions (start_i + step) % size, step = 0 .. k_i - 1
        pos = np.repeat((start - (np.cumsum(length) - length)).astype(idx), length)
        pos += np.arange(n, dtype=idx)
        pos[pos >= order.size] -= order.size
        np.take(order.astype(idx), pos, out=rows[at:at + n])
        who[at:at + n] = np.repeat(take, length)
        at += n
    by = _stable_order(rows, y.size)
    sample = np.repeat(np.arange(y.size, dtype=np.int64), np.bincount(rows, minlength=y.size))   # rows[by]
    return sizes, sample, who[by]


def own_test_pairs(own) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's own test rows (natural clients: LEAF's and TFF's test files, npz's ``client_test``)
    as the (sizes, sample, client) of :func:`client_test_pairs`.

    ``own`` holds client i's test-set rows, a sequence of N int arrays (a
    :class:`hpcfl.data.partition.Groups`, or a tuple); a row belongs to one client at most. Nothing is
    drawn: the rows are the user's own, none is shared, and ``run.eval_clients_min`` does not apply.
    A client with no rows gets size 0 (its accuracy and loss are NaN).
    """
    flat = getattr(own, "flat", None)
    if flat is not None:
        sizes = np.asarray(own.sizes, dtype=np.int64)
    else:
        sizes = np.fromiter(map(len, own), dtype=np.int64, count=len(own))
        flat = np.concatenate([np.asarray(p, dtype=np.int64) for p in own]) if len(own) else np.zeros(0, np.int64)
    flat = np.asarray(flat, dtype=np.int64)
    who = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    by = np.argsort(flat, kind="stable")   # rows are distinct: this is the (row, client) order
    return sizes, flat[by], who[by]
