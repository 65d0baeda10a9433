"""Exact-value tests for ``hpcfl.data.partition`` that kill mutmut survivors (issue 48).

Small label vectors, fixed seeds and hand-checked index lists: which client gets which
samples, the boundaries of the size checks (``<`` vs ``<=``), and whole error messages.
"""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from hpcfl.data.partition import (
    DirichletClientOptions,
    DirichletOptions,
    IidOptions,
    LongtailOptions,
    NaturalOptions,
    QuantitySkewOptions,
    _split_counts,
    class_indices,
    dirichlet,
    dirichlet_client,
    groups_from_owner,
    iid,
    longtail,
    longtail_test_indices,
    natural,
    num_classes_of,
    quantity_skew,
    require_nonempty,
)
from hpcfl.errors import ConfigError

Y18 = np.repeat([0, 1, 2], 6)       # 3 classes of 6 samples, sorted
Y30 = np.repeat([0, 1, 2], 10)      # 3 classes of 10 samples, sorted


def lists(parts):
    """Plain int lists of a partition, for exact comparison."""
    return [[int(v) for v in p] for p in parts]


def full(msg):
    """Anchored regex for a whole message (ConfigError prefixes ``config error: ``)."""
    return "^" + re.escape("config error: " + msg) + "$"


# ------------------------------------------------------------------ small helpers


def test_groups_from_float_owner_and_trailing_empty_clients():
    """Float owners are cast to int; clients past the last owner still get (empty) groups; slices work."""
    g = groups_from_owner(np.array([1.0, 0.0, 1.0, -1.0]), 4)
    assert len(g) == 4
    assert lists(g) == [[1], [0, 2], [], []]
    assert lists(g[1:3]) == [[0, 2], []]


def test_num_classes_of():
    """The dataset's count wins; empty labels give 0 classes (no max() of an empty array)."""
    assert num_classes_of(np.array([0, 1]), SimpleNamespace(num_classes=7)) == 7
    assert num_classes_of(np.array([], dtype=np.int64), None) == 0
    assert num_classes_of(np.array([0, 3]), None) == 4


def test_class_indices_keeps_empty_trailing_classes():
    """Classes without samples at the end still get an (empty) index array."""
    assert [a.tolist() for a in class_indices(np.array([0, 1, 0]), 4)] == [[0, 2], [1], [], []]


def test_require_nonempty():
    """Only empty parts count; the message gives their number and the first one."""
    parts = [[1], [2, 3]]
    assert require_nonempty(parts, "w", "why") is parts
    with pytest.raises(ConfigError, match=full("w: 2 client(s) received no samples (first: client 1); why")):
        require_nonempty([[1], [], [2], []], "w", "why")


def test_split_counts_clips_cut_past_the_end():
    """cumsum(p) can round above 1 before the last entry: that cut is clipped to n (last piece 0, not -22)."""
    p = np.array([0.26558727489063405, 0.29807590973548614, 0.19810726468437218, 0.2382295506895077, 0.0])
    counts = _split_counts(p, 10**17)
    assert counts[-1] == 0
    assert counts.min() >= 0
    assert counts.sum() == 10**17


# ----------------------------------------------------------------------------- iid


def test_iid_drop_remainder_and_not():
    """Seed 0, 7 samples, 3 clients: 2 each (one unused) with drop_remainder, else 3, 2, 2."""
    y = np.zeros(7, dtype=np.int64)
    assert lists(iid(y, 3, IidOptions(True), 0)) == [[2, 4], [3, 6], [0, 5]]
    assert lists(iid(y, 3, IidOptions(False), 0)) == [[2, 3, 4], [5, 6], [0, 1]]


# ----------------------------------------------------------------------- dirichlet


def test_dirichlet_uses_dataset_class_count():
    """With the dataset's 2 classes, class 2 (indices 12..17) is not split."""
    parts = dirichlet(Y18, 2, DirichletOptions(alpha=1.0, min_samples=0), 0, SimpleNamespace(num_classes=2))
    assert lists(parts) == [[3, 6, 8, 9, 10, 11], [0, 1, 2, 4, 5, 7]]


def test_dirichlet_min_samples_equal_to_share_is_possible():
    """min_samples * K == N is not refused up front; one redraw then misses it (smallest 7)."""
    with pytest.raises(ConfigError, match=full(
            "data.dirichlet.min_samples = 9 not reached in 1 redraws (2 clients, 18 samples, alpha = 0.5; the "
            "smallest client had 7): lower data.dirichlet.min_samples, raise data.dirichlet.alpha, use fewer "
            "clients (data.num_clients) or raise data.dirichlet.max_tries")):
        dirichlet(Y18, 2, DirichletOptions(min_samples=9, max_tries=1), 0)


