"""Exact-value tests for ``hpcfl.data.partition_labels`` that kill mutmut survivors (issue 48).

Small label vectors, fixed seeds and hand-checked index lists: which client gets which
samples, the boundaries of the size checks, and the whole text of every error message.
"""

import re
from types import SimpleNamespace

import numpy as np
import pytest

from hpcfl.data.partition_labels import (
    BiasedUnbiasedOptions,
    LabelKOptions,
    NonBalanceOptions,
    ParetoOptions,
    ShardsOptions,
    _random_slots,
    biased_unbiased,
    label_k,
    nonbalance,
    pareto,
    pareto_class_counts,
    shards,
    split_class_among,
)
from hpcfl.errors import ConfigError

EMPTY_FIX = "a class has fewer samples than clients holding it; use fewer clients (data.num_clients)"
Y10 = np.repeat(np.arange(10), 10)      # 10 classes of 10 samples, sorted
Y4 = np.repeat(np.arange(4), 6)         # 4 classes of 6 samples: class c is 6c .. 6c+5


def lists(parts):
    """Plain int lists of a partition, for exact comparison."""
    return [[int(v) for v in p] for p in parts]


def held(parts, y=Y10):
    """Sorted distinct labels each client received."""
    return [sorted({int(v) for v in y[p]}) for p in parts]


def ds(num_classes):
    """A stand-in dataset object carrying only ``num_classes``."""
    return SimpleNamespace(num_classes=num_classes)


def full(msg):
    """Anchored regex for a whole message."""
    return "^" + re.escape(msg) + "$"


# ---------------------------------------------------------------- split_class_among


def test_split_skips_unheld_class_and_keeps_later_ones():
    """A class nobody holds is skipped (continue, not break): class 1 still goes to client 0."""
    y = np.array([0, 1, 1, 0])
    parts = split_class_among(y, [[], [0]], np.random.default_rng(0), 2, 2)
    assert lists(parts) == [[1, 2], []]


def test_split_leaves_unheld_samples_unused():
    """Samples of an unheld class are marked -1 (unused), not given to client 1."""
    y = np.array([0, 1, 1, 0])
    parts = split_class_among(y, [[0], []], np.random.default_rng(0), 2, 2)
    assert lists(parts) == [[0, 3], []]


# ------------------------------------------------------------------------- label_k


def test_label_k_cyclic_exact_partition():
    """Seed 7 permutes classes to [0, 2, 1]: clients hold {0,2}, {1,0}, {2,1}, 2 samples of each."""
    y = np.array([0, 1, 2] * 4)
    parts = label_k(y, 3, LabelKOptions(2, "cyclic"), 7)
    assert lists(parts) == [[3, 5, 8, 9], [0, 1, 6, 10], [2, 4, 7, 11]]


def test_label_k_random_exact_partition():
    """The random assignment draws its own slots, so seed 7 gives a different partition from cyclic."""
    y = np.array([0, 1, 2] * 4)
    parts = label_k(y, 3, LabelKOptions(2, "random"), 7)
    assert lists(parts) == [[3, 6, 8, 11], [0, 1, 9, 10], [2, 4, 5, 7]]


def test_label_k_all_classes_allowed():
    """classes_per_client equal to the class count is allowed (the check is >, not >=)."""
    y = np.array([0, 1, 2] * 2)
    parts = label_k(y, 2, LabelKOptions(3, "cyclic"), 0)
    assert sorted(v for p in parts for v in lists([p])[0]) == list(range(6))
    assert held(parts, y) == [[0, 1, 2], [0, 1, 2]]


def test_label_k_too_many_classes_message():
    """classes_per_client above the class count names the key, the value and the limit."""
    with pytest.raises(ConfigError, match=full(
            "config error: data.label_k.classes_per_client = 4 exceeds the 3 classes of the dataset; "
            "use at most 3")):
        label_k(np.array([0, 1, 2]), 1, LabelKOptions(4), 0)


