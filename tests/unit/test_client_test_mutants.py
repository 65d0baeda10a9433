"""Mutation-testing pins for hpcfl.data.client_test: the (seed, client, class) hash, the quotas'
largest remainders, the radix stable order, which test rows land in which client's split, and the
natural clients' own rows.

The hash is checked against an independent pure-Python splitmix64 (integers masked to 64 bits),
the quotas and sizes against hand-computed cases, and the drawn rows against a one-client-at-a-time
reference loop of the documented rule (window of the (seed, class) permutation at the hashed start).
"""

import warnings

import numpy as np
import pytest

from hpcfl import rng
from hpcfl.data import client_test as ct
from hpcfl.data.partition import Groups

M64 = (1 << 64) - 1


def mix_ref(x: int) -> int:
    """splitmix64's finaliser in Python integers, masked to 64 bits.

    Parameters
    ----------
    x : int
        Value in ``[0, 2**64)``.

    Returns
    -------
    int
        The hashed value in ``[0, 2**64)``.
    """
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def offset_ref(seed: int, client: int, cls: int, size: int) -> int:
    """One client's window start, by the documented (seed, client, class) hash.

    Parameters
    ----------
    seed, client, cls : int
        The key.
    size : int
        Test samples of the class (0 is treated as 1).

    Returns
    -------
    int
        The start in ``[0, max(size, 1))``.
    """
    key = mix_ref((seed * 0x9E3779B97F4A7C15 + rng.CLIENT_EVAL) & M64)
    key = mix_ref(key ^ ((cls * 0xD1B54A32D192ED03) & M64))
    h = mix_ref(key ^ ((client * 0xA24BAED4963EE407) & M64))
    return h % max(size, 1)


def pairs_ref(y, counts, seed, min_size):
    """The (row, client) pairs drawn one client and one class at a time (the documented rule).

    Parameters
    ----------
    y : array of int, shape (n_test,)
    counts : array of int, shape (N, C)
    seed, min_size : int

    Returns
    -------
    sizes : list of int
    pairs : list of (row, client), sorted
    """
    y = np.asarray(y)
    counts = np.asarray(counts)
    n, c = counts.shape
    avail = np.array([(y == k).sum() for k in range(c)])
    n_train = max(int(counts.sum()), 1)
    m = np.array([max(min_size, int(np.rint(y.size * counts[i].sum() / n_train))) for i in range(n)])
    k = ct.quotas(counts, m, avail)
    pairs = []
    for cls in range(c):
        pool = np.flatnonzero(y == cls)
        order = rng.numpy_rng(seed, rng.CLIENT_EVAL, cls).permutation(pool)
        for i in range(n):
            start = offset_ref(seed, i, cls, order.size)
            pairs += [(int(order[(start + s) % order.size]), i) for s in range(int(k[i, cls]))]
    return k.sum(axis=1).tolist(), sorted(pairs)


def test_mix_matches_splitmix64_finaliser():
    """_mix is splitmix64's finaliser exactly (shifts 30/27/31, both multipliers) on small and top-bit values."""
    xs = [0, 1, 2, 3, 0xFFFF, 1 << 31, 1 << 40, (1 << 63) + 12345, M64, 0x0123456789ABCDEF]
    got = ct._mix(np.array(xs, dtype=np.uint64))
    assert got.dtype == np.uint64
    assert got.tolist() == [mix_ref(x) for x in xs]
    assert ct._mix(np.array([1], dtype=np.uint64)).tolist() == [6238072747940578789]


@pytest.mark.parametrize("seed,cls,size", [(0, 0, 7), (7, 3, 1000), (123456789, 9, 2 ** 40), (5, 1, 1)])
def test_window_offsets_match_the_keyed_hash(seed, cls, size):
    """Each client's start is the (seed, client, class) hash modulo the class size, int64, one per client."""
    clients = np.array([0, 1, 2, 3, 17, 99999, 2 ** 33])
    got = ct.window_offsets(seed, clients, cls, size)
    assert got.dtype == np.int64 and got.shape == (7,)
    assert got.tolist() == [offset_ref(seed, int(i), cls, size) for i in clients]


