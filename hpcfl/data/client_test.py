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


def class_quota(counts: np.ndarray, m: int, available: np.ndarray) -> np.ndarray:
    """Rows of each class for one client: ``m`` split in proportion to ``counts``.

    Parameters
    ----------
    counts : np.ndarray of int, shape (C,)
        The client's training samples per class.
    m : int
        Rows wanted.
    available : np.ndarray of int, shape (C,)
        Test samples per class: a class without any gets none, and no class gets more
        than it has.

    Returns
    -------
    np.ndarray of int64, shape (C,), summing to ``m`` unless capped by ``available``.
    """
    share = np.where(available > 0, np.asarray(counts, dtype=np.float64), 0.0)
    if share.sum() == 0 or m <= 0:
        return np.zeros(len(share), dtype=np.int64)
    q = m * share / share.sum()
    k = np.floor(q).astype(np.int64)
    rest = int(m - k.sum())
    order = np.argsort(-(q - k), kind="stable")   # largest remainders first, ties to the lower class
    k[order[:rest]] += 1
    return np.minimum(k, available)


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
    """:func:`class_quota` of every client at once: (N, C) rows per client and class."""
    share = np.where(available[None, :] > 0, counts.astype(np.float64), 0.0)
    total = share.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(total > 0, m[:, None] * share / np.where(total > 0, total, 1.0), 0.0)
    k = np.floor(q).astype(np.int64)
    rest = np.where(total[:, 0] > 0, m - k.sum(axis=1), 0)
    order = np.argsort(-(q - k), axis=1, kind="stable")   # largest remainders first, ties to the lower class
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(k.shape[1])[None, :].repeat(k.shape[0], 0), axis=1)
    k += rank < rest[:, None]
    return np.minimum(k, available[None, :])


def client_test_sets(y_test: np.ndarray, class_counts: np.ndarray, seed: int,
                     min_size: int = MIN_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Every client's held-out test rows, as a CSR pair.

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
    offsets : np.ndarray of int64, shape (N + 1,)
    rows : np.ndarray of int64, shape (offsets[-1],)
        Client i's test rows are ``rows[offsets[i]:offsets[i + 1]]``, sorted.
    """
    y = np.asarray(y_test, dtype=np.int64)
    counts = np.asarray(class_counts, dtype=np.int64)
    n, c = counts.shape
    pools = [np.flatnonzero(y == k) for k in range(c)]
    available = np.array([p.size for p in pools], dtype=np.int64)
    n_train = max(int(counts.sum()), 1)
    m = np.maximum(int(min_size), np.rint(y.size * counts.sum(axis=1) / n_train).astype(np.int64))
    k = quotas(counts, m, available)
    who, rows = [], []
    for cls in range(c):
        take = np.flatnonzero(k[:, cls])
        if take.size == 0:
            continue
        order = rng.numpy_rng(seed, rng.CLIENT_EVAL, cls).permutation(pools[cls])   # keyed by (seed, class)
        start = window_offsets(seed, take, cls, order.size)
        length = k[take, cls]
        first = np.repeat(np.cumsum(length) - length, length)
        step = np.arange(int(length.sum())) - first                 # 0 .. k_i - 1 within each client
        rows.append(order[(np.repeat(start, length) + step) % order.size])
        who.append(np.repeat(take, length))
    if not rows:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64)
    who, rows = np.concatenate(who), np.concatenate(rows)
    by = np.lexsort((rows, who))                                    # by client, then row
    offsets = np.concatenate([[0], np.cumsum(np.bincount(who, minlength=n))]).astype(np.int64)
    return offsets, rows[by].astype(np.int64)