def test_dirichlet_zero_tries_reports_smallest_zero():
    """With no redraw the message reports a smallest client of 0."""
    with pytest.raises(ConfigError, match=full(
            "data.dirichlet.min_samples = 1 not reached in 0 redraws (2 clients, 18 samples, alpha = 0.5; the "
            "smallest client had 0): lower data.dirichlet.min_samples, raise data.dirichlet.alpha, use fewer "
            "clients (data.num_clients) or raise data.dirichlet.max_tries")):
        dirichlet(Y18, 2, DirichletOptions(min_samples=1, max_tries=0), 0)


def test_dirichlet_min_samples_reached_exactly():
    """A first draw whose smallest client has exactly min_samples (4) is accepted (>=, not >)."""
    parts = dirichlet(Y18, 3, DirichletOptions(alpha=1.0, min_samples=4, max_tries=1), 0)
    assert lists(parts) == [[3, 6, 8, 9, 12, 14, 15, 16, 17], [2, 4, 5, 7], [0, 1, 10, 11, 13]]


def test_dirichlet_full_client_spreads_to_open_ones():
    """Tiny alpha, cap 4: class 1's mass on the full client is spread evenly (3/3) over the two open ones."""
    y = np.repeat([0, 1], 6)
    opts = DirichletOptions(alpha=1e-3, min_samples=0)
    assert lists(dirichlet(y, 3, opts, 2)) == [[7, 10, 11], [0, 1, 2, 3, 4, 5], [6, 8, 9]]
    assert lists(dirichlet(y, 3, opts, 5)) == [[8, 9, 11], [0, 1, 2, 3, 4, 5], [6, 7, 10]]
    assert lists(dirichlet(y, 3, opts, 0)) == [[6, 7, 8, 9, 10, 11], [], [0, 1, 2, 3, 4, 5]]


# ------------------------------------------------------------------------ longtail


def test_longtail_impossible_uses_kept_total():
    """rho 10 keeps 10, 3, 1 of 30 samples: 3 x 6 > 14 is refused with the longtail key names."""
    with pytest.raises(ConfigError, match=full(
            "data.longtail.min_samples = 6 is impossible: 3 clients x 6 > 14 samples; lower "
            "data.longtail.min_samples or data.num_clients")):
        longtail(Y30, 3, LongtailOptions(rho=10.0, min_samples=6), 0)


def test_longtail_two_classes_allowed_one_refused():
    """Two classes are enough (rho 2 keeps 6 and 3); one class is refused with the whole message."""
    parts = longtail(np.repeat([0, 1], 6), 2, LongtailOptions(rho=2.0, min_samples=0), 0)
    assert lists(parts) == [[2, 3, 4, 5, 9], [0, 1, 6, 8]]
    with pytest.raises(ConfigError, match=full("data.longtail needs at least 2 classes")):
        longtail(np.zeros(4, dtype=np.int64), 2, LongtailOptions(), 0)


def test_longtail_dataset_class_without_samples():
    """The dataset's third class has no samples but would keep 2 (n_max 4, rho 2): refused."""
    with pytest.raises(ConfigError, match=full(
            "data.longtail.n_max = 4: class 2 has only 0 samples but would keep 2; lower data.longtail.n_max")):
        longtail(np.repeat([0, 1], 6), 2, LongtailOptions(rho=2.0, n_max=4, min_samples=0), 0,
                 SimpleNamespace(num_classes=3))


def test_longtail_first_short_class_message():
    """Classes 1 and 2 are both short (keep 5 > 2, 2 > 1): the message names the first, class 1."""
    with pytest.raises(ConfigError, match=full(
            "data.longtail.n_max = 10: class 1 has only 2 samples but would keep 5; lower data.longtail.n_max")):
        longtail(np.repeat([0, 1, 2], [10, 2, 1]), 2, LongtailOptions(rho=4.0, n_max=10), 0)


def test_longtail_given_n_max_and_legacy_rng():
    """n_max 4 keeps 4, 2, 1 (7 samples); legacy_rng draws a different split from default_rng."""
    parts = longtail(Y30, 2, LongtailOptions(rho=4.0, n_max=4, min_samples=0), 0)
    assert lists(parts) == [[4, 6, 14], [2, 7, 17, 26]]
    legacy = longtail(Y30, 2, LongtailOptions(rho=4.0, min_samples=0, legacy_rng=True), 0)
    assert lists(legacy) == [[2, 12, 13, 14, 16], [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 20, 27]]
    modern = longtail(Y30, 2, LongtailOptions(rho=4.0, min_samples=0), 0)
    assert lists(modern) == [[2, 3, 4, 6, 7, 12, 14, 16, 17], [0, 1, 5, 8, 9, 15, 25, 26]]