def test_window_offsets_pinned_and_keyed_by_each_part():
    """Pinned starts for seed 7 class 3; changing the seed, the class or the client changes them."""
    assert ct.window_offsets(7, np.arange(5), 3, 1000).tolist() == [688, 365, 229, 725, 917]
    assert ct.window_offsets(0, np.array([0, 5]), 0, 2 ** 40).tolist() == [583591741416, 465764458345]
    base = ct.window_offsets(7, np.arange(5), 3, 2 ** 40)
    assert not np.array_equal(base, ct.window_offsets(8, np.arange(5), 3, 2 ** 40))
    assert not np.array_equal(base, ct.window_offsets(7, np.arange(5), 4, 2 ** 40))
    assert len(set(base.tolist())) == 5


def test_window_offsets_of_an_empty_class_are_zero():
    """size 0 is taken as 1 (no division by zero): every start is 0."""
    assert ct.window_offsets(7, np.arange(4), 3, 0).tolist() == [0, 0, 0, 0]
    assert ct.window_offsets(7, np.arange(4), 3, 1).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("counts,m,avail,want", [
    ([[3, 1]], [4], [5, 5], [[3, 1]]),                      # whole shares: no remainders
    ([[1, 1, 1]], [4], [9, 9, 9], [[2, 1, 1]]),             # equal remainders: tie to the lower class
    ([[2, 3]], [3], [9, 9], [[1, 2]]),                      # 1.2 / 1.8: the larger remainder wins
    ([[3, 2]], [3], [9, 9], [[2, 1]]),                      # 1.8 / 1.2: the larger remainder wins
    ([[1, 1, 1, 1]], [6], [9, 9, 9, 9], [[2, 2, 1, 1]]),    # two rows left: the two lowest classes
    ([[5, 5]], [4], [0, 10], [[0, 4]]),                     # no test samples: the class gets none
    ([[1, 1]], [10], [1, 100], [[1, 5]]),                   # capped at the class's test samples
    ([[0, 0], [2, 2]], [10, 4], [9, 9], [[0, 0], [2, 2]]),  # no share: no rows
    ([[2, 2, 0], [1, 1, 1], [0, 1, 2]], [4, 4, 5], [10, 10, 10], [[2, 2, 0], [2, 1, 1], [0, 2, 3]]),
    ([[4, 0], [0, 1, ], [1, 2]], [3, 2, 1], [5, 5], [[3, 0], [0, 2], [0, 1]]),
])
def test_quotas_largest_remainders(counts, m, avail, want):
    """quotas splits m_i by the client's label counts: floors, then largest remainders (ties low), capped."""
    got = ct.quotas(np.array(counts), np.array(m), np.array(avail))
    assert got.dtype == np.int64
    assert got.tolist() == want


def test_quotas_does_not_change_its_inputs():
    """The caller's counts stay as they were (quotas works on a float copy)."""
    counts = np.array([[5, 5], [1, 3]])
    ct.quotas(counts, np.array([4, 4]), np.array([0, 10]))
    assert counts.tolist() == [[5, 5], [1, 3]]


def test_quotas_remainder_only_for_clients_with_rows_left():
    """A whole-share client between two with remainders keeps its exact quota (the ``some`` rows only)."""
    got = ct.quotas(np.array([[1, 2], [1, 1], [2, 1]]), np.array([2, 4, 2]), np.array([9, 9]))
    assert got.tolist() == [[1, 1], [2, 2], [1, 1]]
    got = ct.quotas(np.array([[1, 1], [1, 2], [1, 1]]), np.array([4, 2, 4]), np.array([9, 9]))
    assert got.tolist() == [[2, 2], [1, 1], [2, 2]]


@pytest.mark.parametrize("bound", [1, 2, 300, 1 << 16, (1 << 16) + 1, 1 << 20, 1 << 32, (1 << 32) + 5, 1 << 40])
def test_stable_order_is_a_stable_argsort(bound):
    """_stable_order equals numpy's stable argsort for keys in [0, bound), duplicates kept in place."""
    r = np.random.default_rng(bound)
    keys = r.integers(0, bound, size=500)
    keys[::7] = keys[0]                       # many ties
    keys[3] = bound - 1
    got = ct._stable_order(keys, bound)
    assert got.tolist() == np.argsort(keys, kind="stable").tolist()


