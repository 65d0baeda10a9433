"""The held-out rows of per-client evaluation (hpcfl.data.client_test) drawn for every client at
once: the same rows as the documented per-client draw, the same rows as before the draw was
made linear (pinned), the pairs that evaluation sums in the same order, and a million clients'
draw in (row, client) order."""

import hashlib

import numpy as np
import pytest

from hpcfl import rng
from hpcfl.data import client_test as ct
from hpcfl.engine.evaluation import ClientEval


def class_quota(counts: np.ndarray, m: int, available: np.ndarray) -> np.ndarray:
    """Rows of each class for one client: ``m`` split in proportion to ``counts`` (the documented rule,
    one client at a time: what :func:`hpcfl.data.client_test.quotas` does for all at once).

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
                     min_size: int = ct.MIN_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Every client's held-out test rows (:func:`hpcfl.data.client_test.client_test_pairs`), as a CSR
    pair: the form the tests read a client's rows in.

    Returns
    -------
    offsets : np.ndarray of int64, shape (N + 1,)
    rows : np.ndarray of int64, shape (offsets[-1],)
        Client i's test rows are ``rows[offsets[i]:offsets[i + 1]]``, sorted.
    """
    sizes, sample, client = ct.client_test_pairs(y_test, class_counts, seed, min_size)
    by = ct._stable_order(client, sizes.size)       # by client; a client's rows stay ascending
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), sample[by]


def one_client(y, counts, i, seed, min_size):
    """Client i's rows as the module docstring describes them, one client and one class at a time."""
    n_train = max(int(counts.sum()), 1)
    m = max(min_size, int(np.rint(y.size * counts[i].sum() / n_train)))
    available = np.bincount(y, minlength=counts.shape[1])
    k = class_quota(counts[i], m, available)
    rows = []
    for cls in range(counts.shape[1]):
        if k[cls]:
            order = rng.numpy_rng(seed, rng.CLIENT_EVAL, cls).permutation(np.flatnonzero(y == cls))
            start = int(ct.window_offsets(seed, np.array([i]), cls, order.size)[0])
            rows += [int(order[(start + j) % order.size]) for j in range(int(k[cls]))]
    return sorted(rows)


def sha16(a):
    return hashlib.sha256(np.asarray(a, dtype="<i8").tobytes()).hexdigest()[:16]


def test_every_client_draws_what_it_would_draw_alone():
    r = np.random.default_rng(11)
    for case in range(40):
        c, n = int(r.integers(1, 8)), int(r.integers(1, 40))
        n_test = int(r.integers(1, 300)) if case % 10 else 70_000   # 70,000: the sort's second 16-bit digit
        y = r.integers(0, c, n_test)
        counts = r.integers(0, 6, (n, c)) * (r.random((n, c)) < 0.6)   # clients without samples, classes unheld
        seed, min_size = int(r.integers(0, 2 ** 31)), int(r.integers(1, 25))
        off, rows = client_test_sets(y, counts, seed, min_size)
        sizes, sample, client = ct.client_test_pairs(y, counts, seed, min_size)
        for i in range(n):
            assert rows[off[i]:off[i + 1]].tolist() == one_client(y, counts, i, seed, min_size), (case, i)
        assert sizes.tolist() == np.diff(off).tolist()
        # the pairs: (row, client) sorted, each client's rows the same as its CSR slice
        assert np.all(np.diff(sample) >= 0) and np.all(np.diff(client)[np.diff(sample) == 0] > 0)
        for i in range(n):
            assert sample[client == i].tolist() == rows[off[i]:off[i + 1]].tolist()


def test_the_rows_are_the_ones_drawn_before_the_draw_was_vectorised():
    """Figures from the per-class draw with a (client, row) lexsort that this one replaced: a change
    of any client's rows would change every existing run's /client_eval."""
    y = np.arange(40) % 3
    off, rows = client_test_sets(y, np.array([[3, 1, 0], [0, 0, 2], [1, 1, 1], [0, 0, 0]]), seed=7, min_size=4)
    assert off.tolist() == [0, 18, 27, 40, 40]
    assert rows.tolist() == [0, 3, 6, 9, 12, 13, 15, 16, 18, 21, 22, 24, 27, 30, 33, 36, 37, 39, 5, 8, 11, 14, 17,
                             26, 29, 32, 35, 3, 4, 5, 6, 10, 12, 18, 19, 23, 24, 28, 29, 35]
    y2 = np.random.default_rng(5).integers(0, 4, 70000)
    c2 = np.array([[1, 1, 1, 1], [2, 1, 1, 1], [1, 2, 0, 1], [1, 2, 2, 0], [2, 2, 1, 0]])
    off, rows = client_test_sets(y2, c2, seed=1, min_size=5)
    assert off.tolist() == [0, 12174, 27391, 39565, 54782, 69999] and sha16(rows) == "78ca8895d9283104"
    y3 = np.random.default_rng(0).integers(0, 10, 3000)
    c3 = np.random.default_rng(1).multinomial(2, [0.1] * 10, size=50000)
    off, rows = client_test_sets(y3, c3, seed=0, min_size=10)
    assert off[-1] == 500000 and sha16(rows) == "ac067992ada46cd3"
    # nothing to draw: no test samples, no clients, clients without samples
    for yy, c, want in ((np.zeros(0, int), np.ones((3, 2), int), [0, 0, 0, 0]), (y, np.zeros((0, 3), int), [0]),
                        (y, np.zeros((2, 3), int), [0, 0, 0])):
        off, rows = client_test_sets(yy, c, 0, 3)
        assert off.tolist() == want and rows.size == 0 and off.dtype == rows.dtype == np.int64