def test_label_k_uses_dataset_class_count():
    """The dataset's num_classes (12), not labels.max() + 1, sets the permutation's range."""
    assert held(label_k(Y10, 3, LabelKOptions(2), 4, ds(12))) == [[0, 1], [2, 8], [9]]
    assert held(label_k(Y10, 3, LabelKOptions(2), 4)) == [[0, 1], [2, 7], [8, 9]]


def test_label_k_empty_client_message():
    """Two samples per class among three holders leave client 2 empty: whole message."""
    with pytest.raises(ConfigError, match=full(
            "config error: data.label_k: 1 client(s) received no samples (first: client 2); " + EMPTY_FIX)):
        label_k(np.array([0, 1, 0, 1]), 3, LabelKOptions(2), 0)


# ------------------------------------------------------------------- _random_slots


def test_random_slots_exact_grid():
    """Seed 1, 3 clients x 2 slots over 4 classes: the repaired grid, every row distinct."""
    assert _random_slots(3, 2, 4, np.random.default_rng(1)).tolist() == [[2, 1], [0, 1], [2, 3]]
    assert _random_slots(5, 2, 4, np.random.default_rng(3)).tolist() == [
        [2, 0], [2, 3], [0, 1], [0, 3], [2, 1]]


def test_random_slots_three_per_client_exact():
    """P = 3: a row already distinct is left alone (the repair only touches repeated classes)."""
    grids = [_random_slots(4, 3, 5, np.random.default_rng(s)).tolist() for s in range(3)]
    assert grids == [
        [[3, 4, 2], [4, 0, 1], [0, 3, 1], [4, 2, 3]],
        [[3, 1, 2], [0, 3, 2], [1, 4, 0], [4, 1, 2]],
        [[4, 2, 1], [3, 2, 0], [4, 1, 3], [1, 0, 3]],
    ]


def test_random_slots_extra_classes_distinct():
    """The (K*P) mod C extra slots are distinct classes, so every class appears 1 or 2 times."""
    for seed in range(20):
        grid = _random_slots(3, 2, 4, np.random.default_rng(seed))
        counts = np.bincount(grid.ravel(), minlength=4)
        assert sorted(counts.tolist()) == [1, 1, 2, 2]
        assert all(len(set(r)) == 2 for r in grid.tolist())


class CountingRng:
    """Wraps a Generator and counts ``permutation`` calls."""

    def __init__(self, seed):
        self.rng, self.calls = np.random.default_rng(seed), 0

    def choice(self, *a, **kw):
        return self.rng.choice(*a, **kw)

    def permutation(self, x):
        self.calls += 1
        return self.rng.permutation(x)


def test_random_slots_gives_up_after_100_tries():
    """An impossible grid (2 distinct of 1 class) is tried exactly 100 times (3 draws each), then raises."""
    rng = CountingRng(0)
    with pytest.raises(ConfigError, match=full(
            "config error: data.label_k: could not give 1 clients 2 distinct classes each; "
            "use data.label_k.assignment = 'cyclic'")):
        _random_slots(1, 2, 1, rng)
    assert rng.calls == 300


# -------------------------------------------------------------------------- shards


def test_shards_uneven_sizes_exact():
    """10 samples, 4 shards of 3,3,2,2; seed 5 deals shards [1,0,1,0] to the clients."""
    y = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    assert lists(shards(y, 2, ShardsOptions(2), 5)) == [[3, 4, 5, 8, 9], [0, 1, 2, 6, 7]]
    assert lists(shards(y, 3, ShardsOptions(1), 5)) == [[4, 5, 6], [7, 8, 9], [0, 1, 2, 3]]


def test_shards_one_sample_each_allowed():
    """K*P equal to the sample count is allowed (the check is >, not >=): shards of one sample."""
    y = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 2])
    assert lists(shards(y, 5, ShardsOptions(2), 0)) == [[4, 6], [2, 7], [3, 5], [0, 9], [1, 8]]


def test_shards_sort_is_stable():
    """Shards cut inside a class follow the stable label sort: ascending index runs of 25."""
    y = np.repeat([1, 0], 50)
    parts = lists(shards(y, 4, ShardsOptions(1), 0))
    runs = sorted(parts)
    assert runs == [list(range(25)), list(range(25, 50)), list(range(50, 75)), list(range(75, 100))]


