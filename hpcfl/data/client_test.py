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
- drawn without replacement within the client from each class's test samples, by a generator
  keyed by (seed, client) alone: the same rows whatever the rank count, the round or the
  other clients. Two clients may share a test sample (as the clients of LEAF's and FLGo's
  splits never do): the test set is finite, the clients' label mixes overlap.

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


def client_test_sets(y_test: np.ndarray, class_counts: np.ndarray, seed: int,
                     min_size: int = MIN_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Every client's held-out test rows, as a CSR pair.

    Parameters
    ----------
    y_test : np.ndarray of int, shape (n_test,)
    class_counts : np.ndarray of int, shape (N, C)
        Training samples per client and class (``hpcfl.data.class_counts``).
    seed : int
        ``run.seed``; client i's rows are keyed by (seed, client i).
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
    out, offsets = [], [0]
    for i in range(n):
        m = max(int(min_size), int(round(y.size * int(counts[i].sum()) / n_train)))
        quota = class_quota(counts[i], m, available)
        gen = rng.numpy_rng(seed, rng.CLIENT_EVAL, 0, i)
        picked = [gen.choice(pools[k], int(quota[k]), replace=False) for k in range(c) if quota[k]]
        rows = np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
        out.append(rows.astype(np.int64))
        offsets.append(offsets[-1] + rows.size)
    return np.asarray(offsets, dtype=np.int64), (np.concatenate(out) if out else np.zeros(0, dtype=np.int64))