def test_longtail_test_indices_integer_per_class():
    """11 test labels, 3 classes: per = 11 // 3 = 3 (not 3.67), rho 1.2 keeps 3, 2, 2."""
    y = np.repeat([0, 1, 2], [4, 4, 3])
    assert longtail_test_indices(y, 1.2, 3).tolist() == [0, 1, 2, 4, 5, 8, 9]


def test_longtail_test_indices_float_labels():
    """Float test labels are cast to int before the class split."""
    assert longtail_test_indices(np.array([0.0, 1.0, 0.0, 1.0]), 2.0, 2).tolist() == [0, 1, 2]


# ---------------------------------------------------------------- dirichlet_client


def test_dirichlet_client_exhausts_pools_exactly():
    """alpha 0.05, 3 x 4 samples, 3 clients of 4: the last clients take what is left (redraws)."""
    y = np.repeat(np.arange(3), 4)
    got = [lists(dirichlet_client(y, 3, DirichletClientOptions(0.05), s)) for s in range(3)]
    assert got == [
        [[8, 9, 10, 11], [0, 1, 2, 3], [4, 5, 6, 7]],
        [[8, 9, 10, 11], [0, 4, 6, 7], [1, 2, 3, 5]],
        [[0, 1, 2, 3], [8, 9, 10, 11], [4, 5, 6, 7]],
    ]


def test_dirichlet_client_redraws_over_classes_left():
    """alpha 1e-3, classes of 5, 4, 4: a client whose class ran out (or has 1 left) redraws over the rest."""
    y = np.repeat(np.arange(3), [5, 4, 4])
    opts = DirichletClientOptions(1e-3)
    got = {s: lists(dirichlet_client(y, 3, opts, s)) for s in (4, 5, 12, 13, 17)}
    assert got == {
        4: [[0, 1, 2, 4], [9, 10, 11, 12], [3, 6, 7, 8]],
        5: [[1, 2, 3, 4], [5, 6, 7, 8], [0, 9, 11, 12]],
        12: [[9, 10, 11, 12], [1, 2, 3, 4], [0, 5, 6, 8]],
        13: [[0, 1, 2, 3], [4, 5, 6, 9], [7, 8, 10, 11]],
        17: [[5, 6, 7, 8], [0, 4, 11, 12], [1, 2, 3, 9]],
    }


def test_dirichlet_client_redraw_includes_a_class_with_one_sample_left():
    """alpha 1e-3, classes of 1, 5, 2; seed 15: client 0's mix is all class 2, which it empties (2 of its 4),
    and its uniform redraw is over classes 0 and 1, where class 0 has exactly one sample left: it takes it.
    Dropping that class from the redraw gives [0, 2, 2]; counting classes with 2 left divides by the wrong
    number (a probability vector that does not sum to 1, refused by numpy)."""
    y = np.array([0, 1, 1, 1, 1, 1, 2, 2])
    parts = dirichlet_client(y, 2, DirichletClientOptions(1e-3), 15)
    assert lists(parts) == [[0, 3, 6, 7], [1, 2, 4, 5]]
    assert [np.bincount(y[p], minlength=3).tolist() for p in parts] == [[1, 1, 2], [0, 4, 0]]


def test_dirichlet_client_uneven_n():
    """13 samples, 3 clients: floor(13/3) = 4 each, the 13th sample unused (not given to client 1)."""
    y = np.repeat(np.arange(3), [5, 4, 4])
    parts = dirichlet_client(y, 3, DirichletClientOptions(0.5), 0)
    assert lists(parts) == [[2, 4, 10, 12], [5, 6, 7, 8], [0, 3, 9, 11]]


def test_dirichlet_client_uses_dataset_class_count():
    """The dataset's 4 classes (one empty) change the Dirichlet draws, hence the split."""
    y = np.repeat(np.arange(3), 4)
    opts = DirichletClientOptions(1.0)
    assert lists(dirichlet_client(y, 2, opts, 0, SimpleNamespace(num_classes=4))) == [
        [0, 2, 8, 9, 10, 11], [1, 3, 4, 5, 6, 7]]
    assert lists(dirichlet_client(y, 2, opts, 0)) == [[0, 2, 6, 7, 9, 11], [1, 3, 4, 5, 8, 10]]


