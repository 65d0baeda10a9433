"""Start-up and summaries linear in clients and rows: the vectorised functions against the loops
they replaced (kept here, verbatim, as the reference), bitwise, on small inputs."""

import warnings

import numpy as np
import pytest

from hpcfl.data import class_counts, class_counts_flat
from hpcfl.data.partition import groups_from_owner
from hpcfl.io.client_summary import per_client
from hpcfl.io.schema import SUMMARIES


def old_groups_from_owner(owner, num_clients):
    owner = np.asarray(owner, dtype=np.int64)
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner[owner >= 0], minlength=num_clients)
    order = order[len(owner) - int(counts.sum()):]
    return np.split(order, np.cumsum(counts)[:-1])


def old_class_counts(labels, parts, num_classes):
    y = np.asarray(labels, dtype=np.int64)
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        out[i] = np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes)
    return out


def old_summary(ids, values, n, how):
    values = values.astype(np.float64)
    out = np.full(n, np.nan)
    for c in np.unique(ids):
        v = values[ids == c]
        if np.isfinite(v).any():
            out[c] = SUMMARIES[how](v)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_groups_from_owner_matches_the_argsort_and_split(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 40))
    owner = rng.integers(-1, k, size=int(rng.integers(0, 300)))   # -1: unused samples; some clients empty
    new, old = groups_from_owner(owner, k), old_groups_from_owner(owner, k)
    assert len(new) == len(old) == k
    for a, b in zip(new, old):
        assert a.dtype == b.dtype == np.int64 and a.tolist() == b.tolist()
    # what start-up reads instead of concatenating the pieces again
    assert new.flat.tolist() == np.concatenate(old).tolist() and new.sizes.tolist() == [len(b) for b in old]


def test_groups_from_owner_by_hand():
    got = groups_from_owner(np.array([2, -1, 0, 2, 0, -1, 2]), 4)
    assert [g.tolist() for g in got] == [[2, 4], [], [0, 3, 6], []]
    assert got.flat.tolist() == [2, 4, 0, 3, 6] and got.sizes.tolist() == [2, 0, 3, 0]


def test_make_partition_keeps_the_concatenated_indices():
    from hpcfl.data import make_partition

    y = np.random.default_rng(0).integers(0, 4, 300)
    parts = make_partition("dirichlet", y, 12, None, 5)
    assert parts.flat.tolist() == np.concatenate(list(parts)).tolist()
    assert all(p.dtype == np.int64 for p in parts)


@pytest.mark.parametrize("seed", range(4))
def test_class_counts_match_a_loop_over_clients(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 5, size=200)
    parts = groups_from_owner(rng.integers(-1, 30, size=200), 30)
    want = old_class_counts(y, parts, 5)
    assert np.array_equal(class_counts(y, parts, 5), want)
    sizes = np.array([len(p) for p in parts])
    assert np.array_equal(class_counts_flat(y, np.concatenate(parts), sizes, 5), want)


def test_class_counts_by_hand():
    y = np.array([0, 1, 1, 2, 0])
    assert class_counts(y, [np.array([0, 1, 2]), np.array([3, 4]), np.array([], dtype=np.int64)], 3).tolist() == \
        [[1, 2, 0], [1, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("how", sorted(SUMMARIES))
@pytest.mark.parametrize("seed", range(6))
def test_client_summaries_match_the_loop_bitwise(how, seed):
    rng = np.random.default_rng(seed)
    rows, n = int(rng.integers(1, 400)), int(rng.integers(1, 50))
    ids = rng.integers(0, n, size=rows)
    values = rng.normal(size=rows) * 10.0 ** rng.integers(-3, 4, size=rows)
    values[rng.random(rows) < 0.15] = np.nan            # NaN rows are ignored
    values[rng.random(rows) < 0.03] = np.inf            # inf counts, but alone is not a summary
    values[rng.random(rows) < 0.03] = -np.inf
    values[rng.random(rows) < 0.1] = 1.5                # ties
    with warnings.catch_warnings(), np.errstate(invalid="ignore", over="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)   # the loop's median of inf and -inf warns
        want = old_summary(ids, values, n, how)
        got = per_client(ids, values, n, how)
    assert got.tobytes() == want.tobytes()


def test_client_median_by_hand():
    ids = np.array([0, 1, 0, 0, 1, 2, 3, 0])
    v = np.array([4.0, 1.0, 2.0, np.nan, 3.0, np.nan, np.inf, 7.0])
    # client 0: median(2, 4, 7) = 4; client 1: (1 + 3) / 2 = 2; 2: only NaN; 3: only inf -> NaN; 4: no rows
    assert per_client(ids, v, 5, "median").tolist()[:2] == [4.0, 2.0]
    assert np.isnan(per_client(ids, v, 5, "median")[2:]).all()