def test_stable_order_digits_above_16_bits():
    """Keys equal in their low 16 bits are ordered by the higher digits (65536 after 1, before 65537)."""
    keys = np.array([65537, 65536, 1, 0, 1 << 32, (1 << 32) + 1, 65536, 131072])
    assert ct._stable_order(keys, (1 << 32) + 2).tolist() == [3, 2, 1, 6, 0, 7, 4, 5]
    keys32 = np.array([65537, 65536, 1, 0, 65536, 131072], dtype=np.int32)
    assert ct._stable_order(keys32, 131073).tolist() == [3, 2, 1, 4, 0, 5]
    assert ct._stable_order(np.array([65535, 0, 65535, 1]), 1 << 16).tolist() == [1, 3, 0, 2]


def check_pairs(y, counts, seed, min_size):
    """client_test_pairs equals the reference loop; sample ascending, clients ascending within a row."""
    sizes, sample, client = ct.client_test_pairs(np.array(y), np.array(counts), seed, min_size)
    want_sizes, want = pairs_ref(y, counts, seed, min_size)
    assert sizes.dtype == np.int64 and sample.dtype == np.int64 and client.dtype == np.int64
    assert sizes.tolist() == want_sizes
    assert list(zip(sample.tolist(), client.tolist())) == want
    return sizes, sample, client


@pytest.mark.parametrize("seed", [0, 1, 2024])
def test_pairs_match_the_reference_draw(seed):
    """Rows per client and class follow the documented window draw for several seeds and clients."""
    y = np.array([0, 1, 2] * 12 + [0, 0, 1])
    counts = [[10, 5, 0], [1, 1, 1], [0, 0, 9], [30, 2, 1], [3, 3, 3]]
    check_pairs(y, counts, seed, 4)


def test_pairs_wrap_around_the_class_order():
    """Windows that run past a small class's end wrap to its start (every row once for a full class)."""
    y = np.array([0] * 5 + [1] * 3)
    counts = [[5, 3], [5, 3], [2, 0], [0, 7]]
    sizes, sample, client = check_pairs(y, counts, 11, 8)
    assert sizes.tolist() == [8, 8, 5, 3]                    # m = 8, capped at the classes' 5 and 3
    for i in (0, 1):
        assert sorted(sample[client == i].tolist()) == list(range(8))
    assert sorted(sample[client == 2].tolist()) == [0, 1, 2, 3, 4]
    assert sorted(sample[client == 3].tolist()) == [5, 6, 7]


def test_pairs_sizes_by_rounded_share_and_floor():
    """m_i = max(min_size, rint(n_test n_i / n_train)): 2.5 rounds to 2, 7.5 to 8; the floor lifts both."""
    y = np.zeros(10, dtype=np.int64)
    sizes, _, _ = check_pairs(y, [[1], [3]], 3, 0)
    assert sizes.tolist() == [2, 8]
    sizes, _, _ = check_pairs(y, [[1], [3]], 3, 5)
    assert sizes.tolist() == [5, 8]
    sizes, _, _ = ct.client_test_pairs(y, np.array([[1], [3]]), 3)   # default MIN_SIZE = 10
    assert ct.MIN_SIZE == 10 and sizes.tolist() == [10, 10]
    sizes, _, _ = ct.client_test_pairs(y, np.array([[1], [3]]), 3, 11.7)
    assert sizes.tolist() == [10, 10]                                # int(11.7) = 11, capped at 10 rows


def test_pairs_without_training_samples():
    """No training samples at all: no shares, so no rows (n_train taken as 1, no division by zero)."""
    sizes, sample, client = ct.client_test_pairs(np.array([0, 1, 1]), np.zeros((3, 2), np.int64), 0, 4)
    assert sizes.tolist() == [0, 0, 0] and sample.size == 0 and client.size == 0


def test_pairs_class_without_test_samples_and_last_class():
    """A class absent from the test set gives none; the last class (index C-1) is drawn too."""
    y = np.array([2, 2, 2, 0, 0, 2])
    sizes, sample, client = check_pairs(y, [[1, 5, 1], [0, 0, 4], [0, 3, 0]], 5, 3)
    assert sizes.tolist() == [3, 3, 0]
    assert sorted(y[sample[client == 1]].tolist()) == [2, 2, 2]
    assert np.bincount(client, minlength=3).tolist() == [3, 3, 0]


def test_pairs_depend_on_the_seed_only_through_the_draw():
    """Another seed keeps the sizes but draws other rows (the (seed, class) order)."""
    y = np.arange(200) % 2
    a = ct.client_test_pairs(y, np.array([[50, 50], [10, 90]]), 1, 10)
    b = ct.client_test_pairs(y, np.array([[50, 50], [10, 90]]), 2, 10)
    assert a[0].tolist() == b[0].tolist() == [100, 100]
    assert not np.array_equal(a[1], b[1])