# ------------------------------------------------------------------- quantity_skew


def test_quantity_skew_min_samples_equal_to_share_is_possible():
    """min_samples * K == N is not refused up front; one draw misses it (best 4.4)."""
    with pytest.raises(ConfigError, match=full(
            "data.quantity_skew.min_samples = 5 not reached in 1 draws (2 clients, 10 samples, alpha = 0.5; the "
            "best smallest share was 4.4 samples): raise data.quantity_skew.alpha, lower "
            "data.quantity_skew.min_samples or data.num_clients")):
        quantity_skew(np.zeros(10, dtype=np.int64), 2, QuantitySkewOptions(min_samples=5, max_tries=1), 0)


def test_quantity_skew_share_exactly_at_min_samples_is_accepted():
    """One client: its share is all N = 5 samples, exactly min_samples = 5, accepted at the first draw
    (min(p N) >= min_samples, not >)."""
    assert lists(quantity_skew(np.zeros(5, dtype=np.int64), 1, QuantitySkewOptions(min_samples=5, max_tries=1), 0)) \
        == [[0, 1, 2, 3, 4]]


def test_quantity_skew_normalises_by_dividing_by_the_sum():
    """alpha 1e30, seed 7: p = [0.5, 0.5] whose float sum is 1 - 2**-53. p / sum cuts 10 samples at
    10 * 0.5000000000000001 -> 5 | 5; p * sum would cut at 4.999... -> 4 | 6."""
    parts = quantity_skew(np.zeros(10, dtype=np.int64), 2, QuantitySkewOptions(alpha=1e30, min_samples=4, max_tries=1), 7)
    assert lists(parts) == [[0, 1, 3, 7, 8], [2, 4, 5, 6, 9]]


def test_quantity_skew_best_share_below_one():
    """The best smallest share is tracked in samples from 0 (0.4 here, not 1.0 and not p / n)."""
    with pytest.raises(ConfigError, match=full(
            "data.quantity_skew.min_samples = 4 not reached in 2 draws (2 clients, 10 samples, alpha = 0.05; the "
            "best smallest share was 0.4 samples): raise data.quantity_skew.alpha, lower "
            "data.quantity_skew.min_samples or data.num_clients")):
        quantity_skew(np.zeros(10, dtype=np.int64), 2, QuantitySkewOptions(alpha=0.05, min_samples=4, max_tries=2), 2)


def test_quantity_skew_min_samples_zero_met_by_zero_share():
    """Tiny alpha gives shares of exactly 0: min_samples 0 is met (>=), all samples to client 2."""
    parts = quantity_skew(np.zeros(6, dtype=np.int64), 3,
                          QuantitySkewOptions(alpha=1e-3, min_samples=0, max_tries=1), 0)
    assert lists(parts) == [[], [], [0, 1, 2, 3, 4, 5]]


def test_quantity_skew_exact():
    """Seed 0, alpha 1: the permutation is cut 4 / 6."""
    parts = quantity_skew(np.zeros(10, dtype=np.int64), 2, QuantitySkewOptions(alpha=1.0, min_samples=1), 0)
    assert lists(parts) == [[2, 4, 6, 7], [0, 1, 3, 5, 8, 9]]


# ------------------------------------------------------------------------- natural

NATURAL_NONE = ("data.partition = 'natural' needs a dataset with built-in clients ('synthetic', 'leaf', 'tff', or "
                "'npz' with a client array); {} has none: choose another data.partition")


def test_natural_without_dataset_or_clients():
    """No dataset: 'this dataset'; a dataset without natural clients is named."""
    with pytest.raises(ConfigError, match=full(NATURAL_NONE.format("this dataset"))):
        natural(np.zeros(3, dtype=np.int64), 2, NaturalOptions(), 0, None)
    ds = SimpleNamespace(natural_clients=None, name="mnist")
    with pytest.raises(ConfigError, match=full(NATURAL_NONE.format("data.dataset = 'mnist'"))):
        natural(np.zeros(3, dtype=np.int64), 2, NaturalOptions(), 0, ds)


def test_natural_lists_are_sorted_int64():
    """Natural clients given as float arrays or lists come back sorted int64."""
    ds = SimpleNamespace(natural_clients=[np.array([2.0, 0.0]), [1]], name="x")
    out = natural(np.zeros(3, dtype=np.int64), 2, NaturalOptions(), 0, ds)
    assert [a.dtype for a in out] == [np.int64, np.int64]
    assert lists(out) == [[0, 2], [1]]