def from_sets(offsets, rows) -> ClientEval:
    """ClientEval as it was built before the pairs: from the per-client CSR lists, sorted by row
    with a stable sort (so clients ascend within a row)."""
    sizes = np.diff(np.asarray(offsets, dtype=np.int64))
    order = np.argsort(rows, kind="stable")
    client = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)[order]
    return ClientEval(sizes, np.asarray(rows, dtype=np.int64)[order], client)


def test_evaluation_sums_the_same_pairs_in_the_same_order():
    """ClientEval from the pairs equals ClientEval from the CSR (sorted by row with a stable sort),
    array for array, so every chunk's bincounts, and the run's /client_eval, keep their bits."""
    y = np.random.default_rng(2).integers(0, 7, 5000)
    counts = np.random.default_rng(3).multinomial(9, [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1], size=3000)
    a = ClientEval(*ct.client_test_pairs(y, counts, 5, 10))
    b = from_sets(*client_test_sets(y, counts, 5, 10))
    for name in ("sizes", "sample", "client"):
        x, z = getattr(a, name), getattr(b, name)
        assert x.dtype == z.dtype == np.int64 and x.tobytes() == z.tobytes()
    loss = np.random.default_rng(4).random(1000) * 3
    hit = (loss > 1).astype(np.float64)
    assert a.chunk_sums(2000, 3000, hit, loss).tobytes() == b.chunk_sums(2000, 3000, hit, loss).tobytes()


@pytest.mark.parametrize("bound", [1, 2, 300, 65536, 65537, 1 << 20, (1 << 32) + 5])
def test_the_radix_order_is_numpys_stable_argsort(bound):
    keys = np.random.default_rng(bound % 1000).integers(0, bound, 5000)
    keys[:50] = bound - 1                                     # the largest key, and ties
    np.testing.assert_array_equal(ct._stable_order(keys, bound), np.argsort(keys, kind="stable"))


def test_quotas_when_every_share_is_whole_or_none_is():
    """Clients whose floors already sum to m rank nothing; the others as class_quota, one by one."""
    counts = np.array([[1, 1, 0], [2, 0, 0], [0, 0, 0], [1, 1, 1], [3, 0, 1], [0, 1, 0]])
    m = np.array([10, 10, 10, 10, 10, 7])
    av = np.array([50, 50, 0])
    want = [class_quota(counts[i], int(m[i]), av).tolist() for i in range(len(m))]
    assert ct.quotas(counts, m, av).tolist() == want == [[5, 5, 0], [10, 0, 0], [0, 0, 0], [5, 5, 0], [10, 0, 0],
                                                      [0, 7, 0]]


def test_a_million_clients_draw_ten_million_pairs_in_row_order():
    """1,000,000 clients of 2 samples in 10 classes, 10 rows each: 10M (row, client) pairs in 32-bit
    buffers, in row order with clients ascending within a row (what the radix sort gives). Its
    speed (0.4-0.7 s of CPU here, 3.2-4.6 s before) is printed by bench/million_clients_bench.py,
    not timed here."""
    y = np.random.default_rng(0).integers(0, 10, 10000)
    counts = np.random.default_rng(1).multinomial(2, [0.1] * 10, size=1_000_000)
    ce = ClientEval(*ct.client_test_pairs(y, counts, 0, 10))
    assert ce.sample.size == 10_000_000 and ce.sizes.tolist()[:3] == [10, 10, 10]
    assert int(ce.sizes.sum()) == 10_000_000 and (ce.sizes == 10).all()
    key = ce.sample.astype(np.int64) * 1_000_000 + ce.client
    assert (np.diff(key) > 0).all(), "pairs not in (row, client) order, or a pair twice"
    assert 0 <= ce.sample.min() and ce.sample.max() < y.size and 0 <= ce.client.min() and ce.client.max() < 1_000_000