def test_shards_too_many_message():
    """More shards than samples: whole message."""
    with pytest.raises(ConfigError, match=full(
            "config error: data.shards: 3 clients x 2 shards > 5 samples; lower "
            "data.shards.shards_per_client or data.num_clients")):
        shards(np.arange(5), 3, ShardsOptions(2), 0)


# ---------------------------------------------------------------- biased_unbiased


def test_biased_unbiased_default_p_is_one_for_few_classes():
    """C = 4: P = max(1, 4 // 5) = 1, G = 4; biased clients take 4 of their class, client 2 one of each from 4."""
    parts = biased_unbiased(Y4, 3, BiasedUnbiasedOptions(1, None, 1), 0)
    assert lists(parts) == [[0, 1, 2, 3], [6, 7, 8, 9], [4, 10, 16, 22]]


def test_biased_unbiased_given_p():
    """P = 2, G = 2: client 0 classes 0,1, client 1 classes 2,3 (2 each), client 2 from offset 2."""
    parts = biased_unbiased(Y4, 3, BiasedUnbiasedOptions(1, 2, 1), 0)
    assert lists(parts) == [[0, 1, 6, 7], [12, 13, 18, 19], [2, 8, 14, 20]]


def test_biased_unbiased_uses_dataset_class_count():
    """The dataset's 2 classes (not 4) are used: classes 2 and 3 are left out."""
    parts = biased_unbiased(Y4, 3, BiasedUnbiasedOptions(1, None, 1), 0, ds(2))
    assert lists(parts) == [[0, 1], [6, 7], [2, 8]]


def test_biased_unbiased_all_unbiased():
    """num_unbiased == num_clients (no biased client) is allowed: one sample of each class each."""
    parts = biased_unbiased(Y4, 2, BiasedUnbiasedOptions(2, None, 1), 0)
    assert lists(parts) == [[0, 6, 12, 18], [1, 7, 13, 19]]


def test_biased_unbiased_exact_fit():
    """A client needing exactly a class's 6 samples (offset 0, 2 x 3) is allowed."""
    parts = biased_unbiased(Y4, 2, BiasedUnbiasedOptions(0, 2, 3), 0)
    assert lists(parts) == [list(range(12)), list(range(12, 24))]


@pytest.mark.parametrize("k, opts, msg", [
    (3, BiasedUnbiasedOptions(1, 5, 1),
     "data.biased_unbiased.classes_per_client = 5 exceeds the 4 classes of the dataset; use at most 4"),
    (3, BiasedUnbiasedOptions(1, 3, 1), "data.biased_unbiased.classes_per_client = 3 must divide the 4 classes"),
    (3, BiasedUnbiasedOptions(4, None, 1), "data.biased_unbiased.num_unbiased = 4 exceeds data.num_clients = 3"),
    (7, BiasedUnbiasedOptions(1), ("data.biased_unbiased: 24 samples, 4 classes and 7 clients leave "
                                  "shards of 0 samples; use fewer clients")),
    (3, BiasedUnbiasedOptions(1, None, 2), ("data.biased_unbiased: class 0 has 6 samples, "
                                           "client 0 needs up to index 8; use fewer clients")),
])
def test_biased_unbiased_messages(k, opts, msg):
    """Each refusal of biased_unbiased, whole message."""
    with pytest.raises(ConfigError, match=full("config error: " + msg)):
        biased_unbiased(Y4, k, opts, 0)


# --------------------------------------------------------------------- nonbalance