def test_pairs_over_many_rows_sorted():
    """Over 65,536 test rows (two radix digits) the pairs come back in (row, client) order."""
    y = np.arange(70000) % 3
    counts = np.array([[1, 1, 1], [5, 0, 1]])
    sizes, sample, client = ct.client_test_pairs(y, counts, 9, 30000)
    # client 1: m = rint(70000 * 6 / 9) = 46667 -> 38889 of class 0 (capped at 23334) and 7778 of class 2
    assert sizes.tolist() == [30000, 31112]
    key = sample * 2 + client
    assert np.all(np.diff(key) > 0)
    assert np.bincount(y[sample[client == 1]], minlength=3).tolist() == [23334, 0, 7778]


class Own:
    """A Groups stand-in that has ``flat`` and ``sizes`` but cannot be iterated."""

    def __init__(self, flat, sizes):
        self.flat, self.sizes = flat, sizes

    def __len__(self):
        raise AssertionError("own_test_pairs must read flat/sizes, not iterate")


def test_own_pairs_from_a_tuple():
    """Tuple input: sizes by length, rows ascending, each with its client."""
    sizes, sample, client = ct.own_test_pairs((np.array([7, 2]), [], np.array([5, 0, 9])))
    assert sizes.dtype == np.int64 and sample.dtype == np.int64 and client.dtype == np.int64
    assert sizes.tolist() == [2, 0, 3]
    assert sample.tolist() == [0, 2, 5, 7, 9]
    assert client.tolist() == [2, 0, 2, 0, 2]


def test_own_pairs_from_groups_and_flat_objects():
    """Groups (and any object with flat/sizes) are read through flat/sizes, int32 inputs widened."""
    g = Groups(np.array([4, 1, 3, 0], dtype=np.int32), np.array([2, 0, 2], dtype=np.int32))
    sizes, sample, client = ct.own_test_pairs(g)
    assert sizes.tolist() == [2, 0, 2] and sizes.dtype == np.int64
    assert sample.tolist() == [0, 1, 3, 4] and sample.dtype == np.int64
    assert client.tolist() == [2, 0, 2, 0] and client.dtype == np.int64
    sizes, sample, client = ct.own_test_pairs(Own([6, 2, 8], [1, 2]))
    assert sizes.tolist() == [1, 2] and sample.tolist() == [2, 6, 8] and client.tolist() == [1, 0, 1]


def test_own_pairs_empty():
    """No clients: empty int64 arrays; clients without rows only: sizes 0."""
    sizes, sample, client = ct.own_test_pairs(())
    assert sizes.tolist() == [] and sample.tolist() == [] and client.tolist() == []
    assert sizes.dtype == sample.dtype == client.dtype == np.int64
    sizes, sample, client = ct.own_test_pairs(([], []))
    assert sizes.tolist() == [0, 0] and sample.size == 0 and sample.dtype == np.int64


def test_window_offsets_wrap_silently():
    """The 64-bit products wrap by design: no overflow warning escapes, even with warnings as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with np.errstate(over="warn"):
            got = ct.window_offsets(7, np.arange(3), 3, 1000)
    assert got.tolist() == [688, 365, 229]


def test_quotas_ties_to_the_lower_class_among_many():
    """Over 40 classes with many equal remainders the rows left go to the lowest tied classes (a stable rank)."""
    r = np.random.default_rng(0)
    counts = r.integers(1, 4, size=(1, 40))
    m = 40
    q = counts[0] * m / counts.sum()
    floor = [int(v) for v in q]
    rest = m - sum(floor)
    ranked = sorted(range(40), key=lambda j: -(q[j] - floor[j]))   # Python's sort is stable
    want = [f + (ranked.index(j) < rest) for j, f in enumerate(floor)]
    got = ct.quotas(counts, np.array([m]), np.full(40, 999))
    assert got[0].tolist() == want and sum(want) == m


def test_pairs_single_training_sample():
    """One training sample in all: n_train = 1, so that client's share is the whole test set (6 rows)."""
    sizes, sample, client = ct.client_test_pairs(np.zeros(6, np.int64), np.array([[1], [0]]), 0, 0)
    assert sizes.tolist() == [6, 0]
    assert sample.tolist() == [0, 1, 2, 3, 4, 5] and client.tolist() == [0] * 6