@pytest.mark.parametrize("cf, kf, expected", [
    ((0.1, 0.4, 0.5), (1.0, 0.5, 0.2), []),
    ((0.1, 0.4), (1.0, 0.5, 0.2), ["client_fractions needs 3 values (abundant, medium, less) summing to 1"]),
    ((0.5, 0.5, 0.5), (1.0, 0.5, 0.2), ["client_fractions needs 3 values (abundant, medium, less) summing to 1"]),
    ((0.1, 0.4, 0.6), (1.0, 0.5, 0.2), ["client_fractions needs 3 values (abundant, medium, less) summing to 1"]),
    ((0.1, 0.4, 0.5), (1.0, 0.5), ["class_fractions needs 3 values (abundant, medium, less)"]),
])
def test_nonbalance_validate(cf, kf, expected):
    """validate(): 3 client fractions summing to 1 (sum 1.5 and 1.1 fail), 3 class fractions."""
    assert NonBalanceOptions(cf, kf).validate() == expected


def test_nonbalance_caps_medium_count():
    """round(1.5) + round(1.5) = 4 > 3 clients: medium count capped to 1, counts [4, 4, 2]."""
    y = np.repeat(np.arange(4), 3)
    parts = nonbalance(y, 3, NonBalanceOptions((0.5, 0.5, 0.0)), 1)
    assert lists(parts) == [[1, 3, 4, 6, 7, 10], [2, 5, 8, 9], [0, 11]]


def test_nonbalance_uses_dataset_class_count():
    """With the dataset's 5 classes the abundant client draws from 5 (class 4 has no samples)."""
    y = np.repeat(np.arange(4), 3)
    parts = nonbalance(y, 2, NonBalanceOptions((0.5, 0.5, 0.0)), 1, ds(5))
    assert lists(parts) == [[0, 2, 3, 4, 6, 7, 8, 9, 10, 11], [1, 5]]


def test_nonbalance_one_class_minimum():
    """class fraction 0.1 of 10 classes gives one class (the floor is max(1, .), not 2)."""
    parts = nonbalance(Y10, 10, NonBalanceOptions((0.1, 0.4, 0.5), (1.0, 0.5, 0.1)), 0)
    assert [len(h) for h in held(parts)] == [10, 5, 5, 5, 5, 1, 1, 1, 1, 1]


def test_nonbalance_empty_client_message():
    """One sample per class among 3 clients: seed 0 leaves client 2 empty; whole message."""
    with pytest.raises(ConfigError, match=full(
            "config error: data.nonbalance: 1 client(s) received no samples (first: client 2); " + EMPTY_FIX)):
        nonbalance(np.arange(4), 3, NonBalanceOptions(), 0)


# ------------------------------------------------------------------------- pareto


def test_pareto_class_counts_ceil_vs_round():
    """Seed 0, 5 clients, 10 classes: ceil gives [8,10,5,5,7], round (half to even) [7,10,4,4,7]."""
    assert pareto_class_counts(5, 10, 1.16, "ceil", np.random.default_rng(0)) == [8, 10, 5, 5, 7]
    assert pareto_class_counts(5, 10, 1.16, "round", np.random.default_rng(0)) == [7, 10, 4, 4, 7]


def test_pareto_rounding_option_reaches_counts():
    """pareto passes its rounding option on: ceil and round give different class sets for seed 0."""
    assert [len(h) for h in held(pareto(Y10, 5, ParetoOptions(1.16, "ceil"), 0))] == [8, 10, 5, 5, 7]
    assert [len(h) for h in held(pareto(Y10, 5, ParetoOptions(1.16, "round"), 0))] == [7, 10, 4, 4, 7]


def test_pareto_uses_dataset_class_count():
    """The dataset's 12 classes change the draws (classes 10, 11 have no samples)."""
    assert held(pareto(Y10, 3, ParetoOptions(), 0, ds(12))) == [
        [0, 1, 4, 5, 6, 7, 8, 9], list(range(10)), [2, 4, 5, 6, 7]]
    assert held(pareto(Y10, 3, ParetoOptions(), 0)) == [
        [0, 1, 4, 5, 7, 8, 9], list(range(10)), [2, 3, 4, 8]]


def test_pareto_empty_client_message():
    """One sample per class among 4 clients: seed 1 leaves client 3 empty; whole message."""
    with pytest.raises(ConfigError, match=full(
            "config error: data.pareto: 1 client(s) received no samples (first: client 3); " + EMPTY_FIX)):
        pareto(np.arange(4), 4, ParetoOptions(), 1)
